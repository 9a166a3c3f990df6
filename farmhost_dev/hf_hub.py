"""A stand-in for the Hugging Face Hub on 127.0.0.1, for the tests of a model that faster-whisper fetches by name.

It speaks the part of the Hub's HTTP protocol that `huggingface_hub.snapshot_download` (what faster-whisper's
`download_model` calls) uses, as the installed huggingface_hub reads it:

- `GET /api/models/{repo}/revision/{rev}`: the repo's info; `sha` is the commit the revision resolves to.
- `GET /api/models/{repo}/tree/{rev}?recursive=...`: the files (`type`, `path`, `size`, `oid`, and `lfs` for
  model.bin, as the Hub stores big files in LFS).
- `HEAD` and `GET /{repo}/resolve/{rev}/{file}`: the file, with `X-Repo-Commit`, `ETag` (the git blob's sha1, or the
  LFS object's sha256), `X-Linked-Etag` / `X-Linked-Size` for LFS files, `Content-Length`, and `Range` (`bytes=N-`)
  for a resumed download.
- An unknown repo or revision is a 404 with the Hub's `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`).

It also answers as a plain forward proxy would (a request line with an absolute `http://` URL), so a test can prove
that HTTP_PROXY reaches the process that downloads. Every request is counted (`requests`). Served by a thread; with
`certificate`, over HTTPS.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import ssl
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final, Self
from urllib.parse import unquote, urlsplit

WHISPER_BASE_REPO: Final = "Systran/faster-whisper-base"  # what faster-whisper fetches for the name `base`
LFS_FILES: Final = frozenset({"model.bin"})  # what the Hub's faster-whisper repos keep in LFS
_API_RE: Final = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/(?P<kind>revision|tree)/(?P<rev>[^/?]+)")
_RESOLVE_RE: Final = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)")


@dataclass(frozen=True)
class Served:
    """One file of a repo: where it is on disk and the hashes the Hub gives it."""

    path: Path
    size: int
    git_sha1: str  # the git blob's id: the ETag of a file not in LFS
    sha256: str | None  # the LFS object's id: the ETag of a file in LFS


@dataclass(frozen=True)
class Request:
    """One request the stand-in answered."""

    method: str
    host: str  # the Host header, or the absolute URL's host when asked as a proxy
    path: str
    status: int


def _hashes(path: Path, *, lfs: bool) -> Served:
    size = path.stat().st_size
    blob = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    whole = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(1 << 20):
            blob.update(chunk)
            whole.update(chunk)
    return Served(path=path, size=size, git_sha1=blob.hexdigest(), sha256=whole.hexdigest() if lfs else None)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA, valid a day) and its key, made by the openssl command."""
    cert, key = folder / "hub.crt", folder / "hub.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class LocalHub:
    """The Hub's model API for `repos` ({"Systran/faster-whisper-base": <model directory>}), on 127.0.0.1."""

    def __init__(self, repos: dict[str, Path], *, port: int = 0, certificate: tuple[Path, Path] | None = None) -> None:
        self.repos: dict[str, dict[str, Served]] = {
            repo: {f.name: _hashes(f, lfs=f.name in LFS_FILES) for f in sorted(folder.iterdir()) if f.is_file()}
            for repo, folder in repos.items()
        }
        # One commit per repo, derived from its files, as a git commit id is.
        self.commits = {
            repo: hashlib.sha1("".join(s.git_sha1 for s in files.values()).encode(), usedforsecurity=False).hexdigest()
            for repo, files in self.repos.items()
        }
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.hub = self
        self._server.daemon_threads = True
        scheme = "http"
        if certificate is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*certificate)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.port: int = self._server.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-hub", daemon=True)
        self._thread.start()

    def record(self, request: Request) -> None:
        """Count one request."""
        with self._lock:
            self.requests.append(request)

    def downloads(self) -> list[str]:
        """The files sent whole or in part (GETs of /resolve/), in order."""
        with self._lock:
            return [r.path.rpartition("/")[2] for r in self.requests if r.method == "GET" and "/resolve/" in r.path]

    def clear(self) -> None:
        """Forget the requests counted so far."""
        with self._lock:
            self.requests.clear()

    def stop(self) -> None:
        """Stop listening (a later connection is refused); idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    hub: LocalHub


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads `LocalHub.requests`."""

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        host = self.headers.get("Host", "")
        target = self.path
        if target.startswith(("http://", "https://")):  # asked as a forward proxy
            split = urlsplit(target)
            host, target = split.netloc, split.path + (f"?{split.query}" if split.query else "")
        status = self._route(unquote(target.partition("?")[0]), body=body)
        self.server.hub.record(Request(method=self.command, host=host, path=target, status=status))

    def _route(self, path: str, *, body: bool) -> int:
        if found := _API_RE.fullmatch(path):
            return self._api(found["repo"], found["kind"], found["rev"])
        if found := _RESOLVE_RE.fullmatch(path):
            return self._file(found["repo"], found["rev"], found["file"], body=body)
        return self._error(404, "EntryNotFound", f"{path} is not served here")

    def _commit(self, repo: str, rev: str) -> str | int:
        if repo not in self.server.hub.repos:
            return self._error(404, "RepoNotFound", f"Repository {repo} not found")
        if rev not in ("main", self.server.hub.commits[repo]):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return self.server.hub.commits[repo]

    def _api(self, repo: str, kind: str, rev: str) -> int:
        commit = self._commit(repo, rev)
        if isinstance(commit, int):
            return commit
        files = self.server.hub.repos[repo]
        answer: Any
        if kind == "revision":
            answer = {"id": repo, "modelId": repo, "sha": commit, "private": False, "gated": False,
                      "siblings": [{"rfilename": name} for name in files]}  # fmt: skip
        else:
            answer = [
                {"type": "file", "path": name, "size": served.size, "oid": served.git_sha1}
                | ({"lfs": {"oid": served.sha256, "size": served.size, "pointerSize": 134}} if served.sha256 else {})
                for name, served in files.items()
            ]
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return 200

    def _file(self, repo: str, rev: str, name: str, *, body: bool) -> int:
        commit = self._commit(repo, rev)
        if isinstance(commit, int):
            return commit
        served = self.server.hub.repos[repo].get(name)
        if served is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist in {repo}", commit=commit)
        start = 0
        if ranged := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
            start = min(int(ranged[1]), served.size)
        status = 206 if start else 200
        self.send_response(status)
        etag = served.sha256 or served.git_sha1
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{etag}"')
        if served.sha256:
            self.send_header("X-Linked-Etag", f'"{served.sha256}"')
            self.send_header("X-Linked-Size", str(served.size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(served.size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{served.size - 1}/{served.size}")
        self.end_headers()
        if body:
            with served.path.open("rb") as src:
                src.seek(start)
                shutil.copyfileobj(src, self.wfile, 1 << 20)
        return status

    def _error(self, status: int, code: str, message: str, *, commit: str | None = None) -> int:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        return status
