"""The embedded sandbox: isolation, environment preparation from the Dockerfile, file transfer."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from termgym.errors import EnvironmentBuildError, SandboxError
from termgym.images.dockerfile import parse_dockerfile
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.files import tar_of_files
from termgym.sandboxes.local import LocalSandbox
from termgym.sandboxes.local.host import BASE_WRITABLE, writable_roots


def spec(tmp_path, dockerfile: str | None = None, **files: str) -> SandboxSpec:
    context = tmp_path / "context"
    context.mkdir()
    for name, content in files.items():
        path = context / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    path = None
    if dockerfile is not None:
        path = context / "Dockerfile"
        path.write_text(dockerfile)
    return SandboxSpec(name="local-test", context_dir=context, dockerfile=path)


async def run(sandbox, script: str) -> str:
    result = await sandbox.exec(["/bin/sh", "-c", script], timeout=10)
    return result.text


@pytest.mark.parametrize(
    ("dockerfile", "extra"),
    [
        ("FROM debian:bookworm-slim\nWORKDIR /app\n", []),
        ("FROM debian:bookworm-slim\nWORKDIR /workspace/project\nCOPY a /srv/data/\n", ["workspace"]),
        ("FROM debian:bookworm-slim\nRUN mkdir -p /usr/local/thing\nWORKDIR /usr/local/thing\n", []),
    ],
)
def test_writable_roots(dockerfile, extra):
    assert writable_roots(parse_dockerfile(dockerfile)) == list(BASE_WRITABLE) + extra


async def test_isolation_from_the_host(tmp_path, no_leaks):
    async with LocalSandbox(spec(tmp_path)) as sandbox:
        assert (await run(sandbox, "hostname")).strip() == "termgym"
        assert "No such file" in await run(sandbox, "ls /work 2>&1; ls /root/.pyenv 2>&1")
        assert int((await run(sandbox, "ls /proc | grep -c '^[0-9]'")).strip()) < 10  # own PID namespace
        assert "Read-only" in await run(sandbox, "touch /usr/x 2>&1; touch /etc/x 2>&1")
        assert (await run(sandbox, "awk 'NR > 2 {print $1}' /proc/net/dev")).split() == ["lo:"]  # loopback only


async def test_the_host_environment_never_reaches_the_sandbox(tmp_path, no_leaks, monkeypatch):
    # vLLM's import sets LD_PRELOAD to a library of this venv: passed through nsenter, the loader
    # in the sandbox (where that path does not exist) printed an error into every command's
    # output, and the verifier's report was lost with it.
    monkeypatch.setenv("LD_PRELOAD", str(tmp_path / "libmissing.so"))
    monkeypatch.setenv("TERMGYM_HOST_ONLY", "secret")
    async with LocalSandbox(spec(tmp_path)) as sandbox:
        assert await run(sandbox, "echo hi") == "hi\n"
        assert "TERMGYM_HOST_ONLY" not in await run(sandbox, "env")
        channel = await sandbox.open_process(["/bin/sh", "-c", "echo ready"], env={}, cwd="/")
        assert await channel.read(4096) == b"ready\n"
        await channel.close()


async def test_dockerfile_subset_prepares_the_environment(tmp_path, no_leaks):
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        data = b"from the archive\n"
        info = tarfile.TarInfo("pkg/inside.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    dockerfile = (
        "FROM debian:bookworm-slim\nARG GREETING=hello\nENV GREETING=$GREETING TARGET=/opt/data\n"
        "WORKDIR /app\nCOPY note.txt .\nCOPY conf/ /etc-copy/\nADD bundle.tar.gz /opt/\n"
        'RUN echo "$GREETING from run" > /app/run.txt && mkdir -p "$TARGET"\nWORKDIR /app/sub\n'
    )
    the_spec = spec(tmp_path, dockerfile, **{"note.txt": "a note\n", "conf__a.conf": "a=1\n"})
    assert the_spec.context_dir is not None
    (the_spec.context_dir / "bundle.tar.gz").write_bytes(archive.getvalue())
    async with LocalSandbox(the_spec) as sandbox:
        assert sandbox.workdir == "/app/sub" and sandbox.env["GREETING"] == "hello"
        assert await run(sandbox, "cat /app/note.txt /etc-copy/a.conf /opt/pkg/inside.txt /app/run.txt") == (
            "a note\na=1\nfrom the archive\nhello from run\n"
        )
        assert (await run(sandbox, "pwd; test -d /opt/data && echo dir")).split() == ["/app/sub", "dir"]


async def test_run_step_needing_packages_says_to_use_docker(tmp_path, no_leaks):
    the_spec = spec(tmp_path, "FROM debian:bookworm-slim\nRUN apt-get install -y jq-from-nowhere\n")
    with pytest.raises(EnvironmentBuildError, match="--backend docker") as caught:
        async with LocalSandbox(the_spec):
            pass
    assert "Dockerfile:2: RUN" in str(caught.value)


async def test_missing_copy_source_is_a_build_error(tmp_path, no_leaks):
    with pytest.raises(EnvironmentBuildError, match="not found"):
        async with LocalSandbox(spec(tmp_path, "FROM debian:bookworm-slim\nCOPY missing.txt /app/\n")):
            pass


async def test_upload_into_read_only_path_is_a_sandbox_error(tmp_path, no_leaks):
    source = tmp_path / "f.txt"
    source.write_text("x")
    async with LocalSandbox(spec(tmp_path)) as sandbox:
        await sandbox.upload_tar(tar_of_files([(source, "f.txt")]), "/app/in")
        assert await run(sandbox, "cat /app/in/f.txt") == "x"
        with pytest.raises(SandboxError, match="upload to /usr/lib/x failed"):
            await sandbox.upload_tar(tar_of_files([(source, "f.txt")]), "/usr/lib/x")


async def test_killing_agent_processes_keeps_files(tmp_path, no_leaks):
    async with LocalSandbox(spec(tmp_path)) as sandbox:
        await sandbox.exec(["/bin/sh", "-c", "echo kept > /app/state; (setsid sleep 100007 &)"], timeout=10)
        await sandbox.kill_agent_processes()
        assert await run(sandbox, "cat /app/state; ps -e -o args | grep -c 'sleep 10000[7]' || true") == "kept\n0\n"


async def test_the_keeper_is_the_namespaces_init_reaps_orphans_and_outlives_kill_everything(tmp_path, no_leaks) -> None:
    """The keeper is PID 1 (no reaper of bubblewrap's in front of it), the kernel reaps the orphans
    it adopts (it ignores SIGCHLD), and no process of the sandbox can end it."""
    async with LocalSandbox(spec(tmp_path)) as sandbox:
        assert await run(sandbox, "tr '\\0' ' ' < /proc/1/cmdline") == "/bin/sleep infinity "
        orphans = "for i in 1 2 3 4 5 6; do sh -c '(sleep 0.2) & exit'; done; sleep 1"
        zombies = "grep -l '^State:.*zombie' /proc/[0-9]*/status 2>/dev/null | wc -l"
        assert await run(sandbox, f"{orphans}; {zombies}") == "0\n"  # 6 without the reaping
        await sandbox.exec(["/bin/sh", "-c", "kill -9 -1; kill -9 1"], timeout=10)
        assert await run(sandbox, "echo alive") == "alive\n"


async def test_without_as_pid_1_bubblewraps_reaper_is_the_init_and_the_keeper_its_child(
    tmp_path, no_leaks, monkeypatch
) -> None:
    """The fallback for a host whose bubblewrap or coreutils lacks what the keeper as init needs."""
    from termgym.sandboxes.local import commands, keeper

    monkeypatch.setattr(commands, "keeper_is_init", lambda: False)
    monkeypatch.setattr(keeper, "keeper_is_init", lambda: False)
    async with LocalSandbox(spec(tmp_path)) as sandbox:
        assert await run(sandbox, "tr '\\0' ' ' < /proc/2/cmdline") == "/bin/sleep infinity "
        assert isinstance(sandbox, LocalSandbox)
        assert Path(f"/proc/{sandbox._keeper_pid}/comm").read_text() == "sleep\n"  # the one entered
        assert await run(sandbox, "echo alive") == "alive\n"


async def test_the_kill_goes_on_in_a_namespace_the_agent_never_reached(no_leaks) -> None:
    """The spare keeper, started with the sandbox, is invisible to the agent's processes; after
    the kill it serves the next command, and nothing the agent started is there."""
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local import LocalSandbox

    sandbox = LocalSandbox(SandboxSpec("spare", None, None))
    async with sandbox:
        seen = await sandbox.exec(["/bin/sh", "-c", "sleep 1000 & ps -eo args"], timeout=10)
        assert seen.text.splitlines().count("/bin/sleep infinity") == 1  # its own keeper only
        first = sandbox._keeper_pid
        await sandbox.kill_agent_processes()
        assert sandbox.host_files() is not None  # no agent process: the files are reachable from the host
        after = await sandbox.exec(["ps", "-eo", "args"], timeout=10)
        assert "sleep 1000" not in after.text and sandbox._keeper_pid != first
        assert sandbox.host_files() is None  # a command ran since
        await sandbox.kill_agent_processes()  # no spare left: the keeper is restarted on demand
        assert (await sandbox.exec(["echo", "ok"], timeout=10)).text == "ok\n"


async def test_a_kill_cancelled_after_it_took_the_spare_leaves_the_spare_to_stop(no_leaks) -> None:
    """A cancellation between taking the spare keeper and handing it over (a trial cancelled while
    its verification began) must not leave the spare running unowned: ``stop`` still ends it. CI
    found a trial whose stop then waited for ever on a cgroup that the lost keeper kept busy."""
    import asyncio

    from termgym.sandboxes.host_processes import alive

    sandbox = LocalSandbox(SandboxSpec("spare-cancelled", None, None))
    await sandbox.start()
    try:
        assert sandbox._keeper is not None and sandbox._keeper._spare is not None
        _, spare_keeper = await sandbox._keeper._spare
        stopping_the_first = asyncio.Event()
        keeper = sandbox._keeper
        stop_keeper = keeper.stop

        async def stopping_slowly(**kwargs) -> None:
            stopping_the_first.set()
            await asyncio.sleep(60)

        keeper.stop = stopping_slowly  # the moment after the spare was taken
        kill = asyncio.create_task(sandbox.kill_agent_processes())
        await asyncio.wait_for(stopping_the_first.wait(), 30)
        kill.cancel()
        with pytest.raises(asyncio.CancelledError):
            await kill
        keeper.stop = stop_keeper
        assert alive(spare_keeper)
    finally:
        await asyncio.wait_for(sandbox.stop(), 10)
    assert not alive(spare_keeper)


def test_the_state_directory_cannot_shadow_the_package_and_gc_still_finds_the_old_one(monkeypatch, tmp_path):
    """The default state directory was ``$TMPDIR/termgym``: a script run from ``$TMPDIR`` (with an
    editable install) imported it as a namespace package named ``termgym``, without ``make``. Its
    name now cannot be imported; ``termgym gc`` still removes what older versions left there."""
    import subprocess
    import sys
    import tempfile

    from termgym.sandboxes.local import sandbox_root_dir
    from termgym.sandboxes.local.leftovers import collect_sandboxes

    monkeypatch.delenv("TERMGYM_SANDBOX_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = sandbox_root_dir()
    assert root.parent == tmp_path and not root.name.isidentifier()
    (root / "cache").mkdir(parents=True)
    script = "import termgym; print(termgym.make.__module__)"
    ran = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert ran.returncode == 0 and ran.stdout.strip() == "termgym.env", ran.stderr
    left = tmp_path / "termgym" / "tg-demo-old"  # a killed run of an older version left it
    left.mkdir(parents=True)
    (left / "labels.json").write_text('{"termgym": "1"}')
    assert ("tg-demo-old", False) in collect_sandboxes()
    assert not left.exists()
