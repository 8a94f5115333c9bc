"""This process joining a Ray cluster (``ray.init``), within a bounded wait and in one line.

``ray.init`` at an address where no Ray answers does not fail: it retries for minutes and prints
Ray's own C++ log lines on the terminal meanwhile. ``join`` first checks the address (``endpoint``)
and that a gRPC server answers there (``probe``: a TCP connect, then the HTTP/2 preface, which
Ray's GCS and Ray Client servers both answer with a SETTINGS frame), then runs ``ray.init`` under
the same deadline with the process's standard error (the descriptor Ray's C++ core writes to)
going to a log file. Every failure is one ``ConfigError`` line (the CLI's bad input: exit 2).

The wait: ``TERMGYM_RAY_CONNECT_TIMEOUT`` seconds (default ``DEFAULT_CONNECT_TIMEOUT``). A ``ray``
address without ``RAY_ADDRESS`` (Ray's "auto": the cluster ``ray start`` made on this machine) is
not probed; only its ``ray.init`` is bounded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from termgym.errors import BackendUnavailable, ConfigError
from termgym.sandboxes.ray.node import first_line

NAMESPACE = "termgym"
CONNECT_TIMEOUT_VARIABLE = "TERMGYM_RAY_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT = 30.0  # seconds: a real ray.init takes a few on a busy machine
# The client's connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS_FRAME = 0x04


def connect_timeout(environ: Mapping[str, str]) -> float:
    """The wait for a cluster to answer: ``TERMGYM_RAY_CONNECT_TIMEOUT`` seconds, else the default."""
    raw = environ.get(CONNECT_TIMEOUT_VARIABLE)
    if raw is None or not raw.strip():
        return DEFAULT_CONNECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"{CONNECT_TIMEOUT_VARIABLE} must be a positive number of seconds, got {raw!r}")
    return value


def endpoint(address: str, environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The host and port that must answer for ``address``: ``ray://HOST:PORT`` and ``HOST:PORT`` as
    written; ``ray``: ``RAY_ADDRESS``'s, or None when that is unset or ``auto`` (Ray looks for the
    cluster on this machine). ``ConfigError`` for an address without a host and a port."""
    given = address
    if address == "ray":
        address = environ.get("RAY_ADDRESS", "").strip()
        if address in ("", "auto", "local"):
            return None
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in hostport:
        where = f" (RAY_ADDRESS={address!r})" if given == "ray" else ""
        raise ConfigError(f"--cluster {given}{where}: not a Ray cluster address (ray://HOST:PORT, HOST:PORT, or ray)")
    return host, int(port)


def probe(host: str, port: int, timeout: float) -> str | None:
    """None when a gRPC (HTTP/2) server answers at ``host:port`` within ``timeout`` seconds; else why
    not, in a few words."""
    deadline = time.monotonic() + timeout
    try:
        connection = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        return f"no answer within {timeout:g}s; {CONNECT_TIMEOUT_VARIABLE} sets the wait"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    with connection:
        try:
            connection.sendall(HTTP2_PREFACE)
            header = b""
            while len(header) < 9:
                connection.settimeout(max(deadline - time.monotonic(), 0.001))
                data = connection.recv(9 - len(header))
                if not data:
                    break
                header += data
        except TimeoutError:
            return f"something listens there but said nothing within {timeout:g}s; " + (
                f"{CONNECT_TIMEOUT_VARIABLE} sets the wait"
            )
        except OSError as exc:
            return (exc.strerror or str(exc)).lower()
    if len(header) == 9 and header[3] == SETTINGS_FRAME:
        return None
    return "something listens there, but not Ray (it does not answer gRPC)"


def join(address: str, environ: Mapping[str, str] | None = None) -> None:
    """``ray.init`` for ``address`` (``ray``: ``RAY_ADDRESS`` or the local cluster), once per process,
    within ``connect_timeout``; ``ConfigError`` in one line when the cluster does not answer."""
    try:
        import ray
    except ImportError:
        raise BackendUnavailable("--cluster needs Ray: pip install -e '.[ray]'") from None
    if ray.is_initialized():
        return
    environ = os.environ if environ is None else environ
    timeout = connect_timeout(environ)
    deadline = time.monotonic() + timeout  # for the probe and ray.init together
    target = endpoint(address, environ)
    if target is not None:
        why = probe(*target, timeout)
        if why is not None:
            raise ConfigError(f"no Ray cluster answers at {address} ({why}): check the address, or start the cluster")
    init_address = None if address == "ray" else address
    if init_address is None and not environ.get("RAY_ADDRESS"):
        init_address = "auto"
    outcome: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(address=init_address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR)
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=init, name="termgym: ray.init", daemon=True)
    with _stderr_to_log() as log:
        thread.start()
        thread.join(max(deadline - time.monotonic(), 0.1))
        if thread.is_alive():
            log.keep()
            raise ConfigError(
                f"the Ray cluster at {address} did not let this process join within {timeout:g}s "
                f"({CONNECT_TIMEOUT_VARIABLE} sets the wait); Ray's log: {log.path}"
            )
    if outcome:
        exc = outcome[0]
        if isinstance(exc, (ConnectionError, ValueError)):
            raise ConfigError(f"cannot join the Ray cluster at {address}: {first_line(exc)}") from None
        if isinstance(exc, RuntimeError):
            raise BackendUnavailable(f"cannot join the Ray cluster at {address}: {first_line(exc)}") from None
        raise exc


class _Log:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.kept = False

    def keep(self) -> None:
        """Leave the process's standard error on the log from now on (``ray.init`` still runs, and
        Ray's core keeps writing there); ``sys.stderr`` goes on to the terminal."""
        self.kept = True


@contextlib.contextmanager
def _stderr_to_log() -> Iterator[_Log]:
    """The process's descriptor 2 on a log file meanwhile (Ray's C++ core writes there); restored
    at the end unless ``keep()``, which moves ``sys.stderr`` to the saved descriptor instead."""
    fd, name = tempfile.mkstemp(prefix="termgym-ray-join-", suffix=".log")
    log = _Log(Path(name))
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield log
    finally:
        if log.kept:
            sys.stderr = os.fdopen(saved, "w", buffering=1, errors="backslashreplace")
        else:
            os.dup2(saved, 2)
            os.close(saved)
            with contextlib.suppress(OSError):
                log.path.unlink()
