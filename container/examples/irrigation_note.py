"""Example agent script: check the host, search the farm's memory, and post what it found to a chat.

Run inside the sandbox (FARMAGENT_IPC_DIR is set there): `python irrigation_note.py telegram:-1001234`.
tests/farmagent/test_farmagent_docs.py runs this file against a real daemon.
"""

from __future__ import annotations

import sys

from farmagent.errors import FarmagentError, RequestError
from farmagent.ipc import IpcClient


def main(chat_jid: str) -> int:
    """Post the citations of the irrigation notes to `chat_jid`; exit status 0 when the message is queued."""
    client = IpcClient.from_env()
    try:
        client.ping()  # HostUnavailableError at once if the host is stopped or its heartbeat is stale
        hits = client.memory_search("irrigation", top_k=3)["hits"]
        cited = ", ".join(f"{hit['groupFolder']}:{hit['citation']}" for hit in hits) or "no notes"
        queued = client.send_message(chat_jid, f"Irrigation notes: {cited}")
    except RequestError as err:  # the host refused: err.code is the result's errorCode
        print(f"refused ({err.code}): {err.message}", file=sys.stderr)
        return 1
    except FarmagentError as err:  # no host, no result in time, a broken result file
        print(f"failed ({err.code}): {err.message}", file=sys.stderr)
        return 1
    print(f"queued in {queued['chunks']} chunk(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
