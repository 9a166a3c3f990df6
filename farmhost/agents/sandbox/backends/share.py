"""A run's own share of what the kernel counts per uid, when a daemon that is not root runs every agent as itself.

A process in a user namespace is counted against its uid in that namespace and, up the chain, against the
namespace's creator: the daemon's uid. Each bwrap run of a daemon that is not root has its own user namespace, so
the run's limits are set inside it, after bwrap made it: `RLIMIT_NPROC` (set before bwrap, it also became the
ceiling of the daemon's whole uid, its own threads and every other run included) and `user.max_inotify_instances`
of the namespace (a run's share of the daemon uid's instances, so no run can take the daemon's or another run's).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Final

# Where the kernel keeps the inotify instances a uid may hold: the host's, and the one of the daemon's own user
# namespace (a container); the lower holds.
INOTIFY_LIMITS: Final = (Path("/proc/sys/fs/inotify/max_user_instances"), Path("/proc/sys/user/max_inotify_instances"))
# The kernel's default, for a host that shows neither file.
DEFAULT_INOTIFY: Final = 128

# Run inside the sandbox by the agent's interpreter, with CAP_SYS_RESOURCE in the run's user namespace (and nothing
# else): argv is `<inotify> <nproc> <command...>`. Caps the namespace's inotify instances (not when <inotify> is 0:
# under the container's read-only /proc/sys, FARMHOST_SANDBOX_PROC=container), lowers RLIMIT_NPROC, clears the
# ambient capabilities (PR_CAP_AMBIENT 47, CLEAR_ALL 4) and starts the agent, which so has none.
LAUNCHER: Final = """\
import ctypes, os, resource, sys
inotify, nproc, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
try:
    if inotify != "0":
        with open("/proc/sys/user/max_inotify_instances", "w") as f:
            f.write(inotify)
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    if ctypes.CDLL(None, use_errno=True).prctl(47, 4, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot clear the ambient capabilities")
    os.execvp(argv[0], argv)
except OSError as err:
    sys.exit(f"farmhost: cannot start the agent in its share of the daemon's limits: {err}")
"""


def inotify_share(max_agents: int) -> int:
    """The inotify instances one run may hold: the daemon uid's limit split between `max_agents` runs and itself."""
    found = []
    for path in INOTIFY_LIMITS:
        with contextlib.suppress(OSError, ValueError):
            found.append(int(path.read_text()))
    return max(1, min(found or [DEFAULT_INOTIFY]) // (max_agents + 1))
