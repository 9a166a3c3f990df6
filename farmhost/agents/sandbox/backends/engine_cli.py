"""One short command of a container engine's CLI (inspect, rm, ps) with a deadline: its output, or None, logged.

Engine commands run beside a run (removing a killed container, asking whether the memory limit ended it) and at
start (removing containers an earlier daemon left); none of them may hang the daemon or raise into it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Final

logger = logging.getLogger(__name__)

# `docker rm -f` of a stuck container answers in seconds; a wedged engine must hold neither a run nor the start.
ENGINE_TIMEOUT: Final = 30.0


async def engine_command(
    argv: tuple[str, ...],
    *,
    doing: str,
    env: Mapping[str, str] | None = None,
    level: int = logging.ERROR,
    refusal_logged: bool = True,
) -> str | None:
    """Run `argv` within ENGINE_TIMEOUT; its stdout, or None when it cannot start, hangs or exits non-zero.

    Each failure is logged at `level` as "cannot <doing> (<argv>): <why>", a refusal (non-zero exit) only when
    `refusal_logged` (for a question whose "no" is an answer, such as inspecting a container already removed).
    """
    command = " ".join(argv)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )  # fmt: skip
    except OSError as error:
        logger.log(level, "cannot %s (%s): %s", doing, command, error)
        return None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), ENGINE_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        logger.log(level, "cannot %s (%s): no answer within %g s", doing, command, ENGINE_TIMEOUT)
        return None
    if proc.returncode != 0:
        if refusal_logged:
            logger.log(level, "cannot %s (%s): %s", doing, command, err.decode(errors="replace").strip())
        return None
    return out.decode(errors="replace")
