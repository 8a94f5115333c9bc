"""The embedded backend's prepared-environment cache on real sandboxes: a task's RUN steps run once
per content hash, every later sandbox starts from the result copy-on-write and privately; the
cache is invalidated by any byte, safe under concurrent sandboxes and processes, bounded, and
cleaned by ``termgym gc``, also after a process holding one of its entries was SIGKILLed."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from termgym.episode.spec import sandbox_spec
from termgym.sandboxes import remove_leftovers
from termgym.sandboxes.base import Sandbox
from termgym.sandboxes.limits import SandboxCgroup
from termgym.sandboxes.local import LocalSandbox, env_cache
from termgym.sandboxes.local.env_cache import EnvCache, environment_key, mounted_lower_dirs
from termgym.tasks import load_task
from tests.helpers import sandbox_processes, write_task

ROOT = Path(__file__).resolve().parents[4]
# RUN leaves a stamp no two preparations share: the same stamp in two sandboxes means one preparation.
DOCKERFILE = (
    "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY data.txt /app/\nRUN cat /proc/sys/kernel/random/uuid > /app/stamp\n"
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="copy-on-write starts need root (overlay mounts)")


def make_task(root: Path, name: str = "cached", data: str = "one\n", dockerfile: str = DOCKERFILE) -> Path:
    return write_task(root, name, dockerfile=dockerfile, extra_files={"environment/data.txt": data})


def sandbox_for(task_dir: Path) -> LocalSandbox:
    return LocalSandbox(sandbox_spec(load_task(task_dir), run_id="cache-test"))


async def sh(sandbox: Sandbox, script: str) -> str:
    result = await sandbox.exec(["/bin/sh", "-c", script], timeout=30)
    assert result.exit_code == 0, result.text
    return result.text


def cache(root: Path) -> EnvCache:
    return EnvCache(root / "envs", max_bytes=1 << 40, max_entries=1000)


@needs_root
async def test_later_sandboxes_start_from_the_prepared_environment_each_privately(tmp_path: Path, cache_dir: Path):
    task = make_task(tmp_path)
    async with sandbox_for(task) as first:
        assert "prepared" not in first.image  # prepared here, then kept
        stamp = await sh(first, "cat /app/stamp")
        await sh(first, "echo mine > /app/written; rm /app/data.txt; echo changed > /app/stamp")
    (entry,) = cache(cache_dir).entries()
    async with sandbox_for(task) as second, sandbox_for(task) as third:
        assert second.image["prepared"] == third.image["prepared"] == entry.key[:16]
        # The RUN step did not run again: its stamp is the first preparation's, as it was before
        # the first sandbox changed it; nothing the first one did is here.
        assert await sh(second, "cat /app/stamp") == stamp
        assert await sh(second, "cat /app/data.txt; test ! -e /app/written && echo clean") == "one\nclean\n"
        await sh(second, "echo second > /app/written; rm /app/data.txt; mkdir -p /opt/new")
        # A sandbox started beside it sees none of that: its writes are its own.
        assert await sh(third, "cat /app/data.txt; ls /app; ls /opt") == "one\ndata.txt\nstamp\n"
        assert second.env == third.env and second.workdir == third.workdir == "/app"
    # The entry itself never changed.
    assert sorted(p.name for p in (entry.tree / "app").iterdir()) == ["data.txt", "stamp"]
    assert (entry.tree / "app" / "stamp").read_text() == stamp


@needs_root
async def test_any_byte_of_the_environment_makes_a_new_preparation(tmp_path: Path, cache_dir: Path):
    task = make_task(tmp_path)
    async with sandbox_for(task) as sandbox:
        before = await sh(sandbox, "cat /app/stamp /app/data.txt")
    (task / "environment" / "data.txt").write_text("onf\n")  # one byte, same size
    async with sandbox_for(task) as sandbox:
        assert "prepared" not in sandbox.image  # prepared again
        after = await sh(sandbox, "cat /app/stamp /app/data.txt")
    assert after.endswith("onf\n") and after.split()[0] != before.split()[0]
    (task / "environment" / "Dockerfile").write_text(DOCKERFILE + "ENV EXTRA=1\n")
    async with sandbox_for(task) as sandbox:
        assert "prepared" not in sandbox.image and sandbox.env["EXTRA"] == "1"
    assert len(cache(cache_dir).entries()) == 3


def test_the_key_covers_contents_modes_links_and_the_build_environment(tmp_path: Path):
    context = tmp_path / "context"
    context.mkdir()
    (context / "a.sh").write_text("echo a\n")
    keys = {environment_key(b"FROM x\n", context, {}, ["app"])}
    keys.add(environment_key(b"FROM y\n", context, {}, ["app"]))
    keys.add(environment_key(b"FROM x\n", context, {"A": "1"}, ["app"]))
    keys.add(environment_key(b"FROM x\n", context, {}, ["app", "srv"]))
    (context / "a.sh").chmod(0o755)
    keys.add(environment_key(b"FROM x\n", context, {}, ["app"]))
    (context / "link").symlink_to("a.sh")
    keys.add(environment_key(b"FROM x\n", context, {}, ["app"]))
    assert len(keys) == 6
    assert environment_key(b"FROM x\n", context, {}, ["app"]) in keys  # and it is stable


def test_the_key_reads_the_host_packages_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    packages = tmp_path / "status"
    packages.write_text("Package: a\nVersion: 1\n")
    os.utime(packages, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    monkeypatch.setattr(env_cache, "_PACKAGES", packages)
    before = environment_key(b"FROM x\n", None, {}, ["app"])
    packages.write_text("Package: a\nVersion: 2\n")  # the same size, its times put back
    os.utime(packages, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    assert environment_key(b"FROM x\n", None, {}, ["app"]) != before


@needs_root
async def test_concurrent_sandboxes_prepare_once(tmp_path: Path, cache_dir: Path):
    task = make_task(tmp_path)
    sandboxes = [sandbox_for(task) for _ in range(5)]
    try:
        await asyncio.gather(*(sandbox.start() for sandbox in sandboxes))
        stamps = {await sh(sandbox, "cat /app/stamp") for sandbox in sandboxes}
        assert len(stamps) == 1
        assert sum("prepared" not in sandbox.image for sandbox in sandboxes) == 1
    finally:
        await asyncio.gather(*(sandbox.stop() for sandbox in sandboxes))
    assert len(cache(cache_dir).entries()) == 1


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from termgym.episode.spec import sandbox_spec
    from termgym.sandboxes.local import LocalSandbox
    from termgym.tasks import load_task

    async def main():
        sandbox = LocalSandbox(sandbox_spec(load_task(sys.argv[1]), run_id="cache-test"))
        async with sandbox:
            result = await sandbox.exec(["cat", "/app/stamp"], timeout=30)
            print(result.text.strip(), sandbox.host_dir, flush=True)
            if sys.argv[2] == "hold":
                await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def child(task: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(task), mode], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=os.environ
    )


@needs_root
async def test_processes_at_once_prepare_once(tmp_path: Path, cache_dir: Path):
    task = make_task(tmp_path)
    children = [child(task, "once") for _ in range(3)]
    outputs = [process.communicate(timeout=120)[0].split() for process in children]
    assert all(process.returncode == 0 for process in children)
    assert len({stamp for stamp, _ in outputs}) == 1
    assert len(cache(cache_dir).entries()) == 1


def fake_entry(root: Path, key: str, size: int, used_at: int) -> None:
    """A complete entry of ``size`` bytes (by its ``meta.json``), last used at ``used_at`` seconds."""
    (root / key / "tree").mkdir(parents=True)
    meta = root / key / "meta.json"
    meta.write_text(json.dumps({"owner": 0, "roots": ["app"], "env": {}, "workdir": "/app", "bytes": size}))
    os.utime(meta, ns=(used_at * 10**9, used_at * 10**9))


def test_over_the_byte_budget_the_least_recently_used_go_until_it_fits(tmp_path: Path):
    root = tmp_path / "envs"
    for used_at, key in enumerate(["a", "b", "c", "d"], start=1):
        fake_entry(root, key, 100, used_at)
    envs = EnvCache(root, max_bytes=250, max_entries=100)
    assert envs.lookup("a") is not None  # used now: the most recently used
    assert envs.evict() == ["b", "c"]  # 400 bytes: the two least recently used, then 200 fit
    assert [e.key for e in envs.entries()] == ["d", "a"] and not (root / "b").exists()
    assert EnvCache(root, max_bytes=100, max_entries=100).evict(keep="d") == ["a"]  # never the one kept
    assert EnvCache(root, max_bytes=1000, max_entries=0).evict(keep="d") == []  # it stays, over the count too
    assert [e.key for e in envs.entries()] == ["d"]


async def publish(envs: EnvCache, key: str, source: Path) -> None:
    """Keep ``source``'s ``app`` as the entry ``key``, as a trial that prepared it does."""
    async with envs.building(key, 10) as found:
        assert found is None
        assert await envs.publish(key, source, owner=os.getuid(), roots=["app"], env={}, workdir="/app")


