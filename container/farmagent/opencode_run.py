"""`python -m farmagent.opencode_run`: one run of OpenCode as the group's agent, inside the sandbox.

The host's contract is the same as the built-in runner's: the AgentInput on stdin, the AgentResult as the last
stdout line. In between, OpenCode (`$FARMAGENT_OPENCODE`, run non-interactively) is the agent: its LLM is
farmhost's proxy, reached through a loopback bridge to `$FARMAGENT_LLM_SOCKET` (OpenCode speaks HTTP to a
URL, the proxy listens on a Unix socket); its only tools for the farm are `farmagent-mcp`'s, as a local MCP
server. Its configuration, caches and state are written per run under `$TMPDIR`, nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from farmagent.contract import MAX_INPUT_BYTES, AgentInput, AgentResult, InputError, parse_input

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_BAD_INPUT: Final = 2
PROVIDER: Final = "farmhost"
JPEG_DATA_URL: Final = "data:image/jpeg;base64,"  # what the contract lets an attached image be
_STDERR_TAIL: Final = 2000
MAX_OUTPUT_TOKENS: Final = 4096  # a reply's share of the context: a quarter, at most this
MIN_CONTEXT_TOKENS: Final = 512  # the runner's own lower bound for the setting (farmagent.config)
# What OpenCode would otherwise try at each start, from a sandbox without network: fetch models.dev's catalogue
# (the provider and model are all in the configuration), look for an update, download language servers, load
# plugins from npm (the configuration names none, nor its built-in ones), share a session.
OPENCODE_OFFLINE: Final = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_PURE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}
# The configuration is the host's alone. OpenCode merges an `opencode.json` or `.opencode/` of the directory it runs
# in over OPENCODE_CONFIG, and that directory is the group's workspace, which the agent writes: an earlier run could
# change the model, add instructions to every later prompt, other MCP servers or permissions. Claude Code's files
# (CLAUDE.md, ~/.claude skills) and external skills are no configuration of farmhost's either. Without the watcher
# OpenCode does not put an inotify watch on every directory of a large workspace at each start.
OPENCODE_HOST_CONFIG_ONLY: Final = {
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    "OPENCODE_EXPERIMENTAL_DISABLE_FILEWATCHER": "1",
}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()


async def _bridge_one(socket_path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


def opencode_config(*, port: int, model: str, environ: Mapping[str, str], sees: bool = False) -> dict[str, Any]:
    """OpenCode's configuration for one run: farmhost's proxy as the only provider, farmagent-mcp as the tools.

    `sees`: the host attached a photo (it does so only for an endpoint with FARMHOST_LLM_VISION), so the model is
    declared to take images; otherwise OpenCode would send a note in the image's place.
    """
    farm_env = {k: v for k, v in environ.items() if k.startswith("FARMAGENT_") or k in ("TZ", "LANG", "HOME")}
    entry: dict[str, Any] = {"name": model}
    context = context_tokens(environ)
    if context is not None:
        # OpenCode sizes its replies and compacts its conversation to the model's limit: the host's figure.
        entry["limit"] = {"context": context, "output": min(MAX_OUTPUT_TOKENS, context // 4)}
    if sees:
        entry |= {"attachment": True, "modalities": {"input": ["text", "image"], "output": ["text"]}}
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "farmhost",
                "options": {"baseURL": f"http://127.0.0.1:{port}/v1", "apiKey": "the-host-adds-the-key"},
                "models": {model: entry},
            }
        },
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        "mcp": {
            "farm": {
                "type": "local",
                "command": [sys.executable, "-I", "-m", "farmagent.mcp_server"],  # nothing of the workspace (cwd)
                "environment": farm_env,
                "enabled": True,
            }
        },
        # The sandbox is the boundary: inside it OpenCode may edit and run what it likes, never reach out.
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        "autoupdate": False,
        "share": "disabled",
    }


def context_tokens(environ: Mapping[str, str]) -> int | None:
    """The endpoints' context the host passed (FARMAGENT_LLM_CONTEXT_TOKENS), or None when it knows none."""
    try:
        tokens = int(environ.get("FARMAGENT_LLM_CONTEXT_TOKENS", ""))
    except ValueError:
        return None
    return tokens if tokens >= MIN_CONTEXT_TOKENS else None


def attach_images(agent_input: AgentInput, into: Path) -> list[str]:
    """`--file` arguments for the run's photos: each JPEG the host attached (already downscaled), written as a file.

    OpenCode reads an attached PNG/JPEG/GIF/WebP and sends it to a model as an image part (`data:image/jpeg;base64,`
    of the same bytes): the data URL the proxy lets through is the host's own. Nothing when no photo is attached.
    """
    arguments = []
    for number, image in enumerate(agent_input.images):
        path = into / f"photo-{number}.jpg"
        path.write_bytes(base64.b64decode(image.url.removeprefix(JPEG_DATA_URL), validate=True))
        arguments += ["--file", str(path)]
    return arguments


