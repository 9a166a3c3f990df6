"""The seccomp filter of bwrap runs, tested from inside real runs: what a probe's system calls get back."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import init_data_dir_in_process
from runtime_support import SOCKETS, Sandbox, make_runtime, probe_job, report, settings_for
from seccomp_probe import PROBE_COMMAND

from farmhost.agents.jobs import AgentJob
from farmhost.agents.sandbox.backends import BwrapBackend
from farmhost.agents.sandbox.backends.base import FD_PLACEHOLDER, UNIX_ONLY, RunLimits
from farmhost.agents.sandbox.backends.host_paths import find_python_install_sync
from farmhost.agents.sandbox.identity import AgentIdentity
from farmhost.agents.sandbox.mounts import sandbox_spec
from farmhost.agents.sandbox.seccomp import ARCH_FAMILIES, build_filter_sync
from farmhost.layout import DataLayout

REFUSED = {
    "unshare(CLONE_NEWUSER)": "EPERM",
    "unshare(CLONE_NEWNS)": "EPERM",
    "unshare(CLONE_NEWNET)": "EPERM",
    "clone(CLONE_NEWUSER)": "EPERM",
    "clone(CLONE_NEWNET)": "EPERM",
    "clone3(CLONE_NEWUSER)": "ENOSYS",  # so that glibc falls back to clone, whose flags the filter can read
    "setns": "EPERM",
    "ptrace(PTRACE_ATTACH, 1)": "EPERM",
    "ptrace(PTRACE_TRACEME)": "EPERM",
    "process_vm_readv": "EPERM",
    "keyctl(KEYCTL_GET_KEYRING_ID)": "EPERM",
    "bpf(BPF_MAP_CREATE)": "EPERM",
    "perf_event_open": "EPERM",
    "mount(tmpfs)": "EPERM",
    "io_uring_setup": "EPERM",
    "userfaultfd": "EPERM",
    "personality(READ_IMPLIES_EXEC)": "EPERM",
    "socket(AF_UNIX | 1 << 32)": "EAFNOSUPPORT",
}
# The same call through the other ABIs of the kernel (x86_64 only: an aarch64 process cannot make AArch32 calls).
OTHER_ABIS = {"x32 unshare(CLONE_NEWUSER)": "EPERM", "i386 unshare(CLONE_NEWUSER)": "EPERM"}
# What goes through without the filter; ptrace(PTRACE_ATTACH, 1) is not tried there: it stops bwrap's pid 1.
OPEN_WITHOUT_FILTER = (
    "socket(AF_UNIX | 1 << 32)",
    "unshare(CLONE_NEWUSER)",
    "clone(CLONE_NEWUSER)",
    "ptrace(PTRACE_TRACEME)",
    "keyctl(KEYCTL_GET_KEYRING_ID)",
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def probe(root: Path, attempts: list[str] | None, **settings: str) -> dict[str, Any]:
    runtime = make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="bwrap", **settings), command=PROBE_COMMAND)
    await runtime.start()
    try:
        assert isinstance(runtime.backend, BwrapBackend)
        outcome = await runtime.submit(AgentJob(folder="field", prompt=json.dumps(attempts), scheduled=True))
    finally:
        await runtime.stop()
    assert outcome.status == "ok" and outcome.answer is not None, outcome.log_path.read_text()
    return json.loads(outcome.answer)  # type: ignore[no-any-return]


async def test_the_filter_refuses_namespaces_tracing_and_kernel_interfaces(root: Path) -> None:
    seen = await probe(root, None)
    expected = {**REFUSED, **(OTHER_ABIS if seen["machine"] == "x86_64" else {})}
    assert seen["attempts"] == expected
    assert seen["unshare -r"] == {"exit": 1, "stderr": "unshare: unshare failed: Operation not permitted"}
    assert seen["status"] == {"Seccomp": "2", "Seccomp_filters": "1"}
    assert set(seen["fds"]) == {"0", "1", "2"}  # the descriptor bwrap read the filter from is not left open


async def test_ordinary_work_still_works_under_the_filter(root: Path) -> None:
    seen = await probe(root, [])
    assert seen["work"] == {
        "file": "written in the sandbox",
        "exec": "child ran\n",
        "thread": True,  # threads start through clone3 -> ENOSYS -> clone
        "personality(PER_LINUX)": "ok",
        "proxy": "HTTP/1.1 503 Service Unavailable",  # the LLM proxy's socket answers (no LLM configured here)
    }
    assert (root / "groups" / "field" / "seccomp-probe.txt").read_text() == "written in the sandbox"


async def test_without_the_filter_the_same_calls_go_through(root: Path) -> None:
    """FARMHOST_SANDBOX_SECCOMP=off: proof that the refusals above come from the filter, not from bwrap alone."""
    seen = await probe(root, list(OPEN_WITHOUT_FILTER), FARMHOST_SANDBOX_SECCOMP="off")
    assert seen["attempts"] == dict.fromkeys(OPEN_WITHOUT_FILTER, "ok")
    assert seen["status"] == {"Seccomp": "0", "Seccomp_filters": "0"}


def _mount_point(path: Path) -> Path:
    """The directory `path`'s file system is mounted on."""
    while path.parent != path and os.stat(path.parent).st_dev == os.stat(path).st_dev:
        path = path.parent
    return path


