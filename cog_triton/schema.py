"""The predictor's Cog input schema: the one source of every input's type, default and bounds (shared by the Cog
worker, which validates against it, and the stream processes, which get :class:`cog_triton.ipc.PredictInputs`, the
validated inputs, whose fields are made from it).

``cog build`` does not import ``predict.py``: it parses its source with Cog's static schema
generator (replicate/cog ``pkg/schema``) and bundles the result as ``.cog/openapi_schema.json``,
which coglet reads at run time (``crates/coglet/src/worker.rs``, ``BUNDLED_SCHEMA_PATH``, relative
to the working directory) to validate inputs (HTTP 422) and to allow SSE streaming. The generator
emits ``minimum``/``maximum`` only for literal ``ge=``/``le=`` values (a named constant is dropped
silently), so the bounds are written as literals in ``predict.py``; the generated schema is
committed at :data:`SCHEMA_PATH` (``tests/test_schema.py`` regenerates it with the tool and fails on
any difference), :mod:`cog_triton.worker.inputs` validates against this same file, and
:class:`cog_triton.ipc.PredictInputs` has one field per input it declares. A bound therefore exists once, in
``predict.py``, and coglet and our own validation apply the same value; an input exists once too.

The committed copy is not kept in ``.cog/``: ``cog build`` excludes ``.cog/`` from the Docker build
context (replicate/cog ``pkg/image/build.go``, ``defaultExcludePatterns``) and writes its own files
there. The Dockerfile copies it to ``/src/.cog/`` (``cog build`` then adds the identical file), and
local runs put it in place with :func:`cog_triton.worker.schema.install_for_coglet`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional, Union

from common.errors import ConfigError

#: The committed schema, as ``cog-schemagen . predict.py:Predictor train.py:train`` prints it.
SCHEMA_PATH = Path(__file__).resolve().parent / "openapi_schema.json"

Number = Union[int, float]


@dataclass(frozen=True)
class InputSpec:
    """One input of the ``Input`` (or ``TrainingInput``) component of the Cog schema.

    Attributes:
        name: the input's name.
        type: JSON Schema type: "string", "integer", "number" or "boolean".
        required: listed in ``required`` (no default).
        default: the default value (None when there is none, or when it is null).
        minimum / maximum: inclusive bounds (``ge`` / ``le`` in predict.py), or None.
        max_length: longest allowed string, characters (``max_length`` in predict.py), or None.
        nullable: accepts null (``Optional[...]`` in predict.py).
        choices: allowed values (``choices=`` in predict.py), or None.
        description: the input's description.
    """

    name: str
    type: str
    required: bool
    default: Any = None
    minimum: Optional[Number] = None
    maximum: Optional[Number] = None
    max_length: Optional[int] = None
    nullable: bool = False
    choices: Optional[tuple[Any, ...]] = None
    description: str = ""

    def allowed(self) -> str:
        """The allowed range in words, e.g. "0 to 5" or ">= 1"."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f"{low:g} to {high:g}" if self.type == "number" else f"{low} to {high}"
        if low is not None:
            return f">= {low:g}" if self.type == "number" else f">= {low}"
        if high is not None:
            return f"<= {high:g}" if self.type == "number" else f"<= {high}"
        return "any value"


def parse_input_specs(schema: dict[str, Any], component: str = "Input") -> dict[str, InputSpec]:
    """The inputs of ``component`` ("Input" or "TrainingInput") in an OpenAPI document from Cog, in
    declaration order (``x-order``).

    Raises:
        ConfigError: the document has no such component, or a property has no type.
    """
    components = schema.get("components", {}).get("schemas", {})
    try:
        body = components[component]
    except KeyError:
        raise ConfigError(f"the Cog schema has no {component} component") from None
    required = set(body.get("required", []))
    specs: dict[str, InputSpec] = {}
    properties = sorted(body.get("properties", {}).items(), key=lambda item: item[1].get("x-order", 0))
    for name, prop in properties:
        choices: Optional[tuple[Any, ...]] = None
        kind = prop.get("type")
        for ref in prop.get("allOf", []):  # choices=: an enum component referenced with allOf
            target = components.get(ref.get("$ref", "").rsplit("/", 1)[-1], {})
            if "enum" in target:
                choices = tuple(target["enum"])
                kind = kind or target.get("type")
        if kind is None:
            raise ConfigError(f"the Cog schema's {component}.{name} has no type")
        specs[name] = InputSpec(
            name=name,
            type=kind,
            required=name in required,
            default=prop.get("default"),
            minimum=prop.get("minimum"),
            maximum=prop.get("maximum"),
            max_length=prop.get("maxLength"),
            nullable=bool(prop.get("nullable", False)),
            choices=choices,
            description=prop.get("description", ""),
        )
    return specs


@lru_cache(maxsize=4)
def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    """The Cog schema at ``path`` as a dict (read and parsed once, cached).

    Raises:
        ConfigError: the file is missing or is not JSON (not cached: the next call tries again).
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"the Cog input schema {path} is missing ({exc.strerror}): regenerate it with "
            "../shared/tools/cog-schemagen . predict.py:Predictor train.py:train > .cog/openapi_schema.json "
            "(cog build writes the same file into the image)"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"the Cog input schema {path} is not valid JSON: {exc}") from None


@lru_cache(maxsize=8)
def input_specs(path: Path = SCHEMA_PATH, component: str = "Input") -> Mapping[str, InputSpec]:
    """The predictor's inputs as the Cog schema at ``path`` declares them (read and parsed once, cached:
    every prediction validates against them, so this is on the path to its first token).

    Returns:
        A read-only mapping, name -> spec, in declaration order.

    Raises:
        ConfigError: the schema file is missing or invalid (not cached: the next call tries again).
    """
    return MappingProxyType(parse_input_specs(load_schema(path), component))