def message_for(agent_input: AgentInput) -> str:
    """The prompt OpenCode gets: the request, then what memory found for it."""
    lines = [agent_input.prompt]
    if agent_input.memory:
        lines.append("\nFrom the farm's memory (cite as given):")
        lines += [f"- [{m.citation}] {m.snippet}" for m in agent_input.memory]
    return "\n".join(lines)


def answer_from_events(lines: list[str]) -> tuple[str | None, int, int]:
    """The reply (text of the last step that said something), steps and tool calls, from `--format json` events."""
    texts: dict[str, list[str]] = {}
    order: list[str] = []
    steps = tools = 0
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind, part = event.get("type"), event.get("part") or {}
        if kind == "step_start":
            steps += 1
        elif kind == "tool_use":
            tools += 1
        elif kind == "text" and isinstance(part.get("text"), str):
            message = str(part.get("messageID"))
            if message not in texts:
                texts[message] = []
                order.append(message)
            texts[message].append(part["text"])
    said = [m for m in order if "".join(texts[m]).strip()]
    return ("".join(texts[said[-1]]).strip() if said else None), steps, tools


async def run(agent_input: AgentInput, environ: Mapping[str, str]) -> AgentResult:
    """Bridge the proxy, write the configuration, run OpenCode, and turn its events into an AgentResult."""
    binary = environ.get("FARMAGENT_OPENCODE")
    if not binary:
        return AgentResult(status="error", error="FARMAGENT_OPENCODE is not set: the host did not mount OpenCode")
    socket_path = environ.get("FARMAGENT_LLM_SOCKET", "/workspace/run/llm.sock")
    server = await asyncio.start_server(lambda r, w: _bridge_one(socket_path, r, w), host="127.0.0.1", port=0)
    port = server.sockets[0].getsockname()[1]
    context = context_tokens(environ)
    if context is not None:
        source = environ.get("FARMAGENT_LLM_CONTEXT_SOURCE", "FARMAGENT_LLM_CONTEXT_TOKENS")
        sys.stderr.write(f"context: {context} tokens ({source}), given to OpenCode as the model's limit\n")
    with tempfile.TemporaryDirectory(prefix="opencode-") as scratch:
        root = Path(scratch)
        config = root / "opencode.json"
        config.write_text(
            json.dumps(
                opencode_config(port=port, model=agent_input.model, environ=environ, sees=bool(agent_input.images))
            )
        )
        env = {
            "PATH": environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root / "home"),
            "OPENCODE_CONFIG": str(config),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_DATA_HOME": str(root / "data"),
            "XDG_CACHE_HOME": str(root / "cache"),
            "XDG_STATE_HOME": str(root / "state"),
            "TZ": environ.get("TZ", "UTC"),
            "LANG": environ.get("LANG", "C.UTF-8"),
            **OPENCODE_OFFLINE,
            **OPENCODE_HOST_CONFIG_ONLY,
            **{k: v for k, v in environ.items() if k.startswith("FARMAGENT_")},
        }
        proc = await asyncio.create_subprocess_exec(
            # The message before the files: `--file` takes every word after it.
            binary, "run", "--format", "json", "--title", agent_input.runId, message_for(agent_input),
            *attach_images(agent_input, root),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, cwd=environ.get("FARMAGENT_GROUP_DIR", os.getcwd()),
        )  # fmt: skip
        out, err = await proc.communicate()
    server.close()
    sys.stderr.write(err.decode(errors="replace"))
    answer, steps, tools = answer_from_events(out.decode(errors="replace").splitlines())
    if proc.returncode != 0 or answer is None:
        why = err.decode(errors="replace").strip()[-_STDERR_TAIL:] or "no output"
        error = f"OpenCode exited with {proc.returncode} and no answer: {why}"
        return AgentResult(status="error", error=error, turns=steps, toolCalls=tools)
    return AgentResult(status="ok", answer=answer, turns=steps, toolCalls=tools)


def main() -> int:
    """Read stdin, run OpenCode, print the AgentResult; returns the exit status."""
    try:
        agent_input = parse_input(sys.stdin.buffer.read(MAX_INPUT_BYTES + 1))
    except InputError as err:
        print(AgentResult(status="error", error=err.message).to_json(), flush=True)
        return EXIT_BAD_INPUT
    result = asyncio.run(run(agent_input, os.environ))
    print(result.to_json(), flush=True)
    return EXIT_OK if result.status == "ok" else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
