"""A real container registry (Debian's ``docker-registry``) on a free loopback port, for tests of
pulls: plain HTTP, as Docker's engine and termgym reach loopback registries; its storage in a
directory of the caller's."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def registry_binary() -> str:
    """``docker-registry``, installed with apt-get (idempotently, as make test does) if missing."""
    if shutil.which("docker-registry") is None:
        script = ". scripts/apt-ensure.sh && apt_ensure test-registry docker-registry:docker-registry"
        subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, check=True)
    found = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    assert Path(found).is_file(), "docker-registry is not installed"
    return found


@contextlib.contextmanager
def running_registry(root: Path) -> Iterator[str]:
    """A registry storing its blobs under ``root / "data"``; yields ``127.0.0.1:PORT``, stops it
    at the end (nothing left running)."""
    port = free_port()
    config = root / "config.yml"
    config.write_text(
        textwrap.dedent(f"""\
        version: 0.1
        log:
          level: error
        storage:
          filesystem:
            rootdirectory: {root / "data"}
          delete:
            enabled: true
        http:
          addr: 127.0.0.1:{port}
        """)
    )
    process = subprocess.Popen(
        [registry_binary(), "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None, "docker-registry exited"
            assert time.monotonic() < deadline, "docker-registry did not answer on /v2/"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        if process.poll() is None:
            process.kill()
            process.wait()
