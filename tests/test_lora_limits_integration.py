"""What one adapter may cost, end to end (issue 47): the real Cog HTTP server running predict.py, its one stream
process and a real Triton with the CPU reference model, serving the default archive (SmolLM2-135M, LoRA with
max_lora_rank 64 on all seven modules: the largest adapter it serves is 78,151,680 bytes of float32 weights).
Adapters come from a local HTTP server. Nothing is mocked.

Memory is the stream process's peak resident set (``VmHWM`` in /proc/<pid>/status) over its baseline, both read in
the same test: writing 5 to /proc/<pid>/clear_refs resets the peak to what the process holds at that moment
(Documentation/filesystems/proc.rst, "clear_refs"), which is then the baseline.

Two stacks, one per class (each torn down before the next starts):

* **limits** (the defaults: at most 1000 members an archive): the issue's 0.26 MB download that unpacks to a
  256 MiB safetensors file, refused before it is unpacked; the largest adapter the model serves, read and converted
  whole (a NaN in its last value, so it is refused after conversion, before anything is sent to Triton), within 3x
  its size; the issue's archive of 100,000 empty files refused before anything is written; hostile
  adapter_config.json values, each an adapter error counted under invalid_lora_adapter and none under internal.
  After each refusal, the adapter cache holds what it held before.
* **deadline** (COG_TRITON_ADAPTER_MAX_MEMBERS=200000, a 3-s deadline): the archive of 100,000 empty files is then
  counted and unpacked, and its unpacking ends at the deadline.
"""

from __future__ import annotations

import contextlib
import io
import json
import struct
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cog_triton.dev.local import WeightsHTTPServer
from tests.lora_adapters import make_adapter, pack
from tests.proc import descendants_of, pids_mentioning
from tests.stacks import cog_stack

pytestmark = pytest.mark.integration

PROMPT = "What is machine learning?"
RANK = 64
#: The adapter deadline of the deadline stack (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S), seconds.
DEADLINE_S = 3
MODULES = {  # Hugging Face name: (block, in, out) at SmolLM2-135M's sizes (hidden 576, MLP 1536, 3 KV heads of 64)
    "q_proj": ("self_attn", 576, 576), "k_proj": ("self_attn", 576, 192), "v_proj": ("self_attn", 576, 192),
    "o_proj": ("self_attn", 576, 576), "gate_proj": ("mlp", 576, 1536), "up_proj": ("mlp", 576, 1536),
    "down_proj": ("mlp", 1536, 576),
}
LAYERS = 30
#: The largest adapter the default model serves: rank 64 on every module of every layer, float32 (createLoraModules'
#: sizes, cpp/tensorrt_llm/runtime/loraModule.cpp; the issue's 78 MB).
SERVABLE_BYTES = 4 * RANK * sum(i + o for _, i, o in MODULES.values()) * LAYERS
CONFIG = {"peft_type": "LORA", "r": RANK, "lora_alpha": 16, "target_modules": list(MODULES)}


def _tar_gz(path: Path, files: dict[str, Any]) -> Path:
    """A .tar.gz of ``files`` (bytes, or the Path of a file to add under that name)."""
    with tarfile.open(path, "w:gz", compresslevel=6) as tar:
        for name, data in files.items():
            if isinstance(data, Path):
                tar.add(str(data), name)
            else:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _largest_adapter(path: Path) -> Path:
    """The largest adapter the model serves as PEFT writes it (zeros), with NaN as the very last value: lora_B of
    up_proj in layer 29, the last row the converter writes (rows by layer, then module id; up_proj is mlp_gate, 7)."""
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for layer in range(LAYERS):
        for name, (block, in_dim, out_dim) in MODULES.items():
            prefix = f"base_model.model.model.layers.{layer}.{block}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.zeros(RANK, in_dim)
            tensors[f"{prefix}.lora_B.weight"] = torch.zeros(out_dim, RANK)
    tensors[f"base_model.model.model.layers.{LAYERS - 1}.mlp.up_proj.lora_B.weight"][-1, -1] = float("nan")
    save_file(tensors, str(path))
    assert sum(t.numel() for t in tensors.values()) * 4 == SERVABLE_BYTES
    return path


