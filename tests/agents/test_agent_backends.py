"""The command each backend builds: exact docker/podman argv, bwrap's mounts, process's environment; no secrets."""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from farmhost_testing import init_data_dir_in_process
from runtime_support import SECRETS, make_runtime, probe_job, report, settings_for

from farmhost.agents.kinds import IMAGE_OPENCODE_BIN, agent_kind
from farmhost.agents.sandbox.backends import (
    BwrapBackend,
    DockerBackend,
    LaunchPlan,
    PodmanBackend,
    ProcessBackend,
    RunLimits,
    SandboxError,
    SandboxSpec,
    cleanup_orphans,
    create_backend,
    ensure_no_secrets,
    for_identity,
    group_ids,
    write_engine_profiles_sync,
)
from farmhost.agents.sandbox.backends.base import UNIX_AND_LOOPBACK_INET, UNIX_ONLY
from farmhost.agents.sandbox.backends.docker import cli_env
from farmhost.agents.sandbox.backends.host_paths import find_python_install_sync, minimal_paths
from farmhost.agents.sandbox.backends.share import LAUNCHER
from farmhost.agents.sandbox.identity import AgentIdentity
from farmhost.agents.sandbox.mounts import sandbox_spec
from farmhost.agents.sandbox.seccomp import engine_profile
from farmhost.config import build_config
from farmhost.layout import REPO_ROOT, DataLayout

LIMITS = RunLimits(timeout_seconds=30, memory_mb=512, pids=64, max_turns=4)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


def spec(root: Path, folder: str, *, is_main: bool, argv: tuple[str, ...] | None = None) -> SandboxSpec:
    return sandbox_spec(
        DataLayout(root), folder=folder, run_id="r-1", is_main=is_main, limits=LIMITS, timezone="Europe/Lisbon",
        argv=argv,
    )  # fmt: skip


def expected_docker(engine: str, root: Path, folder: str, *, is_main: bool, extra: list[str]) -> list[str]:
    rw, ro = (":nosuid,nodev", ":ro,nosuid,nodev") if engine == "podman" else ("", ":ro")
    argv = [
        engine, "run", "-i", "--init",
        "--name", f"farmhost-{folder}-r-1",
        "--network", "none",
        "--user", "1000:1001",
        "--memory", "512m", "--memory-swap", "512m",
        "--pids-limit", "64",
        "--cpus", "1",
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--read-only",
        "--tmpfs", "/tmp:rw,nosuid,nodev,size=256m,mode=1777",
        "--shm-size", "256m",
        "--workdir", "/workspace/group",
        "--label", f"farmhost.group={folder}",
        "--label", "farmhost.run=r-1",
        "--label", f"farmhost.data={root}",
        *extra,
        "-v", f"{root}/groups/{folder}:/workspace/group{rw}",
        "-v", f"{root}/ipc/{folder}:/workspace/ipc{rw}",
        "-v", f"{root}/groups/global:/workspace/global{ro}",
        "-v", f"{root}/farm-state:/workspace/farm-state{ro}",
        "-v", f"{root}/run/{folder}:/workspace/run{ro}",
    ]  # fmt: skip
    if is_main:
        argv += ["-v", f"{root}/dashboards:/workspace/dashboard{rw}"]
    env = [
        *(["FARMAGENT_DASHBOARD_DIR=/workspace/dashboard"] if is_main else []),
        "FARMAGENT_FARM_STATE_DIR=/workspace/farm-state",
        "FARMAGENT_GLOBAL_DIR=/workspace/global",
        "FARMAGENT_GROUP_DIR=/workspace/group",
        "FARMAGENT_IPC_DIR=/workspace/ipc",
        "FARMAGENT_LLM_SOCKET=/workspace/run/llm.sock",
        "HOME=/workspace/group",
        "LANG=C.UTF-8",
        "PYTHONDONTWRITEBYTECODE=1",
        "TZ=Europe/Lisbon",
    ]
    for item in env:
        argv += ["-e", item]
    return [*argv, "--entrypoint", "python", "farmhost-agent:test", "-I", "-m", "farmagent.run"]


def assert_no_secret(plan: LaunchPlan) -> None:
    everything = "\n".join([*plan.argv, *plan.env.keys(), *plan.env.values(), *(plan.kill_argv or ())])
    for value in SECRETS.values():
        assert value not in everything


