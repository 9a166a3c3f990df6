"""The tools that reach the host, from the two files the host exports: the contract and the tool table.

`farmagent/tool_table.json` (`farmhost schema --tools`) holds one entry per row of the host's catalog
(farmhost/protocol/catalog.py): the tool's name, text, hints, result, and the request or action it writes.

`farmhost schema` writes that file from the host's pydantic models (`make schema`; a test keeps it current), so a
bound, an enum or a description of a request or an action's params is written once, on the host, and the
built-in runner and the MCP server offer exactly what the host accepts. The export is JSON Schema 2020-12 as
pydantic writes it; tools get a plain form of it: references inlined, `X or null` written as `X` (leaving a
param out means its default, as null does), titles dropped.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, Final

CONTRACT_FILE: Final = "ipc_contract.json"
TABLE_FILE: Final = "tool_table.json"
_DROPPED: Final = frozenset({"title", "$defs", "discriminator", "allOf"})
_MAX_DEPTH: Final = 32


@cache
def contract() -> dict[str, Any]:
    """The exported contract shipped with this package."""
    # Beside this module (a wheel installs it there); read without importlib.resources, which costs a run ~10 ms.
    document: dict[str, Any] = json.loads((Path(__file__).parent / CONTRACT_FILE).read_text("utf-8"))
    return document


@cache
def tool_table() -> tuple[dict[str, Any], ...]:
    """The entries of the tool table shipped with this package, in the host's order."""
    document = json.loads((Path(__file__).parent / TABLE_FILE).read_text("utf-8"))
    return tuple(document["tools"])


@cache
def farm_actions() -> dict[str, float | None]:
    """Every farm action of the contract and the client's wait for it (None: the client's default)."""
    return {entry["action"]: entry["timeout"] for entry in tool_table() if entry["request"] == "farm_action"}


def action_parameters(action: str) -> dict[str, Any]:
    """The parameters of a farm or memory action's tool: its params model, in plain form.

    Raises:
        KeyError: the contract has no such action.
    """
    return _object(plain(contract()["actions"][action]))


def request_parameters(kind: str, *fields: str) -> dict[str, Any]:
    """The parameters of a tool that writes a request of `kind`: those of its `fields` the tool exposes.

    Raises:
        KeyError: the contract has no such request type, or the request no such field.
    """
    model = plain(contract()["requests"][kind])
    properties = {name: model["properties"][name] for name in fields}
    required = [name for name in model.get("required", ()) if name in properties]
    return _object({"type": "object", "properties": properties, "required": required})


def plain(node: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """`node` with its references inlined, `X or null` as `X` and the titles dropped.

    Raises:
        ValueError: references nested deeper than the contract ever needs (a loop), or not local.
    """
    if depth > _MAX_DEPTH:
        raise ValueError("the contract's references nest too deep")
    if "$ref" in node:
        target = _resolve(str(node["$ref"]))
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    branches = node.get("anyOf")
    if isinstance(branches, list):
        kept = [b for b in branches if b != {"type": "null"}]
        if len(kept) == 1 and len(kept) < len(branches):
            outer = {k: v for k, v in node.items() if k != "anyOf"}
            node = {**plain(kept[0], depth + 1), **outer}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key == "properties":
            out[key] = {name: plain(sub, depth + 1) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = plain(value, depth + 1)
        elif key == "anyOf":
            out[key] = [plain(branch, depth + 1) for branch in value]
        else:
            out[key] = value
    return out


def _object(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": schema.get("properties", {}),
        "required": list(schema.get("required", ())),
        "additionalProperties": False,
    }


def _resolve(ref: str) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"the contract has a non-local reference {ref!r}")
    node: Any = contract()
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    if not isinstance(node, dict):
        raise TypeError(f"the contract's reference {ref!r} is not a schema")
    return node
