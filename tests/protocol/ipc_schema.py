"""The exported IPC contract checked by `jsonschema`: a validator for any entry point of the document.

The entry points (`queues.<queue>`, `requests.<type>`, `actions.<action>`, `result`) are sub-schemas of one
document whose references are relative to its root, so each is validated as a `$ref` into the registered root.
`date-time` is checked (jsonschema checks it with `rfc3339-validator`, a dev dependency for that reason).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from farmhost.protocol.schema import contract_schema

SCHEMA = contract_schema()
ROOT_ID = SCHEMA["$id"]
REGISTRY: Registry[Any] = Registry().with_resource(ROOT_ID, DRAFT202012.create_resource(SCHEMA))
FORMATS = Draft202012Validator.FORMAT_CHECKER


def errors(instance: Any, pointer: str = "") -> list[str]:
    """Why `instance` does not match the schema at `pointer` (`/queues/tasks`; "" is the root); empty when it does."""
    validator = Draft202012Validator({"$ref": f"{ROOT_ID}#{pointer}"}, registry=REGISTRY, format_checker=FORMATS)
    return [f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message}" for e in validator.iter_errors(instance)]


def resolve(ref: str) -> dict[str, Any]:
    """The schema a local reference (`#/$defs/Result`) names, resolved by jsonschema's own resolver."""
    found = REGISTRY.resolver(ROOT_ID).lookup(ref).contents
    assert isinstance(found, dict), ref
    return found


def refs(node: Any) -> Iterator[str]:
    """Every `$ref` in `node` and the targets of every `discriminator` mapping inside it."""
    if isinstance(node, list):
        for item in node:
            yield from refs(item)
    elif isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        yield from node.get("discriminator", {}).get("mapping", {}).values()
        for value in node.values():
            yield from refs(value)
