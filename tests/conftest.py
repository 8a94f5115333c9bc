"""Shared fixtures: small task directories written on the fly, and a leak check for sandboxes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

KIT_SOURCE = '. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"'


def write_task(
    root: Path,
    name: str = "demo",
    *,
    dockerfile: str = "FROM debian:bookworm-slim\nWORKDIR /app\n",
    test_sh: str | None = None,
    solve_sh: str = "#!/bin/bash\necho done > /app/result.txt\n",
    agent_timeout: float = 60.0,
    verifier_timeout: float = 30.0,
    instruction: str = "Write the word done into /app/result.txt.",
    extra_files: dict[str, str] | None = None,
    verifier_toml: str = "",
    environment_toml: str = "",
    top_toml: str = "",
) -> Path:
    """A Harbor-layout task; by default its verifier checks /app/result.txt in two assertions.
    ``verifier_toml``, ``environment_toml`` and ``top_toml`` are lines added to ``[verifier]``, to
    ``[environment]`` and before the first table of ``task.toml``."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "tests").mkdir()
    (task / "task.toml").write_text(
        f'schema_version = "1.1"\n{top_toml}\n[metadata]\ncategory = "testing"\n[agent]\ntimeout_sec = {agent_timeout}\n'
        f'[verifier]\ntimeout_sec = {verifier_timeout}\n{verifier_toml}\n[environment]\nnetwork_mode = "no-network"\n{environment_toml}\n'
    )
    (task / "instruction.md").write_text(instruction + "\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "solution" / "solve.sh").write_text(solve_sh)
    if test_sh is None:
        test_sh = textwrap.dedent(f"""\
        #!/bin/sh
        {KIT_SOURCE}
        tg_check "result exists" test -f /app/result.txt
        tg_check_sh "result says done" 'grep -qx done /app/result.txt'
        tg_finish
        """)
    (task / "tests" / "test.sh").write_text(test_sh)
    for relative, content in (extra_files or {}).items():
        path = task / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return task


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    return write_task(tmp_path)


def sandbox_processes() -> list[str]:
    """Command lines of live bwrap keepers and processes inside termgym sandboxes."""
    result = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True)
    return [line for line in result.stdout.splitlines() if "bwrap" in line and "sleep infinity" in line]


def termgym_containers() -> list[str]:
    from termgym.sandboxes.docker import docker_client

    return [c["Id"] for c in docker_client().api.containers(all=True, filters={"label": "termgym=1"})]


@pytest.fixture
def sandbox_dir(monkeypatch: pytest.MonkeyPatch):
    """A directory of this test's own for sandboxes (``TERMGYM_SANDBOX_DIR``), under /tmp: a
    sandbox's unprivileged user must be able to reach it, which pytest's private tmp dirs forbid."""
    root = Path(tempfile.mkdtemp(prefix="termgym-test-sandboxes-"))
    root.chmod(0o755)
    monkeypatch.setenv("TERMGYM_SANDBOX_DIR", str(root))
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
        leaked = set(termgym_containers()) - containers_before
        assert not leaked, f"containers left behind: {leaked}"


def require_docker() -> None:
    """Docker tests fail, never skip, when the engine is missing: make test starts it."""
    from termgym.sandboxes.docker import docker_client

    docker_client()


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request: pytest.FixtureRequest) -> str:
    """Run the test on the embedded backend and on Docker."""
    if request.param == "docker":
        require_docker()
    return request.param


def pids_matching(pattern: str) -> list[int]:
    result = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split() if int(p) != os.getpid()]
