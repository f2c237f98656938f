"""The structured-output inputs (``json_schema``, ``response_format``, ``regex``, ``grammar``) to one
:class:`cog_triton.ipc.Guide`, checked in the Cog worker; a stream process compiles it with xgrammar before the
request leaves (:class:`cog_triton.streaming.guided.GuideChecker`). The facts behind the guide types are in
:mod:`cog_triton.streaming.guided`'s docstring.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from common.errors import InputError
from cog_triton.ipc import RESPONSE_FORMATS, Guide


def _openai_schema(value: Any) -> Any:
    """The schema inside OpenAI's ``response_format.json_schema`` object ({"name", "schema", "strict"}),
    or ``value`` itself when it is not such an object (a plain JSON Schema has no top-level "schema")."""
    if isinstance(value, dict) and isinstance(value.get("schema"), dict) and "name" in value:
        if not ({"type", "properties", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"} & set(value)):
            return value["schema"]
    return value


def select_guide(
    json_schema: str = "", response_format: str = "text", regex: str = "", grammar: str = ""
) -> Optional[Guide]:
    """The guide the structured-output inputs ask for, or None (free text).

    At most one of ``json_schema``, ``regex`` and ``grammar`` may be given. ``response_format``
    "json_object" asks for any JSON (TensorRT-LLM's ``json`` guide); with ``json_schema`` it is
    redundant and allowed; with ``regex`` or ``grammar`` it is a contradiction.

    Raises:
        InputError: more than one guide, an unknown response_format, or a json_schema that is not a
            JSON object (the message names the input and the problem).
    """
    texts = (("json_schema", json_schema), ("regex", regex), ("grammar", grammar))
    given = [name for name, text in texts if text.strip()]
    if response_format not in RESPONSE_FORMATS:
        raise InputError(f"response_format={response_format!r} is not allowed; allowed: {', '.join(RESPONSE_FORMATS)}")
    if len(given) > 1:
        raise InputError(
            f"{' and '.join(given)} are both set; give at most one of json_schema, regex and grammar "
            "(each constrains the whole output)"
        )
    if response_format == "json_object" and given and given[0] != "json_schema":
        raise InputError(
            f"response_format=json_object asks for JSON, and {given[0]} asks for another format; give one of them"
        )
    if not given:
        return Guide("json", "", "response_format") if response_format == "json_object" else None
    name = given[0]
    if name == "regex":
        return Guide("regex", regex, "regex")
    if name == "grammar":
        return Guide("ebnf_grammar", grammar, "grammar")
    try:
        schema = json.loads(json_schema)
    except json.JSONDecodeError as exc:
        raise InputError(f"json_schema is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    schema = _openai_schema(schema)
    if not isinstance(schema, dict):
        raise InputError(
            f"json_schema must be a JSON Schema object such as {{\"type\": \"object\", ...}}, got a JSON "
            f"{type(schema).__name__}"
        )
    return Guide("json_schema", json.dumps(schema, ensure_ascii=False, separators=(",", ":")), "json_schema")
