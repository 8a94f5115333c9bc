"""The embedded backend's warm pool (``TERMGYM_LOCAL_POOL``): trials adopt started sandboxes of their
recipe, never one of another recipe and never one twice; the tamper baseline comes with it; the
scheduler's prewarm fills it; a run's end and a killed run leave nothing (real sandboxes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from termgym.agents import OracleAgent, ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.episode.spec import options_sandbox_spec
from termgym.sandboxes import close_backends, prewarm
from termgym.sandboxes.base import AGENT_SHELL, agent_env
from termgym.sandboxes.local import pool
from termgym.sandboxes.local.sandbox import LocalSandbox
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import KIT_SOURCE, REPO_ROOT, sandbox_processes, termgym, write_task

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def pool_on(monkeypatch: pytest.MonkeyPatch):
    """Two ready sandboxes per recipe; what each trial adopted (each test closes the pool itself)."""
    monkeypatch.setenv("TERMGYM_LOCAL_POOL", "2")
    adopted: list[str] = []
    original = LocalSandbox._adopt

    def counting(self: LocalSandbox, ready: LocalSandbox) -> None:
        adopted.append(str(ready.host_dir))
        original(self, ready)

    monkeypatch.setattr(LocalSandbox, "_adopt", counting)
    return adopted


async def settle() -> None:
    current = pool._current()
    assert current is not None
    await current[0].settle()


async def test_trials_adopt_started_sandboxes_of_their_recipe_once_each(task_dir, tmp_path, pool_on):
    task = load_task(task_dir)
    try:
        first = await run_trial(task, OracleAgent(), EnvOptions(run_id="one"))
        assert first.resolved and pool_on == []  # the pool was empty: the trial made its own, the pool filled
        await settle()
        assert pool.held() == 2
        idle = set(pool._current()[0].idle())  # type: ignore[index]
        second = await run_trial(task, OracleAgent(), EnvOptions(run_id="two"))
        third = await run_trial(task, OracleAgent(), EnvOptions(run_id="three"))
        assert second.resolved and third.resolved
        assert len(pool_on) == 2 and set(pool_on) <= idle and pool_on[0] != pool_on[1]  # two, each once
        assert second.timings["setup"] < first.timings["setup"]
        await settle()
        assert not set(pool_on) & set(pool._current()[0].idle())  # type: ignore[index]  # never back
        other = write_task(tmp_path, "other", dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nENV OTHER=1\n")
        fourth = await run_trial(load_task(other), OracleAgent(), EnvOptions())
        assert fourth.resolved and len(pool_on) == 2  # another recipe: none of the first recipe's
    finally:
        await close_backends()
    assert pool.held() == 0


def same_stat_task(root: Path, name: str, secret: str) -> Path:
    """A task whose image holds its build context's ``secret.txt`` and whose verifier passes only
    when that file says ``secret``; every task made by this has the same context names, sizes and
    times (``os.utime``), only the bytes of ``secret.txt`` differ."""
    task = write_task(
        root,
        name,
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nCOPY secret.txt /app/secret.txt\n",
        test_sh=f"#!/bin/sh\n{KIT_SOURCE}\ntg_check_sh 'its own environment' 'grep -qx {secret} /app/secret.txt'\ntg_finish\n",
        extra_files={"environment/secret.txt": f"{secret}\n"},
    )
    for path in [*(task / "environment").rglob("*"), task / "environment"]:
        os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000), follow_symlinks=False)
    return task


async def test_contexts_that_differ_only_in_bytes_never_share_a_pooled_sandbox(tmp_path, pool_on):
    first = load_task(same_stat_task(tmp_path, "first", "aaaa"))
    second = load_task(same_stat_task(tmp_path, "second", "bbbb"))
    first_env, second_env = (tmp_path / name / "environment" for name in ("first", "second"))
    assert [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(first_env.iterdir())] == [
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(second_env.iterdir())
    ]
    assert pool.recipe_of(options_sandbox_spec(first, EnvOptions())) != pool.recipe_of(
        options_sandbox_spec(second, EnvOptions())
    )
    null = ScriptedAgent(("true",))
    try:
        records = [await run_trial(first, null, EnvOptions())]
        await settle()  # the first task's recipe now has two ready sandboxes
        records.append(await run_trial(second, null, EnvOptions()))  # none of the first's
        assert pool_on == []
        await settle()
        records.append(await run_trial(second, null, EnvOptions()))  # one of its own
        records.append(await run_trial(first, null, EnvOptions()))  # one of its own
        assert len(pool_on) == 2
    finally:
        await close_backends()
    assert [(record.task, record.passed, record.total) for record in records] == [
        ("first", 1, 1),
        ("second", 1, 1),
        ("second", 1, 1),
        ("first", 1, 1),
    ]


async def test_an_adopted_sandbox_carries_its_labels_and_its_tamper_baseline(tmp_path, pool_on):
    task_dir = write_task(
        tmp_path,
        verifier_toml='env = { PATH = "/opt/tools/bin:/usr/bin:/bin" }',
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nRUN mkdir -p /opt/tools/bin\n",
    )
    task = load_task(task_dir)
    attack = (
        "echo done > /app/result.txt",
        "printf '#!/bin/sh\\n' > /opt/tools/bin/grep; chmod +x /opt/tools/bin/grep",
    )
    try:
        await run_trial(task, OracleAgent(), EnvOptions())
        await settle()
        spec = options_sandbox_spec(task, EnvOptions(run_id="labelled"))
        sandbox = LocalSandbox(spec)
        await sandbox.start()
        try:
            labels = json.loads((sandbox.files_dir.parent / "labels.json").read_text())
            assert labels["termgym.run"] == "labelled" and "termgym.pool" not in labels
        finally:
            await sandbox.stop()
        record = await run_trial(task, ScriptedAgent(attack), EnvOptions())
    finally:
        await close_backends()
    assert len(pool_on) == 2
    assert record.error is not None and record.error["kind"] == "tampered" and record.reward == 0.0, record
    assert "/opt/tools/bin/grep" in record.error["message"] and "/opt/tools/bin/grep" in (record.system_changes or [])


async def test_the_schedulers_prewarm_fills_the_pool(task_dir, pool_on):
    task = load_task(task_dir)
    spec = options_sandbox_spec(task, EnvOptions())
    try:
        assert await prewarm("local", [spec], 2) == 2
        assert pool.held() == 2
        record = await run_trial(task, OracleAgent(), EnvOptions())
        assert record.resolved and len(pool_on) == 1
    finally:
        await close_backends()


async def test_a_pooled_sandbox_hands_its_started_agent_shell_to_the_episode_and_to_nothing_else(task_dir, pool_on):
    """The shell an episode would start is already running in a pooled sandbox: ``open_process``
    with exactly the episode's parameters gets that one; any other launch ends it first."""
    task = load_task(task_dir)
    spec = options_sandbox_spec(task, EnvOptions())
    try:
        assert await prewarm("local", [spec], 2) == 2
        first, second = LocalSandbox(spec), LocalSandbox(spec)
        await first.start()
        await second.start()
        try:
            assert first._warm_shell is not None and second._warm_shell is not None
            for sandbox in (first, second):  # ready in full: its spare keeper is up, not still starting
                assert sandbox._keeper is not None and sandbox._keeper._spare is not None
                assert sandbox._keeper._spare.done()
            warm = first._warm_shell[1]
            shell = await first.open_process(AGENT_SHELL, env=agent_env(first.env), cwd=first.workdir)
            assert shell is warm and first._warm_shell is None
            await shell.write(b"echo $HOME $TERM $(pwd)\n")
            assert await shell.read(100) == f"/root dumb {first.workdir}\n".encode()
            unused = second._warm_shell[1]
            other = await second.open_process(AGENT_SHELL, env=agent_env(second.env), cwd="/")
            assert other is not unused and not unused.running and second._warm_shell is None
        finally:
            await first.stop()
            await second.stop()
        await settle()
        record = await run_trial(task, OracleAgent(), EnvOptions())  # one the pool's refill made
        assert record.resolved and len(pool_on) == 3
    finally:
        await close_backends()