@pytest.mark.parametrize(("folder", "is_main"), [("main", True), ("field", False)])
def test_docker_command(root: Path, folder: str, is_main: bool) -> None:
    environ = {"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///run/docker.sock", "HOME": "/home/farm", **SECRETS}
    backend = DockerBackend(
        image="farmhost-agent:test", user=(1000, 1001), data_root=str(root), environ=cli_env(environ)
    )
    plan = backend.plan(spec(root, folder, is_main=is_main))
    assert list(plan.argv) == expected_docker("docker", root, folder, is_main=is_main, extra=[])
    assert plan.env == {"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///run/docker.sock", "HOME": "/home/farm"}
    assert plan.kill_argv == plan.remove_argv == ("docker", "rm", "-f", f"farmhost-{folder}-r-1")
    # Kept after it ends (no --rm) until the engine has said whether the kernel killed a process of it for memory.
    assert plan.oom_argv == ("docker", "inspect", "--format", "{{.State.OOMKilled}}", f"farmhost-{folder}-r-1")
    assert plan.rlimits == ()  # the engine's cgroup limits apply instead
    assert_no_secret(plan)


@pytest.mark.parametrize("rootless", [True, False])
def test_podman_command(root: Path, rootless: bool) -> None:
    backend = PodmanBackend(image="farmhost-agent:test", user=(1000, 1001), data_root=str(root), rootless=rootless)
    plan = backend.plan(spec(root, "field", is_main=False))
    extra = ["--userns", "keep-id"] if rootless else []
    assert list(plan.argv) == expected_docker("podman", root, "field", is_main=False, extra=extra)
    assert plan.kill_argv == plan.remove_argv == ("podman", "rm", "-f", "farmhost-field-r-1")
    assert plan.oom_argv == ("podman", "inspect", "--format", "{{.State.OOMKilled}}", "farmhost-field-r-1")


def test_docker_refuses_a_path_it_cannot_mount(tmp_path: Path) -> None:
    root = init_data_dir_in_process(tmp_path / "odd:name")
    backend = DockerBackend(image="i", user=(1000, 1000), data_root=str(root))
    with pytest.raises(SandboxError, match="contains ':' or ','"):
        backend.plan(spec(root, "field", is_main=False))


def test_a_command_override_replaces_the_runner(root: Path) -> None:
    backend = DockerBackend(image="i", user=(1000, 1000), data_root=str(root))
    plan = backend.plan(spec(root, "field", is_main=False, argv=("python", "-c", "print(1)")))
    assert plan.argv[-5:] == ("--entrypoint", "python", "i", "-c", "print(1)")


def test_the_engine_cli_gets_only_what_locates_the_engine() -> None:
    assert cli_env({**SECRETS, "XDG_RUNTIME_DIR": "/run/user/1000", "LD_PRELOAD": "x"}) == {
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "PATH": os.defpath,
    }


async def test_no_backend_carries_a_secret(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)  # the daemon's own environment holds them (systemd EnvironmentFile=)
    settings = build_config(settings_for(root, **SECRETS)).agents.sandbox
    for runtime in ("bwrap", "process"):
        backend = await create_backend(replace(settings, runtime=runtime))
        ids = group_ids(settings, backend)
        for folder, is_main in (("main", True), ("field", False)):
            plan = for_identity(backend, await ids.identity(folder)).plan(spec(root, folder, is_main=is_main))
            ensure_no_secrets(plan, SECRETS.values())
            assert_no_secret(plan)


def test_a_plan_with_a_secret_is_refused(root: Path) -> None:
    plan = ProcessBackend(python=Path(sys.executable)).plan(spec(root, "field", is_main=False))
    leaky = LaunchPlan(argv=plan.argv, env={**plan.env, "SOMETHING": f"x{SECRETS['HA_TOKEN']}x"})
    with pytest.raises(SandboxError, match="environment variable SOMETHING holds a secret") as caught:
        ensure_no_secrets(leaky, SECRETS.values())
    assert SECRETS["HA_TOKEN"] not in str(caught.value)
    leaky = LaunchPlan(argv=(*plan.argv, SECRETS["FARMHOST_LLM_API_KEY"]), env=plan.env)
    with pytest.raises(SandboxError, match=f"argument {len(plan.argv)} holds a secret"):
        ensure_no_secrets(leaky, SECRETS.values())


