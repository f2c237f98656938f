"""GPU discovery: nvidia-smi parsing, CUDA_VISIBLE_DEVICES filtering, no-driver machines.

This machine has no GPU: a fake nvidia-smi (tests/gpu_fakes.py) stands in for the driver.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ConfigError
from tensorrtllm_backend.gpus import GPU, describe, filter_visible, parse_nvidia_smi, visible_gpus
from tests.gpu_fakes import A100, H100, fake_nvidia_smi, gpus, path_with


def test_parse_nvidia_smi() -> None:
    out = "0, GPU-1111, NVIDIA H100 80GB HBM3, 9.0\n1, GPU-2222, NVIDIA A100-SXM4-80GB, 8.0\n\n"
    parsed = parse_nvidia_smi(out)
    assert parsed == [
        GPU(0, "GPU-1111", "NVIDIA H100 80GB HBM3", "9.0"),
        GPU(1, "GPU-2222", "NVIDIA A100-SXM4-80GB", "8.0"),
    ]
    assert parsed[0].capability == (9, 0) and parsed[1].capability == (8, 0)


@pytest.mark.parametrize("line", ["0, GPU-1, H100", "x, GPU-1, H100, 9.0", "0, GPU-1, H100, nine"])
def test_parse_nvidia_smi_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(ConfigError, match="unexpected nvidia-smi output line"):
        parse_nvidia_smi(line + "\n")


def test_cuda_visible_devices() -> None:
    four = gpus(4)
    assert filter_visible(four, None) == four
    assert filter_visible(four, "") == []
    assert [g.index for g in filter_visible(four, "2,0")] == [2, 0]
    assert [g.index for g in filter_visible(four, "1,7,2")] == [1]  # stops at the first invalid entry
    assert [g.index for g in filter_visible(four, "GPU-00000003")] == [3]  # unique UUID prefix
    assert filter_visible(four, "GPU-0000") == []  # ambiguous prefix
    assert [g.index for g in filter_visible(four, "0,0,1")] == [0]  # duplicates end the list


def test_no_nvidia_smi_means_no_gpu(tmp_path: Path) -> None:
    assert visible_gpus({"PATH": str(tmp_path)}) == []


def test_visible_gpus_runs_nvidia_smi(tmp_path: Path) -> None:
    rows = gpus(2, A100) + [GPU(2, "GPU-00000002-aaaa", H100[0], H100[1])]
    folder = fake_nvidia_smi(tmp_path / "bin", rows)
    assert visible_gpus({"PATH": path_with(folder)}) == rows
    assert [g.index for g in visible_gpus({"PATH": path_with(folder), "CUDA_VISIBLE_DEVICES": "2"})] == [2]


def test_no_devices_found_is_no_gpu(tmp_path: Path) -> None:
    folder = fake_nvidia_smi(tmp_path / "bin", [], exit_code=6, stderr="No devices were found")
    assert visible_gpus({"PATH": path_with(folder)}) == []


def test_driver_failure_is_reported(tmp_path: Path) -> None:
    folder = fake_nvidia_smi(tmp_path / "bin", [], exit_code=9, stderr="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    with pytest.raises(ConfigError, match="nvidia-smi exited with 9: NVIDIA-SMI has failed"):
        visible_gpus({"PATH": path_with(folder)})


def test_describe() -> None:
    assert describe([]) == "no GPU"
    assert describe(gpus(1)) == "1 GPU (0: NVIDIA H100 80GB HBM3, compute capability 9.0)"
    assert describe(gpus(2, A100)).startswith("2 GPUs (0: NVIDIA A100-SXM4-80GB, compute capability 8.0; 1: ")
