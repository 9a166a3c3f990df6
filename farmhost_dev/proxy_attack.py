"""An agent program (kind `command`) that sends the LLM proxy bodies from inside its sandbox, for tests and bench/.

`agent_command(mode, bodies)` is the argv to put in `agent-limits.json` as a group's `agentCommand`. The program
reads its AgentInput, POSTs `bodies` chat requests at once to `/workspace/run/llm.sock`, then one body nested a
million levels deep, writes each answer's status and error message to `/workspace/group/attack.json` (the group's
workspace: `<data>/groups/<folder>/attack.json` on the host) and prints an AgentResult. Modes:
- `tiny`: 4 MiB bodies of empty objects in `tools` (2 bytes of text, 64 of dict once built: issue 33, finding 3);
- `normal`: a few-KB chat request, the baseline the attack is compared with.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final, Literal

REPORT: Final = "attack.json"

PROGRAM: Final = r"""
import json, socket, sys, threading
sys.stdin.read()
mode, count = sys.argv[1], int(sys.argv[2])
def post(body):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect("/workspace/run/llm.sock")
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: farmhost\r\nContent-Type: application/json\r\n"
    conn.sendall(f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    answer = b""
    while chunk := conn.recv(65536):
        answer += chunk
    conn.close()
    status = int(answer.split(b" ", 2)[1])
    text = answer.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(text)["error"]["message"] if status >= 400 else ""
prefix = b'{"messages": [{"role": "user", "content": "how are the pumps?"}], "tools": ['
if mode == "tiny":
    body = prefix + b",".join([b"{}"] * ((4 * 1024 * 1024 - len(prefix) - 2) // 3)) + b"]}"
else:
    tool = {"type": "function", "function": {"name": "ha_state", "parameters": {"type": "object"}}}
    body = prefix + b",".join([json.dumps(tool).encode()] * 40) + b"]}"
answers = [None] * count
def one(i):
    answers[i] = post(body)
threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
answers.append(post(b"[" * 1_000_000))
with open("/workspace/group/attack.json", "w") as out:
    json.dump({"answers": answers, "bodyBytes": len(body)}, out)
print(json.dumps({"status": "ok", "answer": "sent", "error": None, "turns": 0, "toolCalls": 0}))
"""


def agent_command(mode: Literal["tiny", "normal"], bodies: int) -> list[str]:
    """The argv of the attacking agent (this interpreter: bwrap mounts the host's)."""
    return [sys.executable, "-c", PROGRAM, mode, str(bodies)]


def status_kb(pid: int, field: str) -> int:
    """A `/proc/<pid>/status` figure in kB (`VmRSS`, `VmHWM`: the peak since the process started)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(f"no {field} in /proc/{pid}/status")
