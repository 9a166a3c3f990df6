"""A group's daily token budget holds against concurrent requests, through the daemon, a command agent and bwrap.

The red-team's finding: eight 3 MiB prompts sent at once all passed a budget of 100,000 tokens (6.3 million used),
as tokens were counted only once answers came. Now each request reserves an estimate of its cost before it goes
upstream (one token per byte of the body, plus its max_tokens), in-flight reservations included.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
from pathlib import Path
from typing import Any

from farmhost_testing import clean_env, init_data_dir_in_process, running_daemon, scaled, wait_for
from runtime_support import Sandbox, logged_answer, run_logs, schedule_run

from farmhost_dev.llm_stub import Recorded, Reply, ScriptedLLM, Streamed

# The agent: each step of its prompt sends `count` requests of `chars` characters at once over the proxy's socket,
# raw HTTP, and reports each answer's status with its usage or its error (a stream: whether it ended in an error).
AGENT = r"""
import json, os, socket, sys, threading
todo = json.loads(json.load(sys.stdin)["prompt"])

def post(chars, stream):
    body = {"messages": [{"role": "user", "content": "A" * chars}], "stream": stream}
    data = json.dumps(body).encode()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(os.environ["FARMAGENT_LLM_SOCKET"])
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: llm\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    if stream and status == 200:
        return [status, "error event" if b'"error"' in rest else "done"]
    reply = json.loads(rest)
    return [status, reply.get("usage") or reply["error"]["message"]]

steps = []
for step in todo:
    out = [None] * step["count"]
    def one(i, step=step, out=out):
        out[i] = post(step["chars"], step.get("stream", False))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(step["count"])]
    [t.start() for t in threads]
    [t.join() for t in threads]
    steps.append(out)
print(json.dumps({"status": "ok", "answer": json.dumps(steps), "error": None}))
"""

BUDGET = 100_000
MAX_TOKENS = 1000
CHARS = 30_000  # a request reserves about 31,000 tokens: three fit in the budget at once, a fourth does not


def _refused_in_log(daemon_log: str) -> int:
    return len(re.findall(r"llm field run \S+: HTTP 429", daemon_log))


def test_concurrent_requests_cannot_overrun_a_groups_daily_tokens(tmp_path: Path, sandbox: Sandbox) -> None:
    """8 requests at once: 3 fit and are answered, 5 are refused; a cut stream keeps its estimate; the day stays within."""
    data_dir = init_data_dir_in_process(tmp_path / "data")
    limits = {"groups": {"field": {"llmTokensPerDay": BUDGET, "maxTurns": 5}}}
    (data_dir / "agent-limits.json").write_text(json.dumps(limits))
    opened = threading.Event()

    def answer(request: Recorded) -> Any:
        if request.body.get("stream"):
            return Streamed(Reply("the pumps are fine"), cut_after=2)
        assert opened.wait(scaled(60)), "the test never let the answers go"
        return Reply("the pumps are fine")

    steps = [{"count": 8, "chars": CHARS}, {"count": 1, "chars": CHARS, "stream": True}, {"count": 1, "chars": 3 << 20}]
    with ScriptedLLM(then=answer) as llm:
        env = clean_env(TZ="Europe/Lisbon", **sandbox.values, **sandbox.env, FARMHOST_AGENT_KIND="command",
                        FARMHOST_AGENT_COMMAND=shlex.join((*sandbox.command[:-1], AGENT)),
                        FARMHOST_LLM_BASE_URL=llm.base_url, FARMHOST_LLM_MODEL="farm-model",
                        FARMHOST_LLM_MAX_TOKENS=str(MAX_TOKENS))  # fmt: skip
        with running_daemon(data_dir, env=env) as daemon:
            schedule_run(data_dir, json.dumps(steps))
            # The answers are held until all eight were decided: the ones upstream are in flight together.
            wait_for(lambda: len(llm.requests) + _refused_in_log(daemon.log()) >= 8, timeout=scaled(60),
                     what="all eight requests decided")  # fmt: skip
            opened.set()
            [log] = wait_for(lambda: run_logs(data_dir, 1), timeout=scaled(60), what="the run's log")
        parallel, [cut], [huge] = logged_answer(log)
    answered = [usage for status, usage in parallel if status == 200]
    refused = [message for status, message in parallel if status == 429]
    assert len(answered) == 3 and len(refused) == 5, parallel
    assert all("more than group field has left of its daily budget of 100000 LLM tokens" in m for m in refused), refused
    assert cut == [200, "error event"]
    assert huge[0] == 429, huge
    alone = re.match(r"this request may use up to (\d+) LLM tokens", huge[1])
    assert alone is not None and int(alone[1]) > 3 << 20, huge
    # What the run and the day were charged: the three answers' usage, and the cut stream's whole reservation.
    reported = [(u["prompt_tokens"], u["completion_tokens"]) for u in llm.usages[:3]]
    text = log.read_text()
    found = re.search(r"llm: 4 request\(s\), 6 refused, (\d+) prompt \+ (\d+) completion tokens", text)
    assert found is not None, text[:2000]
    prompt, completion = int(found[1]), int(found[2])
    assert completion == sum(c for _, c in reported) + MAX_TOKENS
    assert prompt - sum(p for p, _ in reported) > CHARS  # the cut stream's prompt, one token a byte
    assert prompt + completion <= BUDGET
    assert f"({prompt + completion} used" in huge[1]
