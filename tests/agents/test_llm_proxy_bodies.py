"""What the LLM proxy does with request bodies it cannot forward: a 400 that says why, and a log line (issue 33, 3)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from llm_stub import Reply, ScriptedLLM
from test_llm_proxy import ask, configured, proxied

from farmhost.agents.proxy.body import BodyRefused
from farmhost.agents.proxy.parse import MAX_DEPTH, MAX_VALUES, scan


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as stub:
        yield stub


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root


MESSAGES = [{"role": "user", "content": "how are the pumps?"}]


def _tools_of(values: int) -> bytes:
    """A chat body whose `tools` list holds `values` empty objects (the attack: tiny values, huge once built)."""
    return b'{"messages": ' + json.dumps(MESSAGES).encode() + b', "tools": [' + b",".join([b"{}"] * values) + b"]}"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[" * 1_000_000, f"the request body nests arrays and objects deeper than {MAX_DEPTH} levels"),
        (
            b'{"messages": ' + b'{"a": ' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 2),
            f"the request body nests arrays and objects deeper than {MAX_DEPTH} levels",
        ),
        (
            _tools_of(MAX_VALUES),
            f"the request body holds more than {MAX_VALUES} JSON values; send a shorter conversation or smaller "
            + "tool schemas",
        ),
        (b'{"messages": [', "the request body is not JSON (Expecting value at line 1, column 15)"),
        (b'{"messages": "\\u12"}', "the request body is not JSON (Invalid \\uXXXX escape at line 1, column 16)"),
        (b'{"messages": [NaN]}', "the request body is not JSON (NaN is not a JSON number)"),
        (b'{"messages": "' + b'\\"' * 100_000, "the request body is not JSON (Unterminated string starting at"),
        (b"\xff\xfe{", "the request body is not JSON ("),
    ],
    ids=["million-deep", "just-too-deep", "too-many-values", "cut", "bad-escape", "nan", "unterminated", "not-utf8"],
)
async def test_a_body_that_cannot_be_forwarded_is_a_400_that_says_why_and_is_logged(
    root: Path, llm: ScriptedLLM, caplog: pytest.LogCaptureFixture, raw: bytes, message: str
) -> None:
    with caplog.at_level(logging.INFO, logger="farmhost.agents.proxy"):
        async with (
            proxied(configured(root, llm)) as (_, usage, path),
            httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=path)) as client,
        ):
            refused = await client.post("http://farmhost/v1/chat/completions", content=raw)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["message"].startswith(message) and error["code"] == "invalid_request"
    lines = [r.getMessage() for r in caplog.records if r.name == "farmhost.agents.proxy"]
    assert f"llm field run run-1: request refused: {error['message']}" in lines
    assert any(line.startswith("llm field run run-1: HTTP 400 in ") for line in lines)
    assert all(r.exc_info is None for r in caplog.records)
    assert llm.requests == [] and usage.requests == 0


async def test_a_large_body_within_the_limits_is_forwarded_whole(root: Path, llm: ScriptedLLM) -> None:
    llm.script(then=Reply("ok"))
    deep: object = "bottom"
    for _ in range(MAX_DEPTH - 4):  # the body, `response_format` and its `json_schema` add three levels
        deep = [deep]
    stop = ["x"] * (MAX_VALUES - 1000)
    async with proxied(configured(root, llm)) as (client, usage, _):
        answer = await ask(client, extra_body={"response_format": {"json_schema": deep}, "stop": stop})
    assert answer.choices[0].message.content == "ok"
    (seen,) = llm.requests
    assert seen.body["stop"] == stop and seen.body["response_format"]["json_schema"] == deep
    assert usage.requests == 1


@pytest.mark.parametrize(
    ("raw", "values", "depth"),
    [
        (b"[]", 1, 1),
        (b'{"a": [1, "b", true, null, {"c": -2.5e3}]}', 10, 3),
        (b'["a\\"]]]", "\\\\", "[{"]', 4, 1),  # brackets and escaped quotes inside strings are not structure
        (b" [ [ ] , [ ] ] \n", 3, 2),
    ],
)
def test_the_scan_counts_values_and_depth_exactly(raw: bytes, values: int, depth: int) -> None:
    scan(raw, max_values=values, max_depth=depth)
    with pytest.raises(BodyRefused, match="JSON values"):
        scan(raw, max_values=values - 1, max_depth=depth)
    with pytest.raises(BodyRefused, match="deeper than"):
        scan(raw, max_values=values, max_depth=depth - 1)
