"""A small JSON Schema (draft 2020-12) checker for the keywords farmhost's exported schema uses.

`jsonschema` is not a dependency of the project, so the tests check the exported document with this instead.
It refuses any keyword it does not know (`unknown_keywords`), so a constraint it cannot check never passes
silently: a new keyword in the export makes the tests fail until this checker learns it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

# Keywords that only describe (they never make an instance invalid).
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description", "default", "examples", "discriminator"})
# The entry points of farmhost's document (`queues.<queue>`, `requests.<type>`, `actions.<action>`, `result`):
# maps of sub-schemas, checked as such.
FARMHOST_ENTRIES = frozenset({"queues", "requests", "actions", "result"})
ASSERTIONS = frozenset(
    {
        "$ref",
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "anyOf",
        "oneOf",
        "allOf",
        "items",
        "minItems",
        "maxItems",
        "if",
        "then",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "format",
    }
)
KNOWN = ANNOTATIONS | FARMHOST_ENTRIES | ASSERTIONS


def resolve(root: dict[str, Any], ref: str) -> dict[str, Any]:
    """Follow a local `#/a/b` reference inside `root`."""
    if not ref.startswith("#/"):
        raise AssertionError(f"only local references are expected, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise AssertionError(f"reference {ref!r} does not resolve")
        node = node[part]
    assert isinstance(node, dict), ref
    return node


def subschemas(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema nested directly in `schema`, with the keyword it sits under."""
    for key in ("$defs", "properties"):
        for name, sub in schema.get(key, {}).items():
            yield f"{key}/{name}", sub
    for key in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(schema.get(key, [])):
            yield f"{key}/{i}", sub
    for key in ("additionalProperties", "items", "result", "if", "then"):
        if isinstance(schema.get(key), dict):
            yield key, schema[key]
    for entry in ("queues", "requests", "actions"):
        for name, sub in schema.get(entry, {}).items():
            yield f"{entry}/{name}", sub


def walk(schema: dict[str, Any], where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """`schema` and every schema inside it, depth first."""
    yield where, schema
    for key, sub in subschemas(schema):
        yield from walk(sub, f"{where}/{key}")


def unknown_keywords(schema: dict[str, Any]) -> list[str]:
    """`where: keyword` for every keyword this checker would not understand."""
    return [f"{where}: {key}" for where, node in walk(schema) for key in node if key not in KNOWN]


def _type_ok(instance: Any, kind: str) -> bool:
    if kind == "null":
        return instance is None
    if kind == "boolean":
        return isinstance(instance, bool)
    if kind == "integer":
        return (isinstance(instance, int) and not isinstance(instance, bool)) or (
            isinstance(instance, float) and instance.is_integer()
        )
    if kind == "number":
        return isinstance(instance, int | float) and not isinstance(instance, bool)
    if kind == "string":
        return isinstance(instance, str)
    if kind == "array":
        return isinstance(instance, list)
    if kind == "object":
        return isinstance(instance, dict)
    raise AssertionError(f"unknown type {kind!r}")


def _same(a: Any, b: Any) -> bool:
    # JSON equality: true is not 1.
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def errors(instance: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    """Why `instance` does not match `schema` (empty when it does); `root` resolves references."""
    found: list[str] = []
    if "$ref" in schema:
        found += errors(instance, resolve(root, schema["$ref"]), root, path)
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_type_ok(instance, k) for k in kinds):
            return [*found, f"{path}: {instance!r} is not of type {kinds}"]
    if "enum" in schema and not any(_same(instance, v) for v in schema["enum"]):
        found.append(f"{path}: {instance!r} is not one of {schema['enum']}")
    if "const" in schema and not _same(instance, schema["const"]):
        found.append(f"{path}: {instance!r} is not {schema['const']!r}")
    found += _combinator_errors(instance, schema, root, path)
    if isinstance(instance, dict):
        found += _object_errors(instance, schema, root, path)
    if isinstance(instance, list) and not schema.get("minItems", 0) <= len(instance) <= schema.get(
        "maxItems", len(instance)
    ):
        found.append(f"{path}: {len(instance)} items, outside minItems/maxItems")
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(instance):
            found += errors(item, schema["items"], root, f"{path}[{i}]")
    if isinstance(instance, str):
        found += _string_errors(instance, schema, path)
    if isinstance(instance, int | float) and not isinstance(instance, bool):
        found += _number_errors(instance, schema, path)
    return found


def _combinator_errors(instance: Any, schema: dict[str, Any], root: dict[str, Any], path: str) -> list[str]:
    found = []
    if "anyOf" in schema and not any(not errors(instance, s, root, path) for s in schema["anyOf"]):
        found.append(f"{path}: matches none of anyOf")
    if "oneOf" in schema:
        matches = sum(1 for s in schema["oneOf"] if not errors(instance, s, root, path))
        if matches != 1:
            found.append(f"{path}: matches {matches} of oneOf, not exactly one")
    for sub in schema.get("allOf", []):
        found += errors(instance, sub, root, path)
    if "if" in schema and not errors(instance, schema["if"], root, path) and "then" in schema:
        found += errors(instance, schema["then"], root, path)
    return found


def _object_errors(instance: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], path: str) -> list[str]:
    found = [f"{path}: missing required {key!r}" for key in schema.get("required", []) if key not in instance]
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, value in instance.items():
        if key in properties:
            found += errors(value, properties[key], root, f"{path}.{key}")
        elif extra is False:
            found.append(f"{path}: unexpected property {key!r}")
        elif isinstance(extra, dict):
            found += errors(value, extra, root, f"{path}.{key}")
    return found


def _string_errors(instance: str, schema: dict[str, Any], path: str) -> list[str]:
    found = []
    if "pattern" in schema and not re.search(schema["pattern"], instance):
        found.append(f"{path}: {instance!r} does not match {schema['pattern']}")
    if len(instance) < schema.get("minLength", 0):
        found.append(f"{path}: shorter than {schema['minLength']}")
    if "maxLength" in schema and len(instance) > schema["maxLength"]:
        found.append(f"{path}: longer than {schema['maxLength']}")
    if schema.get("format") == "date-time":
        try:
            moment = datetime.fromisoformat(instance)
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None or "T" not in instance.upper():
            found.append(f"{path}: {instance!r} is not an RFC 3339 date-time")
    return found


def _number_errors(instance: float, schema: dict[str, Any], path: str) -> list[str]:
    checks: dict[str, Callable[[float], bool]] = {
        "minimum": lambda bound: instance >= bound,
        "maximum": lambda bound: instance <= bound,
        "exclusiveMinimum": lambda bound: instance > bound,
        "exclusiveMaximum": lambda bound: instance < bound,
    }
    return [
        f"{path}: {instance} fails {key} {schema[key]}"
        for key, ok in checks.items()
        if key in schema and not ok(schema[key])
    ]