def test_off_by_default_and_a_bad_size_is_one_line(task_dir, monkeypatch):
    monkeypatch.delenv("TERMGYM_LOCAL_POOL", raising=False)
    assert not pool.warm_pool_on()
    result = termgym("check", str(task_dir), "--agent", "oracle", env={"TERMGYM_LOCAL_POOL": "lots"})
    assert result.returncode != 0
    assert "TERMGYM_LOCAL_POOL='lots': expected a whole number of sandboxes" in result.stderr
    assert "Traceback" not in result.stderr


KILLED = textwrap.dedent("""\
    import asyncio, sys
    from termgym.agents import ScriptedAgent
    from termgym.episode.options import EnvOptions
    from termgym.tasks import load_task
    from termgym.trial import run_trial

    async def main():
        task = load_task(sys.argv[1])
        await run_trial(task, ScriptedAgent(("true",)), EnvOptions())
        print("pooled", flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """)


def test_a_killed_run_leaves_its_pool_to_termgym_gc(task_dir, tmp_path, sandbox_dir):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    env = {**os.environ, "TERMGYM_LOCAL_POOL": "2", "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen(
        [sys.executable, str(script), str(task_dir)], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as run:
        assert run.stdout is not None and run.stdout.readline().strip() == "pooled"
        deadline = time.monotonic() + 60
        while len(list(sandbox_dir.glob("tg-*"))) < 2:  # the refill after the trial's take
            assert time.monotonic() < deadline, "the pool never filled"
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    result = termgym("gc", "--backend", "local")
    assert result.returncode == 0, result.stderr
    assert "removed 2 leftover local sandbox(es)" in result.stdout
    assert not list(sandbox_dir.glob("tg-*"))
    assert not [line for line in sandbox_processes() if str(sandbox_dir) in line]
