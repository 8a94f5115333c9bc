"""Helpers shared by the tests: task directories written on the fly, the assertion kit's source
line, the repository's root, and probes for leftover sandboxes (fixtures live in conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_bench(name: str) -> ModuleType:
    """The benchmark script ``bench/NAME.py`` as a module (``NAME_bench``), for its pure parts."""
    spec = importlib.util.spec_from_file_location(f"{name}_bench", REPO_ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


KIT_SOURCE = '. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"'


def termgym(
    *args: str,
    stdin: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m termgym ARGS`` in a process of its own, as a user runs it: text output captured,
    ``env`` added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "termgym", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


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


def sandbox_processes() -> list[str]:
    """Command lines of live bwrap keepers and processes inside termgym sandboxes."""
    # -ww: without it ps cuts each line to 80 columns where it finds no terminal (as under pytest),
    # which drops the keeper's "sleep infinity" from every line.
    result = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True)
    return [line for line in result.stdout.splitlines() if "bwrap" in line and "sleep infinity" in line]


def termgym_containers() -> list[str]:
    from termgym.sandboxes.docker import docker_client

    return [c["Id"] for c in docker_client().api.containers(all=True, filters={"label": "termgym=1"})]


# What still ends an embedded sandbox from inside, whose keeper is its PID namespace's init (no
# process of the sandbox can signal it: ``kill -9 -1`` spares it): made the OOM killer's first
# choice, then memory past the sandbox's limit (2 GB by default). Two seconds or so.
KILL_THE_KEEPER = "echo 1000 > /proc/1/oom_score_adj; head -c 5000M /dev/zero | tail"


def require_docker() -> None:
    """Docker tests fail, never skip, when the engine is missing: make test starts it."""
    from termgym.sandboxes.docker import docker_client

    docker_client()


def pids_matching(pattern: str) -> list[int]:
    result = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split() if int(p) != os.getpid()]
