"""The committed `docs/schema/ipc-v1.schema.json` is exactly what `farmhost schema` prints, and is usable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from farmhost_testing import farmhost
from ipc_schema import refs, resolve
from jsonschema import Draft202012Validator
from referencing.jsonschema import DRAFT202012

from farmhost.protocol.codes import QUEUE_DIRS, ErrorCode, Status
from farmhost.protocol.schema import contract_schema

COMMITTED = Path(__file__).parents[2] / "docs" / "schema" / "ipc-v1.schema.json"
REGENERATE = "farmhost schema -o docs/schema/ipc-v1.schema.json"
# Keywords that only describe, the `then` of an `if`, pydantic's `discriminator` (an OpenAPI annotation) and the
# entry points of farmhost's document: all the keywords jsonschema may ignore in the export. Any other keyword
# must be one jsonschema checks, so a constraint of the export never passes unchecked.
DESCRIBING = {"$schema", "$id", "$defs", "title", "description", "default", "examples", "discriminator", "then"}
ENTRIES = {"queues", "requests", "actions", "result"}


def _schemas(node: Any) -> Iterator[dict[str, Any]]:
    """`node` and every schema inside it, as the 2020-12 specification nests them."""
    if isinstance(node, dict):
        yield node
    for sub in DRAFT202012.subresources_of(node):
        yield from _schemas(sub)


def test_committed_schema_equals_the_generated_one(tmp_path: Path) -> None:
    printed = farmhost("schema", data_dir=tmp_path / "data")
    assert printed.returncode == 0, printed.stderr
    written = farmhost("schema", "-o", str(tmp_path / "out.json"), data_dir=tmp_path / "data")
    assert written.returncode == 0, written.stderr
    assert written.stdout == ""
    assert (tmp_path / "out.json").read_text(encoding="utf-8") == printed.stdout
    assert COMMITTED.read_text(encoding="utf-8") == printed.stdout, f"stale schema: run `{REGENERATE}`"
    assert not (tmp_path / "data").exists()  # printing the schema touches no data directory


def test_schema_is_self_contained_json_schema() -> None:
    schema = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith("ipc-v1.json")
    Draft202012Validator.check_schema(schema)  # a valid schema by the 2020-12 meta-schema
    checked = set(Draft202012Validator.VALIDATORS)
    unchecked = {key for node in _schemas(schema) for key in node} - checked - DESCRIBING - ENTRIES
    assert unchecked == set(), f"keywords jsonschema would ignore: {sorted(unchecked)}"
    every_ref = list(refs(schema))
    assert every_ref
    for ref in every_ref:
        resolve(ref)  # every reference resolves from the root document
    assert set(schema["queues"]) == set(QUEUE_DIRS)
    result = resolve(schema["result"]["$ref"])
    assert result["properties"]["status"]["enum"] == [s.value for s in Status]
    assert result["properties"]["errorCode"]["enum"] == [*(c.value for c in ErrorCode), None]


def test_schema_module_and_cli_agree() -> None:
    assert json.loads(COMMITTED.read_text(encoding="utf-8")) == contract_schema()