def app_source(tmp_path: Path) -> Path:
    (tmp_path / "src" / "app").mkdir(parents=True)
    (tmp_path / "src" / "app" / "data.txt").write_text("one\n")
    return tmp_path / "src"


def on_disk(root: Path) -> set[str]:
    return {path.name for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")}


async def test_a_publish_into_a_full_cache_reads_no_other_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root, source = tmp_path / "envs", app_source(tmp_path)
    old = [f"old{i:03d}" for i in range(256)]
    for used_at, key in enumerate(old, start=1):
        fake_entry(root, key, 100, used_at)
    envs = EnvCache(root, max_bytes=1 << 40, max_entries=256)
    assert envs.evict() == []  # a full pass: counts them
    touched: list[str] = []  # the entries whose meta.json a publish reads or stats
    read, mtime = EnvCache._read, env_cache.mtime_ns
    monkeypatch.setattr(EnvCache, "_read", lambda self, key: touched.append(key) or read(self, key))
    monkeypatch.setattr(env_cache, "mtime_ns", lambda path: touched.append(path.parent.name) or mtime(path))
    per_publish = []
    for i in range(40):
        touched.clear()
        await publish(envs, f"new{i:03d}", source)
        per_publish.append(len(set(touched) - {f"new{i:03d}"}))
        assert on_disk(root) == {*old[i + 1 :], *(f"new{j:03d}" for j in range(i + 1))}  # the oldest went
    # One entry read per eviction (the least recently used the last full pass noted), and one full
    # pass once the 32 it noted are gone; before, every publish read all 256.
    assert per_publish == [1] * 32 + [256] + [1] * 7, per_publish


async def test_an_entry_used_since_the_last_full_pass_is_not_evicted_as_the_oldest(tmp_path: Path):
    root, source = tmp_path / "envs", app_source(tmp_path)
    for used_at, key in enumerate("abcd", start=1):
        fake_entry(root, key, 100, used_at)
    envs = EnvCache(root, max_bytes=1 << 40, max_entries=4)
    assert envs.evict() == []  # notes a, b, c, d as the next to evict
    assert envs.lookup("a") is not None  # used now: b is the least recently used
    await publish(envs, "e", source)
    await publish(envs, "f", source)
    assert on_disk(root) == {"a", "d", "e", "f"}


@pytest.mark.parametrize("bound", ["entries", "bytes"])
async def test_two_caches_on_one_root_keep_its_bounds_together(tmp_path: Path, bound: str):
    root, source = tmp_path / "envs", app_source(tmp_path)
    await publish(EnvCache(root, max_bytes=1 << 40, max_entries=100), "first", source)
    size = EnvCache(root, max_bytes=0, max_entries=0).lookup("first")
    assert size is not None
    limits = (
        {"max_bytes": 1 << 40, "max_entries": 3}
        if bound == "entries"
        else {"max_bytes": 3 * size.bytes, "max_entries": 100}
    )
    one, other = EnvCache(root, **limits), EnvCache(root, **limits)
    keys = [f"k{i}" for i in range(8)]
    for i, key in enumerate(keys):
        await publish(one if i % 2 else other, key, source)
        assert on_disk(root) == set((["first", *keys][: i + 2])[-3:])
    (root / ".usage").write_text("{")  # as a crash cuts it: the next publish counts afresh
    await publish(one, "after-a-crash", source)
    assert on_disk(root) == {"k6", "k7", "after-a-crash"}
    assert EnvCache(root, max_bytes=0, max_entries=0).clear() == (3, 0)  # counts nothing: too many counted
    await publish(other, "after-gc", source)
    await publish(other, "then", source)
    assert on_disk(root) == {"after-gc", "then"}
    assert json.loads((root / ".usage").read_text())["entries"] == 2


async def test_nothing_is_kept_while_another_process_counts_the_cache(tmp_path: Path):
    root, source = tmp_path / "envs", app_source(tmp_path)
    root.mkdir()
    with (root / ".usage").open("a") as usage:
        fcntl.flock(usage, fcntl.LOCK_EX)  # another process counting (publishing or evicting)
        kept = asyncio.create_task(publish(EnvCache(root, max_bytes=1 << 40, max_entries=10), "new", source))
        await asyncio.sleep(1)
        assert not kept.done() and on_disk(root) == set()
    await kept
    assert on_disk(root) == {"new"} and json.loads((root / ".usage").read_text())["entries"] == 1


PUBLISHER = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from termgym.sandboxes.local.env_cache import EnvCache

    async def main():
        envs = EnvCache(Path(sys.argv[1]), max_bytes=1 << 40, max_entries=4)
        for i in range(20):
            key = f"{sys.argv[3]}{i}"
            async with envs.building(key, 30):
                await envs.publish(key, Path(sys.argv[2]), owner=os.getuid(), roots=["app"], env={}, workdir="/app")

    asyncio.run(main())
    """
)


async def test_processes_publishing_at_once_keep_the_bounds_and_count_no_fewer_than_there_are(tmp_path: Path):
    root, source = tmp_path / "envs", app_source(tmp_path)
    argv = [sys.executable, "-c", PUBLISHER, str(root), str(source)]
    children = [subprocess.Popen([*argv, name], cwd=ROOT, env=os.environ) for name in ("one-", "other-")]
    assert [child.wait(timeout=120) for child in children] == [0, 0]
    assert len(on_disk(root)) == 4
    assert json.loads((root / ".usage").read_text())["entries"] == 4


def cached_data(root: Path) -> set[str]:
    return {(entry.tree / "app" / "data.txt").read_text().strip() for entry in cache(root).entries()}


async def start_stop(task: Path) -> bool:
    """Start and stop a sandbox of ``task``; True when it started from a prepared environment."""
    async with sandbox_for(task) as sandbox:
        return "prepared" in sandbox.image


@needs_root
async def test_least_recently_used_go_first_and_entries_in_use_stay(tmp_path: Path, cache_dir: Path, monkeypatch):
    monkeypatch.setenv("TERMGYM_ENV_CACHE_ENTRIES", "2")
    tasks = [make_task(tmp_path, f"t{i}", data=f"{i}\n") for i in range(5)]
    assert not await start_stop(tasks[1]) and not await start_stop(tasks[2])
    assert await start_stop(tasks[1])  # used again: t2 is now the least recently used
    assert not await start_stop(tasks[3])
    assert cached_data(cache_dir) == {"1", "3"}
    async with sandbox_for(tasks[1]) as held:  # started from t1's entry, which it keeps in use
        assert "prepared" in held.image
        assert await start_stop(tasks[3])  # t1 is now the least recently used, but in use
        assert not await start_stop(tasks[4])
        assert cached_data(cache_dir) == {"1", "4"}
        assert await sh(held, "cat /app/data.txt") == "1\n"
    # Over the byte budget nothing is kept.
    monkeypatch.setenv("TERMGYM_ENV_CACHE_MB", "0")
    assert not await start_stop(make_task(tmp_path, "big", data="big\n"))
    assert "big" not in cached_data(cache_dir)


@needs_root
async def test_gc_removes_unused_entries_and_what_a_killed_process_left(tmp_path: Path, cache_dir: Path):
    task = make_task(tmp_path)
    async with sandbox_for(task):
        pass
    holder = child(task, "hold")
    assert holder.stdout is not None
    _stamp, host_dir = holder.stdout.readline().split()
    (entry,) = cache(cache_dir).entries()
    assert str(entry.tree) in mounted_lower_dirs()
    staging = cache_dir / "envs" / f".staging-{holder.pid}-deadbeef"
    staging.mkdir()
    # A process of the sandbox that outlives the run, as a keeper can: it is in the sandbox's
    # cgroup, and no file names it.
    cgroup = SandboxCgroup.find(f"termgym-{Path(host_dir).name}")
    assert cgroup is not None
    outlived = subprocess.Popen(["sleep", "600"], start_new_session=True)
    for procs in cgroup.procs_files:
        Path(procs).write_text(str(outlived.pid))
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    assert holder.stdout is not None
    holder.stdout.close()
    # The killed process's sandbox still has the entry mounted: gc removes the sandbox, then the entry.
    line = await remove_leftovers("local")
    assert line == "removed 1 leftover local sandbox(es) and 1 prepared environment(s)", line
    assert not Path(host_dir).exists() and not entry.path.exists() and not staging.exists()
    assert str(entry.tree) not in mounted_lower_dirs()
    assert outlived.wait(timeout=5) == -signal.SIGKILL
    assert SandboxCgroup.find(f"termgym-{Path(host_dir).name}") is None
    assert not [p for p in sandbox_processes() if host_dir in p]


@needs_root
async def test_cache_off_prepares_every_time(tmp_path: Path, cache_dir: Path, monkeypatch):
    monkeypatch.setenv("TERMGYM_ENV_CACHE", "0")
    task = make_task(tmp_path)
    async with sandbox_for(task) as first, sandbox_for(task) as second:
        assert await sh(first, "cat /app/stamp") != await sh(second, "cat /app/stamp")
    assert not (cache_dir / "envs").exists() or not cache(cache_dir).entries()


@needs_root
async def test_where_no_overlay_can_name_the_entry_a_copy_of_it_is_started(tmp_path: Path, no_leaks, monkeypatch):
    root = Path(f"/tmp/termgym test envcache {os.getpid()}")  # a space: no overlay option can name it
    monkeypatch.setenv("TERMGYM_ENV_CACHE_DIR", str(root))
    try:
        task = make_task(tmp_path)
        async with sandbox_for(task) as first:
            stamp = await sh(first, "cat /app/stamp")
        async with sandbox_for(task) as second:
            assert "prepared" in second.image and any("a copy of the prepared" in w for w in second.warnings)
            assert await sh(second, "cat /app/stamp; echo mine > /app/written") == stamp
        (entry,) = cache(root).entries()
        assert sorted(p.name for p in (entry.tree / "app").iterdir()) == ["data.txt", "stamp"]
    finally:
        EnvCache(root / "envs", max_bytes=0, max_entries=0).clear()
        subprocess.run(["rm", "-rf", str(root)], check=True)


async def test_a_cache_that_cannot_be_used_is_a_warning_and_a_fresh_preparation(tmp_path: Path, no_leaks, monkeypatch):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("TERMGYM_ENV_CACHE_DIR", str(blocked))
    async with sandbox_for(make_task(tmp_path)) as sandbox:
        assert "prepared" not in sandbox.image
        assert any("cache was not used" in w for w in sandbox.warnings), sandbox.warnings
        assert await sh(sandbox, "cat /app/data.txt") == "one\n"
