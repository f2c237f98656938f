"""Unit tests of the Triton glue both Python ``tensorrt_llm`` models share
(triton_model_repo/tensorrt_llm_reference/1/triton_glue.py, copied into tensorrt_llm_pytorch's version folder when the
repository is rendered).

What it does with requests and responses is tested through the models, in a real Triton
(tests/test_conformance.py, both models) and outside it (tests/test_pytorch_model.py); here, what no request
shows: reading model parameters and logging. The recording pb_utils
(tests/fake_pb_utils.py) stands in for Triton's where a Logger is needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import fake_pb_utils
from tests.fake_pb_utils import FakeRequest
from tests.modules import load_file

REPO_ROOT = Path(__file__).resolve().parents[1]
GLUE = REPO_ROOT / "triton_model_repo" / "tensorrt_llm_reference" / "1" / "triton_glue.py"
glue = load_file("triton_glue_under_test", GLUE)


def test_the_model_repository_holds_no_links() -> None:
    """Shared model code is kept once and copied when the repository is rendered (tests/test_pytorch_render.py), so a
    checkout without symlinks, or ``triton_model_repo`` copied alone, has every file."""
    assert [p for p in (REPO_ROOT / "triton_model_repo").rglob("*") if p.is_symlink()] == []


def _params(**values: str) -> dict:
    return {key: {"string_value": value} for key, value in values.items()}


def test_an_absent_empty_or_unfilled_parameter_is_its_default() -> None:
    params = {**_params(empty=" ", unfilled="${max_seq_len}", given=" 12 "), "odd": "not a dict"}
    for key in ("missing", "empty", "unfilled", "odd"):
        assert glue.param(params, key, 7, int) == 7
    assert glue.param(params, "given", 7, int) == 12


@pytest.mark.parametrize(("raw", "value"), [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("y", True),
                                            ("t", True), ("false", False), ("0", False), ("No", False), ("n", False),
                                            ("f", False)])
def test_a_boolean_parameter_takes_these_words(raw: str, value: bool) -> None:
    assert glue.param(_params(flag=raw), "flag", None, bool) is value


def test_a_parameter_that_does_not_convert_is_named_with_its_value() -> None:
    with pytest.raises(ValueError, match=r"^parameter flag must be true or false, got 'maybe'$"):
        glue.param(_params(flag="maybe"), "flag", None, bool)
    with pytest.raises(ValueError, match=r"^parameter max_seq_len must be int, got '1.5'$"):
        glue.param(_params(max_seq_len="1.5"), "max_seq_len", None, int)
    assert glue.param(_params(period="1.5"), "period", None, float) == 1.5


def test_a_requests_inputs_are_read_once_and_got_by_name() -> None:
    """The stub's ``get_input_tensor_by_name`` reads all of a request's inputs at each call; the models read them
    once per request and look names up in what they read."""
    request = FakeRequest(input_ids=[5, 6], stop=[False])
    get = glue.input_arrays(request)
    assert get("input_ids").tolist() == [[5, 6]] and get("stop").tolist() == [[False]]
    assert get("request_output_len") is None and get("input_ids").tolist() == [[5, 6]]
    assert request.inputs_calls == 1


def test_the_client_must_ask_for_output_ids_and_sequence_length() -> None:
    assert glue.missing_output_error(FakeRequest(requested=None)) is None  # none named: Triton sends all
    assert glue.missing_output_error(FakeRequest(requested=["sequence_length", "output_ids", "cum_log_probs"])) is None
    assert glue.missing_output_error(FakeRequest(requested=["sequence_length"])) == (
        "Error encountered while populating response: output_ids tensor must be present in list of output tensors")
    assert glue.missing_output_error(FakeRequest(requested=["output_ids"])) == (
        "Error encountered while populating response: sequence_length tensor must be present in list of output "
        "tensors")


def test_log_lines_go_to_tritons_logger_or_are_printed(monkeypatch, capsys) -> None:
    monkeypatch.setattr(glue, "pb_utils", fake_pb_utils)
    monkeypatch.setattr(fake_pb_utils.Logger, "lines", [])
    glue.log("model x", "warn", "careful")
    glue.log("model x", "error", "broken")
    glue.log("model x", "debug", "other words log as info")
    assert fake_pb_utils.Logger.lines == [("warn", "[model x] careful"), ("error", "[model x] broken"),
                                          ("info", "[model x] other words log as info")]
    monkeypatch.setattr(glue, "pb_utils", None)  # outside Triton
    glue.log("model x", "warn", "printed")
    assert capsys.readouterr().out == "[model x] warn: printed\n"
