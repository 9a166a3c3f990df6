"""Checking tool arguments against the tools' JSON Schemas (the small subset the tool table uses).

Models send wrong types and invented keys; refusing them here, with a sentence naming the argument, lets
the model fix the call at once instead of the host quarantining a request file. Supported keywords: type,
properties, required, additionalProperties, enum, minimum, maximum, minLength, maxLength, items, minItems,
maxItems.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def check(schema: Mapping[str, Any], value: Any) -> None:
    """Raise InvalidRequestError listing every way `value` breaks `schema` (at most five)."""
    problems: list[str] = []
    _check(schema, value, "arguments", problems)
    if problems:
        shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise InvalidRequestError(f"invalid arguments: {shown}")


def _is(kind: str, value: Any) -> bool:
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[kind])


def _check(schema: Mapping[str, Any], value: Any, where: str, problems: list[str]) -> None:
    kinds = schema.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_is(kind, value) for kind in allowed):
            problems.append(f"{where} must be {' or '.join(allowed)} (got {_short(value)})")
            return
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where} must be one of {', '.join(map(repr, schema['enum']))} (got {_short(value)})")
    if isinstance(value, dict):
        _check_object(schema, value, where, problems)
    elif isinstance(value, list):
        _check_array(schema, value, where, problems)
    elif isinstance(value, str):
        _bounds(len(value), schema.get("minLength"), schema.get("maxLength"), f"{where} length", problems)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _bounds(value, schema.get("minimum"), schema.get("maximum"), where, problems)


def _check_object(schema: Mapping[str, Any], value: dict[str, Any], where: str, problems: list[str]) -> None:
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            problems.append(f"{where}.{name} is required")
    for name, item in value.items():
        if name in properties:
            _check(properties[name], item, f"{where}.{name}", problems)
        elif schema.get("additionalProperties", True) is False:
            known = ", ".join(properties) or "none"
            problems.append(f"{where} has the unknown argument {name!r} (known: {known})")
        elif isinstance(schema.get("additionalProperties"), dict):
            _check(schema["additionalProperties"], item, f"{where}.{name}", problems)


def _check_array(schema: Mapping[str, Any], value: list[Any], where: str, problems: list[str]) -> None:
    _bounds(len(value), schema.get("minItems"), schema.get("maxItems"), f"{where} item count", problems)
    items = schema.get("items")
    if isinstance(items, dict):
        for index, item in enumerate(value):
            _check(items, item, f"{where}[{index}]", problems)


def _bounds(number: float, low: float | None, high: float | None, what: str, problems: list[str]) -> None:
    if low is not None and number < low:
        problems.append(f"{what} must be at least {low:g} (got {number:g})")
    if high is not None and number > high:
        problems.append(f"{what} must be at most {high:g} (got {number:g})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
