"""Shared fixtures: small task directories written on the fly, a private sandbox directory, and a
leak check for sandboxes (the helpers they use are in tests/helpers.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import require_docker, sandbox_processes, termgym_containers, write_task


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    return write_task(tmp_path)


@pytest.fixture(scope="session")
def shared_cache_dir():
    """One cache of prepared environments and storage images for the whole session (as a user's
    runs share theirs), removed at its end."""
    root = Path(tempfile.mkdtemp(prefix="termgym-test-cache-"))
    root.chmod(0o755)  # images are unpacked there by their unprivileged owners
    yield root
    from termgym.sandboxes.local.env_cache import EnvCache

    EnvCache(root / "envs", max_bytes=0, max_entries=0).clear()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sandbox_dir(monkeypatch: pytest.MonkeyPatch, shared_cache_dir: Path):
    """A directory of this test's own for sandboxes (``TERMGYM_SANDBOX_DIR``), under /tmp: a
    sandbox's unprivileged user must be able to reach it, which pytest's private tmp dirs forbid.
    The cache they start from is the session's (``TERMGYM_ENV_CACHE_DIR``)."""
    root = Path(tempfile.mkdtemp(prefix="termgym-test-sandboxes-"))
    root.chmod(0o755)
    monkeypatch.setenv("TERMGYM_SANDBOX_DIR", str(root))
    monkeypatch.setenv("TERMGYM_ENV_CACHE_DIR", str(shared_cache_dir))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def no_leaks(sandbox_dir: Path, request: pytest.FixtureRequest):
    """Sandboxes go to a private directory; after the test none is left, on disk or running (and,
    for a test on the Docker backend, no labelled container)."""
    root = sandbox_dir
    before = set(sandbox_processes())
    on_docker = "backend" in request.fixturenames and request.getfixturevalue("backend") == "docker"
    containers_before = set(termgym_containers()) if on_docker else set()
    yield root
    leaked_dirs = [p.name for p in root.iterdir()]
    leaked_procs = [p for p in sandbox_processes() if p not in before and str(root) in p]
    assert not leaked_dirs, f"sandbox directories left behind: {leaked_dirs}"
    assert not leaked_procs, f"sandbox processes left running: {leaked_procs}"
    if on_docker:
        from termgym.sandboxes.docker import wait_for_removals

        wait_for_removals(timeout=60)  # stop() removes in the background
        leaked = set(termgym_containers()) - containers_before
        assert not leaked, f"containers left behind: {leaked}"


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request: pytest.FixtureRequest) -> str:
    """Run the test on the embedded backend and on Docker."""
    if request.param == "docker":
        require_docker()
    return request.param


@pytest.fixture(scope="session")
def ray_cluster():
    """A real Ray cluster on 127.0.0.1 (tests/ray_cluster.py): a head and two nodes, for the session."""
    pytest.importorskip("ray", reason="the ray extra")
    from tests.ray_cluster import started_cluster

    with started_cluster() as cluster:
        yield cluster
