"""The committed Cog schema (cog_triton/openapi_schema.json) is exactly what `cog build` would bundle.

`cog build` makes the schema statically from predict.py's and train.py's source with Cog's own
generator; ``../shared/tools/cog-schemagen`` is that generator compiled from replicate/cog
(pkg/schema). Facts checked here, each of which broke the README's flow before:

* ``x: int = Input(default=None)`` is emitted as *required* (pkg/schema/openapi_spec.go; upstream
  asserts it in integration-tests/tests/static_schema_secret_optional.txtar), so coglet answers
  every request without it with 422: inputs whose default is None must be ``Optional[...]``.
* descriptions are the raw source between the outer quotes (pkg/schema/python/literals.go,
  parseStringLiteral): implicitly concatenated literals come out garbled, escapes undecoded.
* ``ge=``/``le=`` with a named constant are dropped silently: bounds must be literals.
* ``x-cog-streaming`` (which coglet needs for SSE) comes only from the ``@cog.streaming`` decorator.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cog_triton.schema import SCHEMA_PATH, parse_input_specs
from cog_triton.worker.schema import COGLET_SCHEMA_NAME, install_for_coglet
from cog_triton.settings import REPO_ROOT

SCHEMA = json.loads(SCHEMA_PATH.read_text())


def schemagen() -> Path:
    """Cog's static schema generator: $COG_SCHEMAGEN, ../shared/tools/cog-schemagen, or on PATH."""
    for candidate in (os.environ.get("COG_SCHEMAGEN"), REPO_ROOT.parent / "shared" / "tools" / "cog-schemagen",
                      shutil.which("cog-schemagen")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    pytest.skip("cog-schemagen (Cog's static schema generator) is not here: ../shared/tools/cog-schemagen is "
                "a development tool; set COG_SCHEMAGEN to run this check")


def generate(tool: Path, root: Path = REPO_ROOT) -> dict[str, Any]:
    result = subprocess.run(
        [str(tool), ".", "predict.py:Predictor", "train.py:train"], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_committed_schema_is_what_cog_build_generates() -> None:
    generated = generate(schemagen())
    assert generated == SCHEMA, (
        "cog_triton/openapi_schema.json is stale: regenerate it with "
        "../shared/tools/cog-schemagen . predict.py:Predictor train.py:train > cog_triton/openapi_schema.json"
    )


def test_the_generator_check_is_live(tmp_path: Path) -> None:
    """The tool does see a changed bound, and reproduces the defect the schema had (seed required)."""
    tool = schemagen()
    for name in ("predict.py", "train.py"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    source = (tmp_path / "predict.py").read_text()
    source = source.replace("default=0.7, ge=0, le=5", "default=0.7, ge=0, le=4")
    source = source.replace("seed: Optional[int] = Input(", "seed: int = Input(")
    (tmp_path / "predict.py").write_text(source)
    changed = generate(tool, tmp_path)
    assert changed["components"]["schemas"]["Input"]["properties"]["temperature"]["maximum"] == 4
    assert "seed" in changed["components"]["schemas"]["Input"]["required"]


def test_no_input_is_required_and_predictions_stream() -> None:
    """prompt and messages are alternatives (predict() requires exactly one), so both have the empty
    default and no input is required; the structured-output inputs are documented and default to off."""
    inputs = SCHEMA["components"]["schemas"]["Input"]
    assert inputs.get("required", []) == []
    props = inputs["properties"]
    for name in ("prompt", "messages", "json_schema", "regex", "grammar"):
        assert props[name]["type"] == "string" and props[name]["default"] == "", name
        assert props[name]["description"], name
    assert "JSON array" in props["messages"]["description"] and "not both" in props["messages"]["description"]
    assert props["response_format"]["default"] == "text"
    assert SCHEMA["components"]["schemas"]["response_format"]["enum"] == ["text", "json_object"]
    assert SCHEMA["paths"]["/predictions"]["post"]["x-cog-streaming"] is True
    output = SCHEMA["components"]["schemas"]["Output"]
    assert output["x-cog-array-type"] == "iterator" and output["x-cog-array-display"] == "concatenate"
    assert SCHEMA["components"]["schemas"]["TrainingInput"]["required"] == ["config"]


def _entry_points() -> list[tuple[str, inspect.Signature]]:
    import predict
    import train

    return [
        ("Input", inspect.signature(predict.Predictor.run)),
        ("TrainingInput", inspect.signature(train.train)),
    ]


@pytest.mark.parametrize("component", ["Input", "TrainingInput"])
def test_descriptions_are_not_garbled(component: str) -> None:
    """Every description in the schema is the text Python sees, character for character."""
    signature = dict(_entry_points())[component]
    props = SCHEMA["components"]["schemas"][component]["properties"]
    for name, param in signature.parameters.items():
        if name == "self":
            continue
        assert props[name]["description"] == param.default.description, name


@pytest.mark.parametrize("component", ["Input", "TrainingInput"])
def test_inputs_with_a_none_default_are_optional(component: str) -> None:
    signature = dict(_entry_points())[component]
    specs = parse_input_specs(SCHEMA, component)
    for name, param in signature.parameters.items():
        if name != "self" and param.default.default is None and name not in ("prompt", "config"):
            assert specs[name].nullable and not specs[name].required, name


def test_schema_carries_predict_py_literals() -> None:
    """Without the tool too: every default and bound in predict.py is in the committed schema."""
    signature = dict(_entry_points())["Input"]
    specs = parse_input_specs(SCHEMA, "Input")
    assert list(specs) == [n for n in signature.parameters if n != "self"]  # declaration order
    for name, param in signature.parameters.items():
        if name == "self":
            continue
        field = param.default
        spec = specs[name]
        assert (spec.minimum, spec.maximum, spec.max_length) == (field.ge, field.le, field.max_length), name
        if not spec.required:
            assert spec.default == field.default, name


def test_install_for_coglet_puts_the_schema_where_coglet_reads_it(tmp_path: Path) -> None:
    target = install_for_coglet(tmp_path)
    assert target == tmp_path / COGLET_SCHEMA_NAME == tmp_path / ".cog" / "openapi_schema.json"
    assert target.read_bytes() == SCHEMA_PATH.read_bytes()
    target.write_text("{}")
    install_for_coglet(tmp_path)  # a stale copy is replaced
    assert target.read_bytes() == SCHEMA_PATH.read_bytes()
    assert [p.name for p in target.parent.iterdir()] == ["openapi_schema.json"]  # no temporary files left


def test_cog_reads_the_concurrency_from_the_decorator() -> None:
    """Cog 0.23 takes a predictor's concurrency from ``@cog.concurrent(max=...)`` on an async
    predict (replicate/cog pkg/schema/python: the generator reports it with the schema; cog.yaml's
    ``concurrency:`` is the deprecated form). It must equal the Dockerfile's COG_MAX_CONCURRENCY and
    the settings default, which tests/test_packaging.py checks against the source."""
    from cog_triton.settings import DEFAULT_CONCURRENCY

    result = subprocess.run([str(schemagen()), ".", "predict.py:Predictor", "train.py:train"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith("metadata(predict.py:Predictor)"))
    assert "IsAsync=true" in line, line
    assert f"ConcurrencyMax={DEFAULT_CONCURRENCY}" in line, line

