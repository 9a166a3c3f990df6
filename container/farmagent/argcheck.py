"""Checking tool arguments against the tools' JSON Schemas (the small subset the tool table uses).

Models send wrong types and invented keys; refusing them here, with a sentence naming the argument, lets
the model fix the call at once instead of the host quarantining a request file. Supported keywords: type,
properties, required, additionalProperties, enum, const, anyOf, pattern, minimum, maximum, exclusiveMinimum,
exclusiveMaximum, minLength, maxLength, items, minItems, maxItems; annotations (description, default) are
ignored. It accepts and refuses what `jsonschema` does (tests/farmagent/test_argcheck_jsonschema.py compares
the two on every tool's schema) without importing it: the runner starts in every agent run.

As in JSON Schema, a float with no fraction (`8.0`) is an integer; `check` hands it on as the int, because the
host's models are strict and refuse `8.0` where they take `8`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any, Final

from farmagent.errors import InvalidRequestError

_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def obj(properties: Mapping[str, Any], *required: str) -> dict[str, Any]:
    """An object schema with exactly `properties`, of which `required` must be present."""
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


def check(schema: Mapping[str, Any], value: Any) -> Any:
    """`value` as checked: the same, with each integral float where `schema` wants an integer made an int.

    Raises:
        InvalidRequestError: listing every way `value` breaks `schema` (at most five).
    """
    value, problems = checked(schema, value, "arguments")
    if problems:
        raise InvalidRequestError(f"invalid arguments: {summary(problems)}")
    return value


def checked(schema: Mapping[str, Any], value: Any, root: str) -> tuple[Any, list[str]]:
    """`value` as checked (see `check`) and every way it breaks `schema`, each a sentence naming the place."""
    problems: list[str] = []
    return _check(schema, value, root, problems), problems


def summary(problems: list[str]) -> str:
    """The first five problems, joined."""
    return "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")


def _is(kind: str, value: Any) -> bool:
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[kind])


def _check(schema: Mapping[str, Any], value: Any, where: str, problems: list[str]) -> Any:
    """Append how `value` breaks `schema` to `problems`; return `value` as checked (see `check`)."""
    kinds = schema.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_is(kind, value) for kind in allowed):
            problems.append(f"{where} must be {' or '.join(allowed)} (got {_short(value)})")
            return value
        if isinstance(value, float) and "integer" in allowed and "number" not in allowed:
            value = int(value)
    branches = schema.get("anyOf")
    if branches is not None:
        fits, value = _any_branch(branches, value, where, problems)
        if not fits:
            return value
    if "const" in schema and not _same(value, schema["const"]):
        problems.append(f"{where} must be {schema['const']!r} (got {_short(value)})")
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        problems.append(f"{where} must be one of {', '.join(map(repr, schema['enum']))} (got {_short(value)})")
    if isinstance(value, dict):
        return _check_object(schema, value, where, problems)
    if isinstance(value, list):
        return _check_array(schema, value, where, problems)
    _check_scalar(schema, value, where, problems)
    return value


def _check_scalar(schema: Mapping[str, Any], value: Any, where: str, problems: list[str]) -> None:
    if isinstance(value, str):
        _bounds(len(value), schema.get("minLength"), schema.get("maxLength"), f"{where} length", problems)
        if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
            problems.append(f"{where} must match {schema['pattern']} (got {_short(value)})")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _bounds(value, schema.get("minimum"), schema.get("maximum"), where, problems)
        if "exclusiveMinimum" in schema and not value > schema["exclusiveMinimum"]:
            problems.append(f"{where} must be more than {schema['exclusiveMinimum']:g} (got {value:g})")
        if "exclusiveMaximum" in schema and not value < schema["exclusiveMaximum"]:
            problems.append(f"{where} must be less than {schema['exclusiveMaximum']:g} (got {value:g})")


def _any_branch(branches: list[Mapping[str, Any]], value: Any, where: str, problems: list[str]) -> tuple[bool, Any]:
    """Whether `value` fits one of `branches`, and `value` as the first that fits checked it.

    When none fits, the closest branch's problems are reported.
    """
    best: list[str] | None = None
    for branch in branches:
        found: list[str] = []
        checked = _check(branch, value, where, found)
        if not found:
            return True, checked
        if best is None or len(found) < len(best):
            best = found
    problems.extend(best or [f"{where} fits none of the allowed forms (got {_short(value)})"])
    return False, value


def _same(a: Any, b: Any) -> bool:
    # JSON equality: true is not 1.
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


@cache
def _pattern(source: str) -> re.Pattern[str]:
    return re.compile(source)


def _check_object(schema: Mapping[str, Any], value: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            problems.append(f"{where}.{name} is required")
    checked = dict(value)
    for name, item in value.items():
        if name in properties:
            checked[name] = _check(properties[name], item, f"{where}.{name}", problems)
        elif schema.get("additionalProperties", True) is False:
            known = ", ".join(properties) or "none"
            problems.append(f"{where} has the unknown key {name!r} (known: {known})")
        elif isinstance(schema.get("additionalProperties"), dict):
            checked[name] = _check(schema["additionalProperties"], item, f"{where}.{name}", problems)
    return checked


def _check_array(schema: Mapping[str, Any], value: list[Any], where: str, problems: list[str]) -> list[Any]:
    _bounds(len(value), schema.get("minItems"), schema.get("maxItems"), f"{where} item count", problems)
    items = schema.get("items")
    if not isinstance(items, dict):
        return value
    return [_check(items, item, f"{where}[{index}]", problems) for index, item in enumerate(value)]


def _bounds(number: float, low: float | None, high: float | None, what: str, problems: list[str]) -> None:
    if low is not None and number < low:
        problems.append(f"{what} must be at least {low:g} (got {number:g})")
    if high is not None and number > high:
        problems.append(f"{what} must be at most {high:g} (got {number:g})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
