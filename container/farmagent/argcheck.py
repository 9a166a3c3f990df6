"""Checking tool arguments against the tools' JSON Schemas (the small subset the tool table uses).

Models send wrong types and invented keys; refusing them here, with a sentence naming the argument, lets
the model fix the call at once instead of the host quarantining a request file. Supported keywords: type,
properties, required, additionalProperties, enum, const, anyOf, pattern, minimum, maximum, exclusiveMinimum,
exclusiveMaximum, minLength, maxLength, items, minItems, maxItems; annotations (description, default) are
ignored.
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


def check(schema: Mapping[str, Any], value: Any) -> None:
    """Raise InvalidRequestError listing every way `value` breaks `schema` (at most five)."""
    problems = problems_of(schema, value, "arguments")
    if problems:
        raise InvalidRequestError(f"invalid arguments: {summary(problems)}")


def problems_of(schema: Mapping[str, Any], value: Any, root: str) -> list[str]:
    """Every way `value` breaks `schema`, each a sentence naming the place from `root` down."""
    problems: list[str] = []
    _check(schema, value, root, problems)
    return problems


def summary(problems: list[str]) -> str:
    """The first five problems, joined."""
    return "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")


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
    branches = schema.get("anyOf")
    if branches is not None and not _any_branch(branches, value, where, problems):
        return
    if "const" in schema and not _same(value, schema["const"]):
        problems.append(f"{where} must be {schema['const']!r} (got {_short(value)})")
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        problems.append(f"{where} must be one of {', '.join(map(repr, schema['enum']))} (got {_short(value)})")
    if isinstance(value, dict):
        _check_object(schema, value, where, problems)
    elif isinstance(value, list):
        _check_array(schema, value, where, problems)
    elif isinstance(value, str):
        _bounds(len(value), schema.get("minLength"), schema.get("maxLength"), f"{where} length", problems)
        if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
            problems.append(f"{where} must match {schema['pattern']} (got {_short(value)})")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _bounds(value, schema.get("minimum"), schema.get("maximum"), where, problems)
        if "exclusiveMinimum" in schema and not value > schema["exclusiveMinimum"]:
            problems.append(f"{where} must be more than {schema['exclusiveMinimum']:g} (got {value:g})")
        if "exclusiveMaximum" in schema and not value < schema["exclusiveMaximum"]:
            problems.append(f"{where} must be less than {schema['exclusiveMaximum']:g} (got {value:g})")


def _any_branch(branches: list[Mapping[str, Any]], value: Any, where: str, problems: list[str]) -> bool:
    """True when `value` fits one of `branches`; else the closest branch's problems are reported."""
    best: list[str] | None = None
    for branch in branches:
        found: list[str] = []
        _check(branch, value, where, found)
        if not found:
            return True
        if best is None or len(found) < len(best):
            best = found
    problems.extend(best or [f"{where} fits none of the allowed forms (got {_short(value)})"])
    return False


def _same(a: Any, b: Any) -> bool:
    # JSON equality: true is not 1.
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


@cache
def _pattern(source: str) -> re.Pattern[str]:
    return re.compile(source)


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
            problems.append(f"{where} has the unknown key {name!r} (known: {known})")
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
