"""``termgym gc --backend daytona``: after a run killed with SIGKILL, no labelled sandbox is left;
stale list entries and 404s are tolerated; sandboxes without termgym's label are not touched."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from daytona import CreateSandboxFromSnapshotParams

from termgym.episode.spec import sandbox_spec
from termgym.sandboxes.daytona.backend import DaytonaSandbox, collect_garbage
from termgym.sandboxes.daytona.provider import get_provider
from termgym.tasks import load_task
from tests.helpers import write_task


def labelled(server) -> list:
    return [s for s in server.live() if s.body["labels"].get("termgym") == "1"]


async def termgym(*args: str, cwd) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "termgym",
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None  # communicate() returns once the process has exited
    return process.returncode, out.decode(), err.decode()


async def test_gc_after_a_run_killed_with_sigkill(tmp_path, daytona):
    task = write_task(tmp_path, solve_sh="#!/bin/sh\nsleep 100012\n", agent_timeout=300)
    run = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "termgym",
        "run",
        str(task),
        "--backend",
        "daytona",
        "-n",
        "3",
        "-k",
        "5",
        "--out",
        str(tmp_path / "run"),
        cwd=tmp_path,
        start_new_session=True,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            if len([s for s in labelled(daytona) if s.state == "booted"]) >= 3:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the run never had three sandboxes running")
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        await run.wait()
    leftover = labelled(daytona)
    assert len(leftover) >= 3  # the killed run could not clean up
    assert {s.body["labels"]["termgym.run"] for s in leftover} != {"adhoc"}

    code, out, err = await termgym("gc", "--backend", "daytona", cwd=tmp_path)
    assert code == 0, err
    assert f"removed {len(leftover)} leftover daytona sandbox(es)" in out
    assert labelled(daytona) == []


async def test_gc_trusts_the_per_id_lookup_and_spares_other_sandboxes(tmp_path, daytona):
    daytona.faults.stale_list = True
    spec = sandbox_spec(load_task(write_task(tmp_path)), run_id="leaky")
    leaked = [DaytonaSandbox(spec), DaytonaSandbox(spec)]
    foreign = None
    try:
        for sandbox in leaked:
            await sandbox.start()
        await daytona.kill(leaked[0].sandbox_id)  # gone, but the list still shows it as started
        snapshot = leaked[1]._sandbox.snapshot
        params = CreateSandboxFromSnapshotParams(snapshot=snapshot, labels={"owner": "someone-else"})
        foreign = await get_provider().client.create(params, timeout=20)
        removed = await collect_garbage()
        assert removed == 1
        assert labelled(daytona) == []
        assert [s.id for s in daytona.live()] == [foreign.id]
        assert any(
            r.method == "GET" and r.path.endswith(leaked[0].sandbox_id) and r.status == 404 for r in daytona.requests
        )
        assert await collect_garbage() == 0  # nothing left: the ghost is skipped again
    finally:
        if foreign is not None:
            await foreign.delete(timeout=20)
        for sandbox in leaked:
            sandbox._sandbox = None
            await sandbox.stop()


async def test_gc_pages_through_long_lists(tmp_path, daytona):
    spec = sandbox_spec(load_task(write_task(tmp_path)), run_id="many")
    sandboxes = [DaytonaSandbox(spec) for _ in range(5)]
    await asyncio.gather(*(s.start() for s in sandboxes))
    assert await collect_garbage(page_size=2) == 5
    assert labelled(daytona) == []
    assert len([r for r in daytona.requests if r.method == "GET" and r.path == "/api/sandbox"]) == 3
    for sandbox in sandboxes:
        sandbox._sandbox = None
        await sandbox.stop()


async def test_gc_without_credentials_is_one_line(tmp_path, monkeypatch):
    for name in ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = await termgym("gc", "--backend", "daytona", cwd=tmp_path)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "DAYTONA_API_KEY" in err and "DAYTONA_API_URL" in err