async def test_the_process_agent_sees_no_secret(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    runtime = make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process", **SECRETS))
    await runtime.start()
    try:
        seen = report(await runtime.submit(probe_job("field")))
    finally:
        await runtime.stop()
    assert set(seen["env"]) == {
        "FARMAGENT_IPC_DIR", "FARMAGENT_GROUP_DIR", "FARMAGENT_GLOBAL_DIR", "FARMAGENT_FARM_STATE_DIR",
        "FARMAGENT_LLM_SOCKET", "TZ", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PATH",
    }  # fmt: skip
    assert not any(secret in str(seen["env"]) for secret in SECRETS.values())


AS_USER = AgentIdentity(uid=1000, gid=1000, switch=False)  # a daemon that is not root: runs keep its uid
AS_ROOT = AgentIdentity(uid=65534, gid=65534, switch=True)  # a root daemon: runs drop to nobody


def test_bwrap_mounts_only_the_run_and_the_interpreter(root: Path) -> None:
    python = find_python_install_sync(None)
    backend = BwrapBackend(
        bwrap="/usr/bin/bwrap", python=python, system=(), identity=AS_USER, setpriv=None, seccomp=None,
        inotify_share=7,
    )  # fmt: skip
    plan = backend.plan(spec(root, "main", is_main=True))
    argv = list(plan.argv)
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    assert argv[:17] == [
        "/usr/bin/bwrap", *namespaces, "--unshare-user", "--cap-drop", "ALL", "--cap-add", "CAP_SYS_RESOURCE",
        "--die-with-parent", "--new-session", "--clearenv", "--hostname", "farmagent", "--setenv",
    ]  # fmt: skip
    binds = [(arg, argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg in ("--bind", "--ro-bind")]
    layout = DataLayout(root)
    assert binds == [
        *(("--ro-bind", str(p), str(p)) for p in python.ro_paths),
        ("--bind", str(layout.workspace("main")), "/workspace/group"),
        ("--bind", str(layout.group_ipc("main")), "/workspace/ipc"),
        ("--ro-bind", str(layout.workspace("global")), "/workspace/global"),
        ("--ro-bind", str(layout.farm_state), "/workspace/farm-state"),
        ("--ro-bind", str(layout.group_run("main")), "/workspace/run"),
        ("--bind", str(layout.dashboards), "/workspace/dashboard"),
    ]
    tmpfs = [tuple(argv[i - 4 : i + 2]) for i, arg in enumerate(argv) if arg == "--tmpfs"]
    size = str(256 * 2**20)
    assert tmpfs == [("--perms", "1777", "--size", size, "--tmpfs", path) for path in ("/tmp", "/dev/shm")]
    # the launcher sets the run's share of the daemon uid's limits inside its user namespace, then the agent runs
    launcher = [str(python.executable), "-I", "-c", LAUNCHER, "7", "64"]
    assert argv[-15:] == [
        "--remount-ro", "/", "--chdir", "/workspace/group", "--", *launcher, str(python.executable), "-I", "-m",
        "farmagent.run",
    ]  # fmt: skip
    assert resource.RLIMIT_NPROC not in dict(plan.rlimits), "set before bwrap, it would cap the daemon's whole uid"
    assert plan.env == {"PATH": os.defpath}  # bwrap's helper keeps its environment, readable in /proc/1/environ
    assert plan.signal_leader is False


def test_bwrap_under_root_drops_to_the_agent_uid_before_the_agent_starts(root: Path) -> None:
    python = find_python_install_sync(None)
    backend = BwrapBackend(
        bwrap="/usr/bin/bwrap", python=python, system=(), identity=AS_ROOT, setpriv="/usr/bin/sp", seccomp=None
    )
    plan = backend.plan(spec(root, "field", is_main=False))
    argv = list(plan.argv)
    assert "--unshare-user" not in argv, "uid 0 in a namespace root made is host root for files"
    assert dict(plan.rlimits)[resource.RLIMIT_NPROC] == 64, "the group's own uid: RLIMIT_NPROC is the group's"
    caps = [argv[i + 1] for i, arg in enumerate(argv) if arg in ("--cap-add", "--cap-drop")]
    assert caps == ["ALL", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]
    end = argv.index("--remount-ro") + 5
    assert argv[end : end + 8] == [
        "/usr/bin/sp", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
        "--no-new-privs", "--",
    ]  # fmt: skip
    assert argv[end + 8 :] == [str(python.executable), "-I", "-m", "farmagent.run"]
    without = BwrapBackend(
        bwrap="/usr/bin/bwrap", python=python, system=(), identity=AS_ROOT, setpriv=None, seccomp=None
    )
    with pytest.raises(SandboxError, match="setpriv"):
        without.plan(spec(root, "field", is_main=False))


def test_the_interpreter_paths_are_its_prefixes_and_farmagent_only() -> None:
    python = find_python_install_sync(None)
    assert python.farmagent is not None and python.farmagent.name == "farmagent"
    assert Path(sys.base_prefix) in python.ro_paths or any(p in Path(sys.base_prefix).parents for p in python.ro_paths)
    for path in python.ro_paths:
        assert path not in (Path("/"), Path("/etc"), Path("/root"), REPO_ROOT), path
        assert not (REPO_ROOT.is_relative_to(path)), f"{path} would expose the whole repository"


def test_minimal_paths_drops_nested_and_repeated_paths() -> None:
    paths = [Path("/opt/py"), Path("/opt/py/lib"), Path("/srv/venv"), Path("/opt/py"), Path("/opt/python")]
    assert minimal_paths(paths) == (Path("/opt/py"), Path("/opt/python"), Path("/srv/venv"))


def test_a_missing_interpreter_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="cannot run the agent interpreter .* \\(FARMHOST_AGENT_PYTHON\\)"):
        find_python_install_sync(tmp_path / "python")


def test_the_interpreter_is_asked_once_per_process_and_a_failure_again(tmp_path: Path) -> None:
    """Each daemon start asks its agent interpreter where it lives; the answer is kept, a failure is not."""
    asked = tmp_path / "asked"
    python = tmp_path / "python"  # the real interpreter behind a script that counts its runs
    python.write_text(f'#!/bin/sh\necho run >> {asked}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    first = find_python_install_sync(python)
    assert find_python_install_sync(python) == first
    assert asked.read_text().splitlines() == ["run"]
    assert first.executable == python and first.farmagent is not None
    broken = tmp_path / "broken"
    broken.write_text(f"#!/bin/sh\necho run >> {asked}\nexit 3\n")
    broken.chmod(0o755)
    for _ in range(2):
        with pytest.raises(SandboxError, match="did not describe itself"):
            find_python_install_sync(broken)
    assert asked.read_text().splitlines() == ["run"] * 3


def test_process_points_the_agent_at_host_paths(tmp_path: Path) -> None:
    root = init_data_dir_in_process(tmp_path / ("long-" * 20) / "data")
    plan = ProcessBackend(python=Path(sys.executable)).plan(spec(root, "field", is_main=False))
    layout = DataLayout(root)
    assert plan.cwd == layout.workspace("field")
    assert plan.env["FARMAGENT_IPC_DIR"] == str(layout.group_ipc("field"))
    assert plan.env["FARMAGENT_GROUP_DIR"] == plan.env["HOME"] == str(layout.workspace("field"))
    assert plan.env["FARMAGENT_GLOBAL_DIR"] == str(layout.workspace("global"))
    socket_path = plan.env["FARMAGENT_LLM_SOCKET"]
    assert len(str(layout.group_run("field") / "llm.sock")) > 107
    assert not socket_path.startswith("/") and len(socket_path) < 107  # relative: the absolute one is too long
    assert os.path.normpath(layout.workspace("field") / socket_path) == str(layout.group_run("field") / "llm.sock")
    assert plan.argv == (sys.executable, "-I", "-m", "farmagent.run")
    assert plan.signal_leader is True


def write_engine(path: Path, log: Path, listing: str) -> str:
    """A stand-in container CLI (no engine runs here): prints `listing` for `ps`, records every call."""
    path.write_text(f'#!/bin/sh\necho "$@" >> {log}\nif [ "$1" = ps ]; then printf \'{listing}\'; fi\n')
    path.chmod(0o755)
    return str(path)


async def test_orphans_of_this_data_dir_are_removed_at_start(root: Path, tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    engine = write_engine(tmp_path / "docker", log, "abc123\\ndef456\\n")
    backend = DockerBackend(image="i", user=(1000, 1000), data_root=str(root), engine=engine)
    assert await cleanup_orphans(backend) == 2
    assert log.read_text().splitlines() == [
        f"ps -aq --filter label=farmhost.run --filter label=farmhost.data={root}",
        "rm -f abc123 def456",
    ]


async def test_no_orphans_and_no_engine_are_quiet(root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "engine.log"
    engine = write_engine(tmp_path / "docker", log, "")
    assert await cleanup_orphans(DockerBackend(image="i", user=(1, 1), data_root=str(root), engine=engine)) == 0
    assert log.read_text().splitlines() == [f"ps -aq --filter label=farmhost.run --filter label=farmhost.data={root}"]
    missing = DockerBackend(image="i", user=(1, 1), data_root=str(root), engine=str(tmp_path / "none"))
    assert await cleanup_orphans(missing) == 0
    assert "cannot clean up old agent containers" in caplog.text


@pytest.mark.parametrize("kind", ["farmagent", "opencode", "command"])
def test_docker_command_for_each_agent_kind(root: Path, tmp_path: Path, kind: str) -> None:
    binary = tmp_path / "opencode-linux-x64" / "bin" / "opencode"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"\x7fELF")
    command = ("/workspace/group/agent", "--fast") if kind == "command" else None
    chosen = agent_kind(kind, command, binary, in_image=True)  # type: ignore[arg-type]
    layout = DataLayout(root)
    run = sandbox_spec(layout, folder="field", run_id="r-1", is_main=False, limits=LIMITS, timezone="UTC", kind=chosen)
    argv = list(DockerBackend(image="farmagent:1", user=(1000, 1001), data_root=str(root)).plan(run).argv)
    tail = [argv[argv.index("--entrypoint") + 1], *argv[argv.index("farmagent:1") + 1 :]]
    volumes = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-v"]
    assert not any(str(binary.parent) in volume for volume in volumes), volumes  # nothing of the host's OpenCode
    if kind == "farmagent":
        assert tail == ["python", "-I", "-m", "farmagent.run"]
    elif kind == "opencode":
        assert tail == ["python", "-I", "-m", "farmagent.opencode_run"]
        # The image's own OpenCode (container/Dockerfile installs it there), even with FARMHOST_OPENCODE_BIN set.
        assert f"FARMAGENT_OPENCODE={IMAGE_OPENCODE_BIN}" in argv and IMAGE_OPENCODE_BIN == "/opt/opencode/bin/opencode"
    else:
        assert tail == ["/workspace/group/agent", "--fast"]
    assert "--network" in argv and argv[argv.index("--network") + 1] == "none"  # every kind: the same sandbox


@pytest.mark.parametrize("kind", ["farmagent", "opencode", "command"])
def test_each_kind_gets_the_seccomp_rules_of_its_socket_families(root: Path, tmp_path: Path, kind: str) -> None:
    """docker: farmhost's profile file for the kind's families; bwrap: the filter built for them."""
    command = ("/workspace/group/agent",) if kind == "command" else None
    chosen = agent_kind(kind, command, tmp_path / "oc", in_image=True)  # type: ignore[arg-type]
    run = sandbox_spec(DataLayout(root), folder="field", run_id="r-1", is_main=False, limits=LIMITS, timezone="UTC",
                       kind=chosen)  # fmt: skip
    wanted = UNIX_AND_LOOPBACK_INET if kind == "opencode" else UNIX_ONLY
    assert run.socket_families == wanted
    profiles = write_engine_profiles_sync(DataLayout(root))
    backend = DockerBackend(image="i", user=(1000, 1001), data_root=str(root), seccomp_profiles=profiles)
    argv = list(backend.plan(run).argv)
    assert argv[argv.index("--security-opt", argv.index("no-new-privileges")) + 1] == f"seccomp={profiles[wanted]}"
    profile = json.loads(Path(profiles[wanted]).read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW" and profile["syscalls"] == engine_profile(wanted)["syscalls"]
    socket_rules = [rule for rule in profile["syscalls"] if rule["names"] == ["socket"]]
    assert {rule["errnoRet"] for rule in socket_rules} == {errno.EAFNOSUPPORT}


def test_bwrap_in_a_container_binds_its_proc_and_leaves_the_inotify_share_alone(root: Path) -> None:
    # FARMHOST_SANDBOX_PROC=container (the Home Assistant add-on): the kernel refuses a new /proc under a container's
    # masked paths, and the container's /proc/sys is read-only (tests/deploy/test_addon_container.py runs it there).
    python = find_python_install_sync(None)
    backend = BwrapBackend(
        bwrap="/usr/bin/bwrap", python=python, system=(), identity=AS_USER, setpriv=None, seccomp=None,
        inotify_share=7, proc="container",
    )  # fmt: skip
    argv = list(backend.plan(spec(root, "main", is_main=True)).argv)
    assert "--proc" not in argv
    at = argv.index("/proc")
    assert argv[at - 1 : at + 2] == ["--ro-bind", "/proc", "/proc"], argv[at - 1 : at + 2]
    launcher = [str(python.executable), "-I", "-c", LAUNCHER, "0", "64"]
    assert argv[-10:-4] == launcher, argv[-10:]