def _hostile_safetensors(path: Path) -> Path:
    """The issue's file: a header naming one 256 MiB tensor, and the zeros (a sparse file here; 0.26 MB gzipped)."""
    values = (256 << 20) // 4 // 576 * 576
    header = json.dumps({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": {
        "dtype": "F32", "shape": [values // 576, 576], "data_offsets": [0, values * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + values * 4)
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, checkpoint_dir: Path) -> dict[str, Any]:
    """The archives the tests fetch, served from one folder, and a small real adapter for warming up."""
    work = tmp_path_factory.mktemp("lora_limits")
    served = work / "served"
    served.mkdir()
    config = json.dumps(CONFIG).encode()
    small = make_adapter(checkpoint_dir, work / "made" / "small", r=4, alpha=8, targets=["q_proj"], seed=3)
    pack(small, served / "small.tar.gz")
    pack(small, served / "small-again.tar.gz")
    weights = (small / "adapter_model.safetensors").read_bytes()
    _tar_gz(served / "hostile.tar.gz", {"adapter_config.json": config,
                                        "adapter_model.safetensors": _hostile_safetensors(work / "hostile.st")})
    _tar_gz(served / "largest.tar.gz", {"adapter_config.json": config,
                                        "adapter_model.safetensors": _largest_adapter(work / "largest.st")})
    with tarfile.open(served / "many.tar.gz", "w:gz") as tar:  # the 100,000 empty files
        for i in range(100_000):
            tar.addfile(tarfile.TarInfo(f"f{i}"))
    configs = {}
    for name, text in HOSTILE_CONFIGS.items():
        _tar_gz(served / f"config-{name}.tar.gz", {"adapter_config.json": text, "adapter_model.safetensors": weights})
        configs[name] = f"config-{name}.tar.gz"
    return {"work": work, "served": served, "configs": configs}


def _stream_pid(stack: dict[str, Any]) -> int:
    cog = stack["cog"]
    [pid] = sorted(set(pids_mentioning("cog_triton.streaming.streamer")) & descendants_of(cog.proc.pid))
    return pid


def _memory(pid: int) -> dict[str, int]:
    """VmHWM (the peak) and VmRSS of ``pid``, bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _peak_over_baseline(pid: int, action: Callable[[], Any]) -> tuple[Any, int]:
    """``action()``'s result and the bytes the process's peak resident set rose above what it held before."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak is now what the process holds: the baseline
    baseline = _memory(pid)["VmHWM"]
    result = action()
    return result, _memory(pid)["VmHWM"] - baseline


def _cache(stack: dict[str, Any]) -> list[str]:
    folder = stack["cache"] / "adapters"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _refusal(doc: dict[str, Any]) -> str:
    assert doc["status"] == "failed" and doc.get("output") in (None, []), doc
    assert "[invalid_lora_adapter]" in doc["error"], doc["error"]
    return doc["error"]



#: adapter_config.json values the issue found counted as internal errors or accepted (NaN, 1e308), each with the
#: field its refusal names.
HOSTILE_CONFIGS = {
    "nested": b"[" * 100_000 + b"]" * 100_000,
    "alpha-text": json.dumps({**CONFIG, "lora_alpha": "16"}).encode(),
    "alpha-object": json.dumps({**CONFIG, "lora_alpha": {"value": 16}}).encode(),
    "alpha-400-digits": json.dumps(CONFIG)[:-1].encode() + b', "lora_alpha": ' + b"9" * 400 + b"}",
    "alpha-nan": json.dumps(CONFIG)[:-1].encode() + b', "lora_alpha": NaN}',
    "alpha-1e308": json.dumps({**CONFIG, "lora_alpha": 1e308}).encode(),
    "alpha-1e999": json.dumps(CONFIG)[:-1].encode() + b', "lora_alpha": 1e999}',
    "rslora-text": json.dumps({**CONFIG, "use_rslora": "no"}).encode(),
}
NAMED = {"nested": "nests deeper than the 16 levels allowed", "alpha-text": "lora_alpha must be a finite number",
         "alpha-object": "lora_alpha must be a finite number", "alpha-400-digits": "holds an integer of 400 digits",
         "alpha-nan": "holds NaN", "alpha-1e308": "lora_alpha must be a finite number above 0 and at most 65536, got "
         "1e+308", "alpha-1e999": "holds the number '1e999', beyond the range", "rslora-text": "use_rslora must be "
         "true or false, got 'no'"}


def _samples(stack: dict[str, Any]) -> dict[tuple[str, tuple], float]:
    response = httpx.get(f"http://127.0.0.1:{stack['env']['COG_TRITON_PROMETHEUS_PORT']}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def _errors(samples: dict[tuple[str, tuple], float], code: str) -> float:
    return samples.get(("cog_triton_prediction_errors_total", (("code", code),)), 0.0)


@contextlib.contextmanager
def _stack(tmp_path_factory: pytest.TempPathFactory, archive: Path, made: dict[str, Any], name: str,
           **settings: str) -> Iterator[dict[str, Any]]:
    cache = made["work"] / f"{name}_cache"
    with WeightsHTTPServer(made["served"]) as adapters, cog_stack(
        tmp_path_factory, archive, name, slots=2, COG_TRITON_STREAM_PROCESSES="1",
        COG_TRITON_ADAPTER_CACHE_DIR=str(cache), COG_TRITON_DOWNLOAD_RETRIES="0",
        COG_TRITON_REFERENCE_MAX_INPUT_LEN="256", COG_TRITON_REFERENCE_MAX_SEQ_LEN="512",
        COG_TRITON_STOP_TIMEOUT_S="5",
        # the adapters come from 127.0.0.1 over http://, which the fetch rules refuse by default
        COG_TRITON_FETCH_ALLOW_PRIVATE="true", COG_TRITON_FETCH_ALLOW_HTTP="true", **settings,
    ) as stack:
        stack.update(adapters=adapters, cache=cache)
        # the stream process has converted and served an adapter before any test measures it
        assert _predict(stack, "small.tar.gz")["status"] == "succeeded"
        yield stack


def _predict(stack: dict[str, Any], lora: str = "", **extra: Any) -> dict[str, Any]:
    inputs = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, **extra}
    if lora:
        inputs["lora_weights"] = f"{stack['adapters'].url}/{lora}"
    return stack["cog"].predict(inputs)


class TestLimits:
    @pytest.fixture(scope="class")
    @classmethod
    def stack(cls, tmp_path_factory: pytest.TempPathFactory, default_archive: Path,
              made: dict[str, Any]) -> Iterator[dict[str, Any]]:
        with _stack(tmp_path_factory, default_archive, made, "limits") as stack:
            yield stack

    def test_a_small_download_that_unpacks_large_is_refused_before_it_is_unpacked(self, stack) -> None:
        """0.26 MB that unpacks to a 256 MiB safetensors file (it added about 700 MB to a live stream process):
        refused from its members' declared sizes, over the largest adapter the model serves, nothing written; the
        process's peak rises by far less than 3x that adapter."""
        assert (Path(stack["cache"]).parent / "served" / "hostile.tar.gz").stat().st_size < 300_000
        before = _cache(stack)
        doc, peak = _peak_over_baseline(_stream_pid(stack), lambda: _predict(stack, "hostile.tar.gz"))
        error = _refusal(doc)
        assert "unpacks to more than allowed: its members declare 268" in error and "nothing was written" in error
        assert ("(the largest adapter this model serves, rank 64 on q_proj, k_proj, v_proj, o_proj, gate_proj, "
                "up_proj, down_proj of 30 layers: ") in error
        assert "(COG_TRITON_ADAPTER_EXTRA_BYTES)" in error
        assert peak <= 3 * SERVABLE_BYTES, peak
        assert _cache(stack) == before

    def test_the_largest_adapter_served_costs_at_most_three_times_its_size(self, stack) -> None:
        """78 MB of float32 weights (zeros: 80 KB gzipped) unpacked, hashed, read and converted whole: the NaN
        in its very last value refuses it only after the last row was converted, before anything goes to Triton.
        The stream process's peak over its baseline stays within 3x the adapter (it was 8x for a served one: the
        file read whole, safetensors.torch.load's copy, the rows and their padded copies); the refused adapter is
        not left in the cache."""
        before = _cache(stack)
        doc, peak = _peak_over_baseline(_stream_pid(stack), lambda: _predict(stack, "largest.tar.gz"))
        error = _refusal(doc)
        assert f"layer {LAYERS - 1} up_proj holds values that are not finite in float32" in error
        assert peak <= 3 * SERVABLE_BYTES, (peak, SERVABLE_BYTES)
        assert _cache(stack) == before

    def test_an_archive_of_many_small_members_is_refused_before_anything_is_written(self, stack) -> None:
        """The issue's 0.6 MB tar.gz of 100,000 empty files (8.8-29 s to unpack against a 3-s deadline, then left in
        the cache for every later eviction to walk): refused at its 1001st member, nothing written, nothing kept;
        a later fetch is served."""
        before = _cache(stack)
        error = _refusal(_predict(stack, "many.tar.gz"))
        assert error.endswith("has more than the 1000 members allowed (COG_TRITON_ADAPTER_MAX_MEMBERS); refusing to "
                              "unpack it (nothing was written)"), error
        assert _cache(stack) == before
        assert _predict(stack, "small-again.tar.gz")["status"] == "succeeded"

    def test_hostile_adapter_configs_are_adapter_errors_never_internal(self, stack, made) -> None:
        """Each value the issue found (a nested document, lora_alpha as text, an object, 400 digits, NaN, 1e308) and
        two more: each prediction fails with the adapter's error naming the field, counted under
        invalid_lora_adapter and never under internal; none is cached; the server keeps serving."""
        before, cached = _samples(stack), _cache(stack)
        for name, archive in made["configs"].items():
            error = _refusal(_predict(stack, archive))
            assert "adapter_config.json" in error and NAMED[name] in error, (name, error)
        after = _samples(stack)
        counted = _errors(after, "invalid_lora_adapter") - _errors(before, "invalid_lora_adapter")
        assert counted == len(HOSTILE_CONFIGS)
        assert _errors(after, "internal") == _errors(before, "internal")
        assert _cache(stack) == cached
        assert _predict(stack)["status"] == "succeeded"


class TestUnpackDeadline:
    @pytest.fixture(scope="class")
    @classmethod
    def stack(cls, tmp_path_factory: pytest.TempPathFactory, default_archive: Path,
              made: dict[str, Any]) -> Iterator[dict[str, Any]]:
        with _stack(tmp_path_factory, default_archive, made, "unpack_deadline",
                    COG_TRITON_ADAPTER_MAX_MEMBERS="200000",
                    COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S=str(DEADLINE_S)) as stack:
            yield stack

    def test_unpacking_ends_at_the_deadline(self, stack) -> None:
        """With the member limit raised above them, the 100,000 empty files are counted and unpacked until the
        deadline passes (it took 11.3 s against a 6-s deadline through a live server): the prediction fails with the
        deadline's words within half a deadline of a fresh adapter's prediction (a baseline taken here) plus the
        deadline, and the half-unpacked folder is not left in the cache."""
        started = time.monotonic()
        assert _predict(stack, "small-again.tar.gz")["status"] == "succeeded"
        baseline = time.monotonic() - started
        before = _cache(stack)
        started = time.monotonic()
        error = _refusal(_predict(stack, "many.tar.gz"))
        took = time.monotonic() - started
        url = f"{stack['adapters'].url}/many.tar.gz"
        assert error.endswith(f"lora_weights {url} could not be fetched: the download of {url} did not finish within "
                              f"the deadline of {DEADLINE_S} s (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S): it passed "
                              "while the archive was being unpacked"), error
        assert took < baseline + DEADLINE_S * 1.5, (took, baseline)
        assert _cache(stack) == before
