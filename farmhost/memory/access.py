"""Which group's memory a memory_action may read: its own, any registered group's from main, and the global one."""

from __future__ import annotations

from typing import Final

from farmhost.errors import InvalidRequest, NotFound, Unauthorized
from farmhost.handling import RequestContext
from farmhost.protocol.codes import FOLDER_RE
from farmhost.store import groups

# The global memory lives in `groups/global/` (the folder name is reserved for it); every group may read it.
GLOBAL_FOLDER: Final = "global"


def target_folder(ctx: RequestContext, asked: str | None, top_level: str | None) -> str:
    """The folder a memory request reads: `asked` (params.groupFolder), else the request's `groupFolder`, else its own.

    Raises:
        InvalidRequest: not a folder name.
        Unauthorized: a non-main group asking for another group's memory.
        NotFound: main asking for a folder that is not registered.
    """
    folder = asked or top_level or ctx.group.folder
    if not isinstance(folder, str) or not FOLDER_RE.fullmatch(folder):
        raise InvalidRequest("groupFolder must be a group folder name (letters, digits, '_' or '-'), never a path")
    if folder == ctx.group.folder or folder == GLOBAL_FOLDER:
        return folder
    if not ctx.group.is_main:
        raise Unauthorized(
            f"group {ctx.group.folder!r} may only read its own memory (and the global one), not {folder!r}"
        )
    if groups.get_group(ctx.db.conn, folder) is None:
        raise NotFound(f"groupFolder {folder!r} is not a registered group")
    return folder
