"""The seccomp filter of bwrap runs: which system calls an agent is refused, compiled to BPF by libseccomp.

The filter allows by default and refuses a list of calls with EPERM (ENOSYS for clone3), so a program that tries one
fails cleanly instead of being killed; socket() and socketpair() fail with EAFNOSUPPORT for every family the run's
kind does not need (SandboxSpec.socket_families: Unix sockets, and loopback IPv4 for OpenCode's bridge). The list follows Flatpak's blocklist and the calls Docker's default profile
leaves out; docs/security.md says why each group is there. libseccomp (through pyseccomp, a ctypes binding) turns
the rules into a BPF program for the host's architecture and its 32-bit (or 64-bit) sibling ABIs; bwrap loads the
program into the sandbox (`--seccomp FD`) right before it starts the agent.
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import socket
from dataclasses import dataclass
from typing import Any, Final, Literal

from farmhost.agents.sandbox.backends.base import SOCKET_FAMILY_SETS, UNIX_ONLY
from farmhost.errors import FarmhostError

logger = logging.getLogger(__name__)

SeccompMode = Literal["required", "off"]

# Calls refused outright, whatever their arguments.
DENIED: Final = (
    # namespaces: a nested user namespace hands the agent every capability inside it (and the kernel's
    # namespace-only code paths, a large attack surface); setns joins one it got hold of
    "setns",
    # other processes: ptrace of bwrap's pid 1 holds the run until the wall-time kill; the rest read or change
    # another process's memory or descriptors
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    "move_pages",
    "migrate_pages",
    # kernel keyrings, BPF programs and perf counters: shared kernel state and a history of privilege escalations
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # the file system tree: mounts (old and new API), root changes, handles that bypass path checks
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "name_to_handle_at",
    "open_by_handle_at",
    "lookup_dcookie",
    "quotactl",
    "quotactl_fd",
    "acct",
    "swapon",
    "swapoff",
    # hard links: a second name for a file lets a run write into a file of a directory it leaves unchanged, which
    # the host's journal of the workspace would not see (docs/security.md#run-set-up-and-clean-up-cost-what-changed);
    # programs that try one (git's objects) fall back to a rename or a copy on EPERM
    "link",
    "linkat",
    # the machine: reboot, kernels and modules, the clock, the kernel log, raw I/O ports, terminals
    "reboot",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "clock_settime",
    "settimeofday",
    "stime",
    "syslog",
    "iopl",
    "ioperm",
    "vhangup",
    "sethostname",
    "setdomainname",
    # obsolete or emulation calls nothing in an agent needs
    "uselib",
    "_sysctl",
    "sysfs",
    "ustat",
    "nfsservctl",
    "modify_ldt",
    "vm86",
    "vm86old",
)
# The calls that create sockets; their first argument is the family (socket_rules).
SOCKET_CALLS: Final = ("socket", "socketpair")
# Namespace flags of clone/unshare. CLONE_NEWTIME (0x80) shares its bit with clone's exit signal, so it is only
# checked for unshare (clone cannot ask for it).
CLONE_NEWNS: Final = 0x00020000
CLONE_NEWCGROUP: Final = 0x02000000
CLONE_NEWUTS: Final = 0x04000000
CLONE_NEWIPC: Final = 0x08000000
CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWPID: Final = 0x20000000
CLONE_NEWNET: Final = 0x40000000
CLONE_NEWTIME: Final = 0x00000080
CLONE_NAMESPACES: Final = (
    CLONE_NEWNS,
    CLONE_NEWCGROUP,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
)
UNSHARE_NAMESPACES: Final = (*CLONE_NAMESPACES, CLONE_NEWTIME)
# Terminal ioctls that type into, or take over, the terminal outside (bwrap's --new-session already detaches it).
TIOCSTI: Final = 0x5412
TIOCLINUX: Final = 0x541C
# Only PER_LINUX: another execution domain (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, ...) weakens the agent's own
# memory protections, and a query (0xffffffff) is refused too, as Flatpak does.
PER_LINUX: Final = 0
# The ABIs one kernel runs side by side: a filter for one of them only would let a program step around it (an
# `int 0x80` from a 64-bit x86 process is an i386 call with i386 numbers).
ARCH_FAMILIES: Final = {
    "x86_64": ("x86_64", "x86", "x32"),
    "x86": ("x86", "x86_64", "x32"),
    "aarch64": ("aarch64", "arm"),
    "arm": ("arm", "aarch64"),
}
_ARCH_ATTRS: Final = {"x86_64": "X86_64", "x86": "X86", "x32": "X32", "aarch64": "AARCH64", "arm": "ARM"}


class SeccompUnavailable(FarmhostError):
    """The filter cannot be built here (libseccomp or its binding missing, an unknown architecture)."""


@dataclass(frozen=True, kw_only=True)
class SeccompFilter:
    """A compiled filter: the BPF program bwrap loads and what it covers."""

    bpf: bytes
    arches: tuple[str, ...]
    denied: tuple[str, ...]  # every call with a rule, the conditional ones (clone, unshare, ioctl, ...) included
    unknown: tuple[str, ...]  # names this libseccomp does not know (older than the call); not in the filter
    socket_families: tuple[int, ...] = UNIX_ONLY  # the only families socket()/socketpair() may create

    def describe(self) -> str:
        """One line for logs and the doctor: what is refused, on which ABIs."""
        refused = [name for name in self.denied if name not in SOCKET_CALLS]
        line = f"{len(refused)} system calls refused (EPERM, clone3 ENOSYS) on {'+'.join(self.arches)}"
        families = "/".join(_family_name(family) for family in self.socket_families)
        line += f"; sockets of families other than {families} EAFNOSUPPORT"
        if self.unknown:
            line += f"; unknown to this libseccomp, not filtered: {', '.join(self.unknown)}"
        return line


Test = Literal["masked_eq", "ne", "eq", "lt", "gt"]


@dataclass(frozen=True)
class Rule:
    """One rule of the filter: `name` fails with `error`, for every call or only when `arg` matches."""

    name: str
    error: int = errno.EPERM
    arg: tuple[int, Test, int, int] | None = None  # (index, test, mask or value, datum)


RULES: Final = (
    *(Rule(name) for name in DENIED),
    # glibc starts threads and processes with clone3 and falls back to clone only on ENOSYS; clone3's flags sit in
    # memory that seccomp cannot read, so clone3 is refused as absent and clone's flags are checked instead.
    Rule("clone3", errno.ENOSYS),
    *(Rule("clone", arg=(0, "masked_eq", flag, flag)) for flag in CLONE_NAMESPACES),
    *(Rule("unshare", arg=(0, "masked_eq", flag, flag)) for flag in UNSHARE_NAMESPACES),
    *(Rule("ioctl", arg=(1, "masked_eq", 0xFFFFFFFF, request)) for request in (TIOCSTI, TIOCLINUX)),
    Rule("personality", arg=(0, "ne", PER_LINUX, 0)),
)


def socket_rules(families: tuple[int, ...]) -> tuple[Rule, ...]:
    """socket() and socketpair() refused with EAFNOSUPPORT unless their family (first argument) is in `families`.

    libseccomp takes one comparison per argument and rule, so "not one of these" is written as the values around
    them: below the lowest, above the highest, and each one in between. The comparisons are on all 64 bits, so a
    family with high bits set is refused too (the kernel reads an int). On i386, libseccomp refuses socketcall's
    SOCKET and SOCKETPAIR whole, since their arguments sit in memory the filter cannot read.
    """
    allowed = sorted(set(families))
    if not allowed:
        raise ValueError("a run needs at least one socket family (Unix sockets reach the LLM proxy)")
    tests: list[tuple[Test, int]]
    if len(allowed) == 1:
        tests = [("ne", allowed[0])]
    else:
        low, high = allowed[0], allowed[-1]
        tests = [("lt", low), ("gt", high)]
        tests += [("eq", value) for value in range(low + 1, high) if value not in allowed]
    return tuple(
        Rule(name, errno.EAFNOSUPPORT, arg=(0, test, value, 0))
        for name in ("socket", "socketpair")
        for test, value in tests
    )


def build_filter_sync(socket_families: tuple[int, ...] = UNIX_ONLY) -> SeccompFilter:
    """Compile RULES, and the socket rules of `socket_families`, for this machine's ABIs (call it from a thread).

    Raises:
        SeccompUnavailable: libseccomp or pyseccomp cannot be loaded, or the architecture has no rule set here.
    """
    seccomp = _load_binding()
    native = _native_arch(seccomp)
    arches = ARCH_FAMILIES.get(native)
    if arches is None:
        raise SeccompUnavailable(f"no seccomp filter for the {native} architecture (x86_64 and aarch64 are supported)")
    added: dict[str, None] = {}
    unknown: dict[str, None] = {}
    try:
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        for arch in arches[1:]:
            rules.add_arch(getattr(seccomp.Arch, _ARCH_ATTRS[arch]))
        for rule in (*RULES, *socket_rules(socket_families)):
            try:
                rules.add_rule(seccomp.ERRNO(rule.error), rule.name, *_conditions(seccomp, rule))
            except OSError as err:
                if err.errno != errno.EINVAL:  # EINVAL: a name this libseccomp cannot resolve
                    raise
                unknown[rule.name] = None
            else:
                added[rule.name] = None
        bpf = _export(rules)
    except OSError as err:
        raise SeccompUnavailable(f"libseccomp refused the agent filter: {err}") from err
    if unknown:
        logger.warning("libseccomp does not know %s; the agent filter leaves them out", ", ".join(unknown))
    return SeccompFilter(
        bpf=bpf, arches=arches, denied=tuple(added), unknown=tuple(unknown), socket_families=socket_families
    )


def _conditions(seccomp: Any, rule: Rule) -> tuple[Any, ...]:
    if rule.arg is None:
        return ()
    index, test, first, second = rule.arg
    if test == "masked_eq":
        return (seccomp.Arg(index, seccomp.MASKED_EQ, first, second),)
    operator = {"ne": seccomp.NE, "eq": seccomp.EQ, "lt": seccomp.LT, "gt": seccomp.GT}[test]
    return (seccomp.Arg(index, operator, first),)


_DOCKER_OPS: Final = {
    "masked_eq": "SCMP_CMP_MASKED_EQ",
    "ne": "SCMP_CMP_NE",
    "eq": "SCMP_CMP_EQ",
    "lt": "SCMP_CMP_LT",
    "gt": "SCMP_CMP_GT",
}


def engine_profile(socket_families: tuple[int, ...] = UNIX_ONLY) -> dict[str, Any]:
    """The same rules as an OCI seccomp profile, the JSON docker and podman take (`--security-opt seccomp=FILE`).

    It replaces the engine's default profile, an allow-list that lets every socket family through (Docker 20.10
    lets AF_VSOCK and AF_NETLINK be created). The engine's own libseccomp compiles it, so the host needs none.

    Raises:
        SeccompUnavailable: the host's architecture has no rule set here.
    """
    native = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(platform.machine())
    if native is None:
        raise SeccompUnavailable(f"no seccomp profile for the {platform.machine()} architecture")
    arches = [f"SCMP_ARCH_{_ARCH_ATTRS[arch]}" for arch in ARCH_FAMILIES[native]]
    syscalls: list[dict[str, Any]] = []
    for rule in (*RULES, *socket_rules(socket_families)):
        entry: dict[str, Any] = {"names": [rule.name], "action": "SCMP_ACT_ERRNO", "errnoRet": rule.error}
        if rule.arg is not None:
            index, test, first, second = rule.arg
            entry["args"] = [{"index": index, "value": first, "valueTwo": second, "op": _DOCKER_OPS[test]}]
        syscalls.append(entry)
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": arches, "syscalls": syscalls}


def _family_name(family: int) -> str:
    try:
        return socket.AddressFamily(family).name
    except ValueError:
        return f"family {family}"


def filter_for(mode: SeccompMode) -> dict[tuple[int, ...], SeccompFilter] | None:
    """The filters bwrap runs get under FARMHOST_SANDBOX_SECCOMP, one per set of socket families kinds use.

    Built when `required` (SOCKET_FAMILY_SETS: the run's kind picks one), None when `off`.

    Raises:
        SeccompUnavailable: `required`, and the filter cannot be built (the message says how to fix it).
    """
    if mode == "off":
        logger.warning("FARMHOST_SANDBOX_SECCOMP=off: agents run without a seccomp filter")
        return None
    try:
        return {families: build_filter_sync(families) for families in SOCKET_FAMILY_SETS}
    except SeccompUnavailable as err:
        raise SeccompUnavailable(
            f"refusing to run agents without their seccomp filter: {err.message} "
            "(install libseccomp2, or set FARMHOST_SANDBOX_SECCOMP=off to run them unfiltered)"
        ) from err


def _load_binding() -> Any:
    try:
        import pyseccomp
    except ImportError as err:
        raise SeccompUnavailable(f"the Python package pyseccomp is not installed ({err})") from err
    except (RuntimeError, OSError) as err:  # pyseccomp raises RuntimeError when it finds no libseccomp
        raise SeccompUnavailable(f"libseccomp cannot be loaded: {err}") from err
    return pyseccomp


def _native_arch(seccomp: Any) -> str:
    native = seccomp.system_arch()
    for name, attr in _ARCH_ATTRS.items():
        if getattr(seccomp.Arch, attr) == native:
            return name
    return platform.machine() or f"arch {native:#x}"


def _export(rules: Any) -> bytes:
    """The filter as the BPF program bwrap reads (libseccomp writes it to a descriptor)."""
    fd = os.memfd_create("farmhost-seccomp-export", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as file:
        rules.export_bpf(file)
        file.seek(0)
        return file.read()
