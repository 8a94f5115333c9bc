"""The embedded backend with many sandboxes alive on one machine (issue 43, "Scale on one machine"):
a sandbox's storage and overlay are mounted in a mount namespace of its own, so the host's mount
table, which the bubblewrap of every keeper started later copies and reads once per bind, does not
grow with the sandboxes alive; its keepers start in that namespace, the host reaches its files
through it, a prepared environment under it is never evicted, and everything mounted ends with it.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from termgym.episode.spec import sandbox_spec
from termgym.sandboxes.base import Sandbox
from termgym.sandboxes.local import LocalSandbox
from termgym.sandboxes.local.commands import keeper_argv, within_limits
from termgym.sandboxes.local.namespace import namespace_mountinfos
from termgym.tasks import load_task
from tests.helpers import write_task

ROOT = Path(__file__).resolve().parents[4]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox's own mounts need root")
# A RUN step: every sandbox but the first starts from the prepared environment, an overlay; storage
# larger than a quarter of the memory: an ext4 image on a loop device. Two mounts a sandbox.
DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\nRUN echo prepared > /app/stamp\n"
RESOURCES = "memory_mb = 256\nstorage_mb = 128\n"


def sandbox_for(task_dir: Path) -> LocalSandbox:
    return LocalSandbox(sandbox_spec(load_task(task_dir), run_id="scale-test"))


def home_of(sandbox: LocalSandbox) -> str:
    assert sandbox.host_dir is not None  # started
    return os.path.realpath(sandbox.host_dir)


def mounted_under(table: str, home: str) -> list[str]:
    """The file-system types mounted at or below ``home`` in a mount table."""
    found = []
    for line in table.splitlines():
        fields, _, tail = line.partition(" - ")
        point = fields.split()[4]
        if point == home or point.startswith(home + "/"):
            found.append(tail.split()[0])
    return sorted(found)


async def sh(sandbox: Sandbox, script: str) -> str:
    result = await sandbox.exec(["/bin/sh", "-c", script], timeout=30)
    assert result.exit_code == 0, result.text
    return result.text


@needs_root
async def test_live_sandboxes_mount_nothing_in_the_host_table_nor_in_each_others(tmp_path: Path, cache_dir: Path):
    task = write_task(tmp_path, dockerfile=DOCKERFILE, environment_toml=RESOURCES)
    sandboxes = [sandbox_for(task) for _ in range(6)]
    try:
        for sandbox in sandboxes:
            await sandbox.start()
        homes = [home_of(sandbox) for sandbox in sandboxes]
        host = Path("/proc/self/mountinfo").read_text()
        assert not any(mounted_under(host, home) for home in homes)  # the host's table does not grow
        for sandbox, home in zip(sandboxes[1:], homes[1:], strict=True):  # started from the prepared environment
            namespace = sandbox._mounts
            assert namespace is not None
            table = namespace.mountinfo()
            assert mounted_under(table, home) == ["ext4", "overlay"]
            # What a keeper copies: the host's mounts and this sandbox's own two, no other sandbox's.
            assert not any(mounted_under(table, other) for other in homes if other != home)
            keeper = sandbox._keeper.process if sandbox._keeper is not None else None
            assert keeper is not None
            assert os.stat(f"/proc/{keeper.pid}/ns/mnt").st_ino == os.stat(namespace.path).st_ino
            assert await sh(sandbox, "cat /app/stamp; echo mine > /app/mine; cat /app/mine") == "prepared\nmine\n"
    finally:
        for sandbox in sandboxes:
            await sandbox.stop()


@needs_root
async def test_the_host_reaches_a_quiet_sandboxs_files_through_its_namespace(tmp_path: Path, cache_dir: Path):
    task = write_task(tmp_path, dockerfile=DOCKERFILE, environment_toml=RESOURCES)
    async with sandbox_for(task):
        pass  # prepares the environment
    sandbox = sandbox_for(task)
    async with sandbox:
        await sh(sandbox, "echo agent > /app/out.txt; head -c 1048576 /dev/zero > /app/big")
        await sandbox.kill_agent_processes()
        assert sandbox.host_files() is not None  # quiet: read from the host
        archive = tarfile.open(fileobj=io.BytesIO(await sandbox.download_tar(["/app/out.txt"], limit=1 << 20)))
        member = archive.extractfile("app/out.txt")
        assert member is not None and member.read() == b"agent\n"
        assert {"/app/out.txt", "/app/big"} <= set(await sandbox.agent_changes())
        assert (sandbox.files_dir / "app" / "stamp").read_text() == "prepared\n"
        assert sandbox.host_dir is not None and not (sandbox.host_dir / "root" / "app").exists()  # not the host's
        assert await sandbox.limit_warnings() == []  # the storage's room, read through the namespace


@needs_root
async def test_everything_mounted_ends_with_the_sandbox(tmp_path: Path, cache_dir: Path):
    task = write_task(tmp_path, dockerfile=DOCKERFILE, environment_toml=RESOURCES)
    sandbox = sandbox_for(task)
    await sandbox.start()
    home, namespace = home_of(sandbox), sandbox._mounts
    assert namespace is not None
    image = f"{home}/fs.img"
    assert image in loop_backing_files()
    await sandbox.stop()
    assert namespace.closed
    assert not any(mounted_under(table, home) for table in namespace_mountinfos())
    for _ in range(100):  # the kernel detaches the loop device once its file system is released
        if image not in loop_backing_files():
            break
        await asyncio.sleep(0.05)
    assert image not in loop_backing_files()


def loop_backing_files() -> set[str]:
    found = set()
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            found.add(backing.read_text().strip().removesuffix(" (deleted)"))
        except OSError:
            continue
    return found


@needs_root
async def test_a_prepared_environment_under_an_idle_sandbox_is_never_evicted(tmp_path: Path, cache_dir: Path):
    """No process is in the sandbox's namespace once every keeper is ended: its shared lock on the
    entry keeps another process's eviction away, until it stops."""
    task = write_task(tmp_path, dockerfile=DOCKERFILE, environment_toml=RESOURCES)
    async with sandbox_for(task):
        pass  # prepares the environment
    clear = textwrap.dedent(f"""\
        from pathlib import Path
        from termgym.sandboxes.local.env_cache import EnvCache
        print(*EnvCache(Path({str(cache_dir / "envs")!r}), max_bytes=0, max_entries=0).clear())
    """)

    def clear_elsewhere() -> str:
        run = subprocess.run([sys.executable, "-c", clear], capture_output=True, text=True, check=True, cwd=ROOT)
        return run.stdout.strip()

    sandbox = sandbox_for(task)
    async with sandbox:
        await sandbox.kill_agent_processes()  # the spare takes over
        await sh(sandbox, "true")
        await sandbox.kill_agent_processes()  # no spare left: no keeper, no process in the namespace
        assert sandbox._keeper is not None and sandbox._keeper.pid is None
        assert await asyncio.to_thread(clear_elsewhere) == "0 1"  # none removed, one in use
        assert (sandbox.files_dir / "app" / "stamp").read_text() == "prepared\n"
    assert await asyncio.to_thread(clear_elsewhere) == "1 0"


def test_a_keeper_starts_in_the_sandboxs_namespace_as_root_before_its_uid_changes():
    argv = within_limits(keeper_argv(Path("/s/fs"), ["app"]), (), None, mount_namespace="/proc/7/fd/9", uid=1 << 20)
    split = argv.index("--")
    assert {"mount=/proc/7/fd/9", f"uid={1 << 20}"} <= set(argv[:split]) and argv[split + 1].endswith("/bwrap")
    guard = argv[2]  # the guard's script enters the namespace while it is still root, then changes its uid
    assert guard.index("defined $set{mount}") < guard.index("defined $set{uid}")
    plain = within_limits(keeper_argv(Path("/s/fs"), ["app"]), (), None)
    assert not any(arg.startswith(("mount=", "uid=")) for arg in plain[: plain.index("--")])
