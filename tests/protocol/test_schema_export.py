"""The committed `docs/schema/ipc-v1.schema.json` is exactly what `farmhost schema` prints, and is usable."""

from __future__ import annotations

import json
from pathlib import Path

from farmhost_testing import farmhost
from minischema import resolve, unknown_keywords, walk

from farmhost.protocol.codes import QUEUE_DIRS, ErrorCode, Status
from farmhost.protocol.schema import contract_schema

COMMITTED = Path(__file__).parents[2] / "docs" / "schema" / "ipc-v1.schema.json"
REGENERATE = "farmhost schema -o docs/schema/ipc-v1.schema.json"


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
    assert unknown_keywords(schema) == []
    refs = [node["$ref"] for _, node in walk(schema) if "$ref" in node]
    refs += [target for _, node in walk(schema) for target in node.get("discriminator", {}).get("mapping", {}).values()]
    assert refs
    for ref in refs:
        resolve(schema, ref)  # every reference resolves from the root document
    assert set(schema["queues"]) == set(QUEUE_DIRS)
    result = resolve(schema, schema["result"]["$ref"])
    assert result["properties"]["status"]["enum"] == [s.value for s in Status]
    assert result["properties"]["errorCode"]["enum"] == [*(c.value for c in ErrorCode), None]


def test_schema_module_and_cli_agree() -> None:
    assert json.loads(COMMITTED.read_text(encoding="utf-8")) == contract_schema()
