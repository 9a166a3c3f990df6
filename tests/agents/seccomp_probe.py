"""A probe agent for the seccomp tests: tries refused system calls and ordinary work, and reports each outcome.

PROBE is the program's source (run as `python -c PROBE` inside a real bwrap run); it prints an AgentResult whose
`answer` is a JSON report: errno names per attempt, what ordinary work gave, /proc/self/status's seccomp lines,
its open descriptors and its mountinfo.
"""

from __future__ import annotations

import sys
from typing import Final

PROBE: Final = r"""
import ctypes, errno, json, mmap, os, platform, socket, subprocess, sys, threading

wanted = json.loads(json.load(sys.stdin)["prompt"] or "null")  # the attempts to make (null: all)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
MACHINE = platform.machine()
NR = {
    "x86_64": {"unshare": 272, "clone": 56, "clone3": 435, "setns": 308, "ptrace": 101, "process_vm_readv": 310,
               "keyctl": 250, "bpf": 321, "perf_event_open": 298, "mount": 165, "io_uring_setup": 425,
               "userfaultfd": 323, "personality": 135, "socket": 41},
    "aarch64": {"unshare": 97, "clone": 220, "clone3": 435, "setns": 268, "ptrace": 117, "process_vm_readv": 270,
                "keyctl": 219, "bpf": 280, "perf_event_open": 241, "mount": 40, "io_uring_setup": 425,
                "userfaultfd": 282, "personality": 92, "socket": 198},
}[MACHINE]
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x20000, 0x10000000, 0x40000000, 17

def arg(value):
    return ctypes.c_char_p(value) if isinstance(value, bytes) else ctypes.c_long(value)

def in_child(call):
    # Each attempt runs in its own child: one that goes through (unfiltered) must not change the next one.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            outcome = call()
        except Exception as err:
            outcome = "raised:" + type(err).__name__
        os.write(w, outcome.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        outcome = f.read()
    _, status = os.waitpid(pid, 0)
    return outcome or f"died:{status}"

def raw(nr, *args):
    def call():
        ret = libc.syscall(ctypes.c_long(nr), *map(arg, args))
        if ret == 0 and nr in (NR["clone"], NR["clone3"]):
            os._exit(0)  # the new process of a clone that went through
        if ret > 0 and nr in (NR["clone"], NR["clone3"]):
            os.waitpid(ret, 0)
        return "ok" if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    return in_child(call)

class CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls")]

clone3_args = CloneArgs(flags=CLONE_NEWUSER, exit_signal=SIGCHLD)
calls = {
    "unshare(CLONE_NEWUSER)": lambda: raw(NR["unshare"], CLONE_NEWUSER),
    "unshare(CLONE_NEWNS)": lambda: raw(NR["unshare"], CLONE_NEWNS),
    "unshare(CLONE_NEWNET)": lambda: raw(NR["unshare"], CLONE_NEWNET),
    "clone(CLONE_NEWUSER)": lambda: raw(NR["clone"], CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0),
    "clone(CLONE_NEWNET)": lambda: raw(NR["clone"], CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0),
    "clone3(CLONE_NEWUSER)": lambda: raw(NR["clone3"], ctypes.addressof(clone3_args), ctypes.sizeof(clone3_args)),
    "setns": lambda: raw(NR["setns"], 0, 0),
    "ptrace(PTRACE_ATTACH, 1)": lambda: raw(NR["ptrace"], 16, 1, 0, 0),
    "ptrace(PTRACE_TRACEME)": lambda: raw(NR["ptrace"], 0, 0, 0, 0),
    "process_vm_readv": lambda: raw(NR["process_vm_readv"], 1, 0, 0, 0, 0, 0),
    "keyctl(KEYCTL_GET_KEYRING_ID)": lambda: raw(NR["keyctl"], 0, -3, 0),
    "bpf(BPF_MAP_CREATE)": lambda: raw(NR["bpf"], 0, 0, 0),
    "perf_event_open": lambda: raw(NR["perf_event_open"], 0, 0, -1, -1, 0),
    "mount(tmpfs)": lambda: raw(NR["mount"], b"none", b"/tmp", b"tmpfs", 0, 0),
    "io_uring_setup": lambda: raw(NR["io_uring_setup"], 1, 0),
    "userfaultfd": lambda: raw(NR["userfaultfd"], 0),
    "personality(READ_IMPLIES_EXEC)": lambda: raw(NR["personality"], 0x0400000),
    # AF_UNIX with a high bit the kernel ignores (it reads an int): the filter compares all 64 bits
    "socket(AF_UNIX | 1 << 32)": lambda: raw(NR["socket"], socket.AF_UNIX | 1 << 32, socket.SOCK_STREAM, 0),
}
if MACHINE == "x86_64":
    # the same unshare through the other ABIs of an x86_64 kernel: x32 numbers, and i386's int 0x80
    calls["x32 unshare(CLONE_NEWUSER)"] = lambda: raw(0x40000000 | 272, CLONE_NEWUSER)
    def int80():
        code = (b"\x53" + b"\xb8" + (310).to_bytes(4, "little") + b"\xbb" + CLONE_NEWUSER.to_bytes(4, "little")
                + b"\xcd\x80" + b"\x5b" + b"\xc3")  # push rbx; mov eax, 310; mov ebx, flags; int 0x80; pop rbx; ret
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        ret = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
        return "ok" if ret >= 0 else errno.errorcode.get(-ret, str(-ret))
    calls["i386 unshare(CLONE_NEWUSER)"] = lambda: in_child(int80)

attempts = {name: call() for name, call in calls.items() if wanted is None or name in wanted}

try:
    done = subprocess.run(["unshare", "-r", "true"], capture_output=True, text=True, timeout=10)
    unshare_r = {"exit": done.returncode, "stderr": done.stderr.strip()}
except Exception as err:
    unshare_r = {"exit": None, "stderr": repr(err)}

work = {}
path = os.path.join(os.environ["FARMAGENT_GROUP_DIR"], "seccomp-probe.txt")
with open(path, "w") as f:
    f.write("written in the sandbox")
with open(path) as f:
    work["file"] = f.read()
work["exec"] = subprocess.run([sys.executable, "-c", "print('child ran')"], capture_output=True, text=True).stdout
seen_in_thread = []
thread = threading.Thread(target=lambda: seen_in_thread.append(threading.get_ident()))
thread.start()
thread.join()
work["thread"] = bool(seen_in_thread) and seen_in_thread[0] != threading.get_ident()
work["personality(PER_LINUX)"] = raw(NR["personality"], 0)
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(os.environ["FARMAGENT_LLM_SOCKET"])
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: farmhost\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    work["proxy"] = data.decode(errors="replace").split("\r\n", 1)[0]
except Exception as err:
    work["proxy"] = "error:" + repr(err)

with open("/proc/self/status") as f:
    status = {k: v.strip() for k, _, v in (line.partition(":") for line in f) if k.startswith("Seccomp")}
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass  # the descriptor listdir itself used
with open("/proc/self/mountinfo") as f:
    mounts = [line.split()[3:6] for line in f]  # root, mount point, per-mount options
report = {"machine": MACHINE, "attempts": attempts, "unshare -r": unshare_r, "work": work, "status": status,
          "fds": fds, "mountinfo": mounts}
print(json.dumps({"status": "ok", "answer": json.dumps(report), "error": None, "turns": 1, "toolCalls": 0}))
"""

PROBE_COMMAND: Final = (sys.executable, "-c", PROBE)
