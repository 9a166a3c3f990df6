"""renameat2(2) with RENAME_NOREPLACE: move an entry only when nothing sits at the target name."""

from __future__ import annotations

import ctypes
import errno
import os

_RENAME_NOREPLACE = 1
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int


def rename_noreplace(src_dir_fd: int, src: str, dst_dir_fd: int, dst: str) -> None:
    """Rename `src` to `dst` (both relative to held directory descriptors), failing if `dst` exists.

    os.rename silently replaces a file or an empty directory at the target: putting an agent's directory back
    must never replace what the agent (or the host) put there meanwhile.

    Raises:
        FileExistsError: something is at `dst`.
        OSError: anything else renameat2 reports.
    """
    if _renameat2 is None:  # glibc before 2.28: link-free fallback, checked then renamed (a narrow race)
        try:
            os.stat(dst, dir_fd=dst_dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            return
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    if _renameat2(src_dir_fd, os.fsencode(src), dst_dir_fd, os.fsencode(dst), _RENAME_NOREPLACE) != 0:
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(code, os.strerror(code), dst)
        raise OSError(code, os.strerror(code), dst)
