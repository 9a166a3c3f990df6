"""`python -m farmagent.run`: one agent run, from the AgentInput on stdin to the AgentResult line on stdout.

Exit status: 0 the run answered (status ok), 1 it failed (LLM error, turn limit, a bug), 2 the AgentInput
or the FARMAGENT_* environment is unusable. Exactly one JSON line goes to stdout, always last; everything
else (logs, tracebacks, notes) goes to stderr, which the host keeps in the run's log file.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Final, TextIO

from farmagent import conversation
from farmagent.budget import context_tokens as context_tokens_of
from farmagent.config import AgentSettings
from farmagent.contract import MAX_INPUT_BYTES, AgentInput, AgentResult, InputError, parse_input
from farmagent.errors import ConfigError
from farmagent.llm import ChatClient, where
from farmagent.loop import LoopParams, run_loop
from farmagent.prompt import run_context, system_prompt
from farmagent.toolbox import Toolbox
from farmagent.tools import ToolContext, tools_for

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_BAD_INPUT: Final = 2

logger = logging.getLogger("farmagent.run")


def run(agent_input: AgentInput, settings: AgentSettings) -> AgentResult:
    """Run the tool loop for one AgentInput and keep the conversation when `contextMode` is `group`."""
    keep = agent_input.contextMode == "group"
    history = conversation.load(settings.group_dir) if keep else []
    tools = Toolbox.for_group(tools_for(is_main=agent_input.isMain))
    context_tokens, source = context_tokens_of(settings)
    logger.info("context: %s tokens (%s)", context_tokens or "?", source)
    params = LoopParams(
        model=agent_input.model,
        system=system_prompt(tools=tools.offered_names(), global_dir=settings.global_dir),
        history=history,
        context=run_context(agent_input, group_dir=settings.group_dir),
        prompt=agent_input.prompt,
        tools=tools,
        max_turns=agent_input.maxTurns,
        endpoint=where(settings),
        images=tuple(image.url for image in agent_input.images),
        context_tokens=context_tokens,
    )
    outcome = run_loop(ChatClient(settings), ToolContext.from_settings(settings), params)
    outcome.log_timing()
    if keep:
        conversation.save(settings.group_dir, history + outcome.added)
    return AgentResult(
        status=outcome.status,
        answer=outcome.answer,
        error=outcome.error,
        turns=outcome.turns,
        toolCalls=outcome.tool_calls,
    )


def main() -> int:
    """Read stdin, run, print the AgentResult; returns the exit status."""
    out = sys.stdout
    sys.stdout = sys.stderr  # a stray print() from any library must not break the one-line contract
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        agent_input = parse_input(sys.stdin.buffer.read(MAX_INPUT_BYTES + 1))
        settings = AgentSettings.from_env()
    except (InputError, ConfigError) as err:
        logger.error("%s", err.message)
        return _emit(out, AgentResult(status="error", error=err.message), EXIT_BAD_INPUT)
    logger.info(
        "run %s for %s (%s, %s, max %d turns)",
        agent_input.runId,
        agent_input.groupFolder,
        "scheduled" if agent_input.scheduled else "chat",
        agent_input.contextMode,
        agent_input.maxTurns,
    )
    try:
        result = run(agent_input, settings)
    except Exception as err:  # noqa: BLE001 - the contract needs a result line even for a bug; traceback to the log
        traceback.print_exc(file=sys.stderr)
        result = AgentResult(status="error", error=f"farmagent failed: {type(err).__name__}: {err}")
    if result.status == "error":
        logger.error("run %s failed: %s", agent_input.runId, result.error)
    return _emit(out, result, EXIT_OK if result.status == "ok" else EXIT_FAILED)


def _emit(out: TextIO, result: AgentResult, code: int) -> int:
    sys.stderr.flush()
    out.write(result.to_json() + "\n")
    out.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
