"""Test files that share an expensive session fixture run on one xdist worker, so the suite makes it once.

`--dist loadfile` hands whole test files to the workers; a session fixture is made once per worker that runs a
file using it. For the few fixtures that cost seconds of CPU each time (a model server: loading its model, and
the prompt cache the files share), the files using them form one unit of work instead
(`pytest_xdist_make_scheduler`). A test of a file that uses such a fixture without being listed here fails at its
setup, naming the file and where to list it: it would make the fixture again on another worker.
"""

from __future__ import annotations

from typing import Any, Final

import pytest
from xdist.scheduler import LoadScopeScheduling

# fixture name -> the test files (relative to the repository) that use it, run one after the other on one worker
SHARED: Final[dict[str, tuple[str, ...]]] = {
    "local_llm": (
        "tests/agents/test_llm_local_server.py",
        "tests/agents/test_llm_context.py",
        "tests/farmagent/test_farmagent_prompt_prefix.py",
    ),
    "wyoming_server": ("tests/voice/test_wyoming.py", "tests/cli/test_doctor_voice.py"),
}
_GROUP_OF: Final = {path: f"[shared {fixture}]" for fixture, paths in SHARED.items() for path in paths}


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or the group of files sharing its fixture."""
    path = nodeid.split("::", 1)[0]
    return _GROUP_OF.get(path, path)


def misplaced(path: str, fixtures: set[str]) -> str | None:
    """Why a test of `path` (relative to the repository) using `fixtures` may not run, or None when it may."""
    for fixture in sorted(SHARED.keys() & fixtures):
        if path not in SHARED[fixture]:
            return (
                f"it uses the shared fixture {fixture!r}: add {path} to SHARED[{fixture!r}] in tests/shared_workers.py, "
                "so it runs on the worker that has it"
            )
    return None


class SharedFileScheduling(LoadScopeScheduling):
    """`--dist loadfile`, except that the files of one SHARED entry are one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run with `-p no:xdist` has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """The scheduler for `--dist loadfile`; any other mode keeps xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    return SharedFileScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test that uses a shared fixture from a file SHARED does not list for it, before the fixture is made.

    At setup rather than at collection: an error raised while an xdist worker collects shows only as the worker's
    crash, without the message.
    """
    reason = misplaced(item.path.relative_to(item.config.rootpath).as_posix(), set(getattr(item, "fixturenames", ())))
    if reason is not None:
        pytest.fail(reason, pytrace=False)