async def test_mountinfo_shows_only_the_paths_of_the_runs_own_mounts(root: Path) -> None:
    seen = await probe(root, [])
    layout = DataLayout(root)
    shown = {target: source for source, target, _ in seen["mountinfo"]}
    options = {target: set(flags.split(",")) for _, target, flags in seen["mountinfo"]}
    for target, host in [
        ("/workspace/group", layout.workspace("field")),
        ("/workspace/ipc", layout.group_ipc("field")),
        ("/workspace/global", layout.workspace("global")),
        ("/workspace/farm-state", layout.farm_state),
        ("/workspace/run", layout.group_run("field")),
    ]:
        assert str(host).endswith(shown[target])  # the source's path from the root of the file system it is on
        assert {"nosuid", "nodev"} <= options[target], (target, options[target])  # bwrap's binds are both
    hosts = {s for s, t, _ in seen["mountinfo"] if s != t and t.startswith("/workspace")}
    # Sources are paths from the root of their file system (the data dir may be on a tmpfs of its own).
    in_its_fs = Path("/") / root.relative_to(_mount_point(root))
    assert all(Path(s).is_relative_to(in_its_fs) for s in hosts), hosts  # nothing of another group or of the host
    assert not any("main" in Path(s).parts for s in hosts)


async def test_a_run_creates_unix_sockets_and_no_other_family(root: Path, sandbox: Sandbox) -> None:
    """An agent of kind command, in bwrap and in a container: every family but AF_UNIX gets EAFNOSUPPORT."""
    runtime = sandbox.runtime(sandbox.settings(root))
    await runtime.start()
    try:
        seen = report(await runtime.submit(probe_job("field", sockets=SOCKETS)))
    finally:
        await runtime.stop()
    refused = dict.fromkeys(SOCKETS, "error:EAFNOSUPPORT")
    assert seen["sockets"] == {**refused, "socket(AF_UNIX)": "ok", "socketpair(AF_UNIX)": "ok"}


async def test_without_the_filter_other_families_open(root: Path) -> None:
    """FARMHOST_SANDBOX_SECCOMP=off: the refusals above are the filter's (the network namespace alone lets them be)."""
    runtime = make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_SANDBOX_SECCOMP="off"))
    await runtime.start()
    try:
        seen = report(await runtime.submit(probe_job("field", sockets=SOCKETS)))
    finally:
        await runtime.stop()
    assert {call: seen["sockets"][call] for call in ("socket(AF_INET)", "socket(AF_INET6)", "socket(AF_NETLINK)")} == {
        "socket(AF_INET)": "ok",
        "socket(AF_INET6)": "ok",
        "socket(AF_NETLINK)": "ok",
    }, seen["sockets"]


def test_the_bwrap_command_carries_the_filter(root: Path) -> None:
    built = build_filter_sync()
    assert built.arches == ARCH_FAMILIES[{"x86_64": "x86_64", "aarch64": "aarch64"}[platform.machine()]]
    assert built.unknown == () and {"ptrace", "unshare", "clone", "clone3", "io_uring_setup"} <= set(built.denied)
    identity = AgentIdentity(uid=65534, gid=65534, switch=True)
    python = find_python_install_sync(None)
    backend = BwrapBackend(
        bwrap="/usr/bin/bwrap",
        python=python,
        system=(),
        identity=identity,
        setpriv="/usr/bin/setpriv",
        seccomp={UNIX_ONLY: built.bpf},
    )
    limits = RunLimits(timeout_seconds=30, memory_mb=512, pids=64, max_turns=4)
    spec = sandbox_spec(
        DataLayout(root), folder="field", run_id="r-1", is_main=False, limits=limits, timezone="UTC", argv=None
    )
    plan = backend.plan(spec)
    (fd_arg,) = plan.fd_args
    assert plan.argv[fd_arg.index - 1 : fd_arg.index + 1] == ("--seccomp", FD_PLACEHOLDER)
    assert fd_arg.data == built.bpf and len(built.bpf) % 8 == 0  # whole sock_filter instructions
    assert plan.argv.index("--seccomp") < plan.argv.index("--")


async def test_runs_stop_when_the_filter_cannot_be_built(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # as on a host without the binding: import fails
    runtime = make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="bwrap"), command=PROBE_COMMAND)
    await runtime.start()
    try:
        assert runtime.backend is None
        outcome = await runtime.submit(AgentJob(folder="field", prompt="[]", scheduled=True))
    finally:
        await runtime.stop()
    assert outcome.status == "error" and outcome.error is not None
    assert outcome.error.startswith("agent runs are off: refusing to run agents without their seccomp filter:")
    assert "FARMHOST_SANDBOX_SECCOMP=off" in outcome.error
