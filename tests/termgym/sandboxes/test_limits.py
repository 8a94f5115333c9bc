"""The embedded backend's resource limits: which cgroup files get which values (v1 and v2, on a
file-system layout), what a real cgroup on this host enforces, and the sized file system."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from termgym.sandboxes.limits import (
    PIDS_LIMIT,
    SandboxCgroup,
    event_counts,
    find_hierarchies,
    limit_files,
    parse_proc_cgroup,
)
from termgym.tasks import Resources

V1_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_PROC = "8:pids:/\n4:memory:/jobs/42\n1:cpu:/\n0::/\n"
V2_MOUNTINFO = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V2_PROC = "0::/user.slice/run.scope\n"


def test_parse_proc_cgroup():
    assert parse_proc_cgroup("9:name=systemd:/\n4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/d\n") == {
        "name=systemd": "/",
        "memory": "/a/b",
        "cpu": "/c",
        "cpuacct": "/c",
        "0": "/d",
    }


def test_v1_hierarchies_are_one_mount_per_controller(tmp_path):
    (tmp_path / "sys/fs/cgroup/unified").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/unified/cgroup.controllers").write_text("hugetlb\n")
    found = find_hierarchies(V1_MOUNTINFO, V1_PROC, tmp_path)
    assert {c: (h.version, h.mount.relative_to(tmp_path).as_posix(), h.own) for c, h in found.items()} == {
        "cpu": (1, "sys/fs/cgroup/cpu", "/"),
        "memory": (1, "sys/fs/cgroup/memory", "/jobs/42"),
        "pids": (1, "sys/fs/cgroup/pids", "/"),
    }


@pytest.mark.parametrize(
    ("version", "controller", "files"),
    [
        (1, "memory", [("memory.limit_in_bytes", "268435456"), ("memory.memsw.limit_in_bytes", "268435456")]),
        (1, "pids", [("pids.max", str(PIDS_LIMIT))]),
        (1, "cpu", [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "50000")]),
        (2, "memory", [("memory.max", "268435456"), ("memory.swap.max", "0")]),
        (2, "pids", [("pids.max", str(PIDS_LIMIT))]),
        (2, "cpu", [("cpu.max", "50000 100000")]),
    ],
)
def test_limit_files(version, controller, files):
    assert limit_files(version, controller, Resources(cpus=0.5, memory_mb=256)) == files


def fake_v2(root: Path, *, own_has_processes: bool) -> Path:
    """A cgroup v2 tree as the kernel lays it out, the controllers enabled at the top."""
    top = root / "sys/fs/cgroup"
    own = top / "user.slice/run.scope"
    own.mkdir(parents=True)
    (top / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (top / "cgroup.subtree_control").write_text("cpu memory pids\n")
    if own_has_processes:  # the kernel refuses to delegate controllers from a cgroup with processes: EBUSY
        (own / "cgroup.subtree_control").mkdir()  # an OSError on write, for root too
        (top / "termgym").mkdir()  # as the kernel would make it, with its control files
        (top / "termgym/cgroup.subtree_control").write_text("")
    else:
        (own / "cgroup.subtree_control").write_text("")
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(V2_MOUNTINFO)
    (root / "proc/self/cgroup").write_text(V2_PROC)
    return top


def test_v2_falls_back_to_the_top_when_the_own_cgroup_cannot_delegate(tmp_path):
    top = fake_v2(tmp_path, own_has_processes=True)
    cgroup, warnings = SandboxCgroup.create("termgym-tg-x", Resources(cpus=2, memory_mb=512), root=tmp_path)
    assert warnings == [] and cgroup is not None
    assert {v for v, _ in cgroup.dirs.values()} == {2} and {d for _, d in cgroup.dirs.values()} == {
        top / "termgym/termgym-tg-x"
    }


def test_v2_nests_under_the_own_cgroup_and_writes_every_limit(tmp_path):
    top = fake_v2(tmp_path, own_has_processes=False)
    cgroup, warnings = SandboxCgroup.create("termgym-tg-x", Resources(cpus=2, memory_mb=512), root=tmp_path)
    directory = top / "user.slice/run.scope/termgym-tg-x"
    assert warnings == [] and cgroup is not None and cgroup.procs_files == [str(directory / "cgroup.procs")]
    assert cgroup.join_files == cgroup.procs_files  # v2: a domain cgroup has no per-thread file
    assert (top / "user.slice/run.scope/cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert {f: (directory / f).read_text() for f in ("memory.max", "memory.swap.max", "pids.max", "cpu.max")} == {
        "memory.max": str(512 << 20),
        "memory.swap.max": "0",
        "pids.max": str(PIDS_LIMIT),
        "cpu.max": "200000 100000",
    }
    (directory / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    (directory / "pids.events").write_text("max 7\n")
    assert cgroup.limit_warnings() == [
        "the sandbox reached its memory limit (512 MB): 2 process(es) killed",
        f"the sandbox reached its process limit ({PIDS_LIMIT}): 7 fork(s) refused",
    ]


@pytest.mark.parametrize("own_has_processes", [False, True])
def test_find_gives_the_cgroup_where_create_made_it(tmp_path, own_has_processes):
    fake_v2(tmp_path, own_has_processes=own_has_processes)
    made, _ = SandboxCgroup.create("termgym-tg-x", Resources(), root=tmp_path)
    found = SandboxCgroup.find("termgym-tg-x", root=tmp_path)
    assert made is not None and found is not None and found.dirs == made.dirs
    assert SandboxCgroup.find("termgym-tg-y", root=tmp_path) is None


def test_a_host_without_controllers_gives_one_warning_per_limit(tmp_path):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mountinfo").write_text("")
    (tmp_path / "proc/self/cgroup").write_text("0::/\n")
    cgroup, warnings = SandboxCgroup.create("termgym-tg-x", Resources(), root=tmp_path)
    assert cgroup is None and [w.split(":")[0] for w in warnings] == [
        "memory limit not enforced",
        "process-count limit not enforced",
        "CPU limit not enforced",
    ]


@pytest.mark.parametrize(
    ("version", "controller", "name", "text", "count"),
    [
        (1, "memory", "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n", 4),
        (1, "pids", "pids.events", "max 12\n", 12),
        (2, "memory", "memory.events", "oom 1\noom_kill 0\n", 0),
        (1, "cpu", "cpu.stat", "nr_throttled 9\n", 0),
    ],
)
def test_event_counts(tmp_path, version, controller, name, text, count):
    (tmp_path / name).write_text(text)
    assert event_counts(version, controller, tmp_path) == count


@pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root here")
def test_a_real_cgroup_on_this_host_holds_the_limits_and_is_removed():
    cgroup, warnings = SandboxCgroup.create(f"termgym-tg-test-{os.getpid()}", Resources(cpus=0.5, memory_mb=300))
    assert cgroup is not None, warnings
    try:
        values = {}
        for controller, (version, directory) in cgroup.dirs.items():
            for file, _ in limit_files(version, controller, cgroup.resources):
                if (directory / file).exists():
                    values[file] = (directory / file).read_text().strip()
        assert values.get("memory.limit_in_bytes", values.get("memory.max")) == str(300 << 20)
        assert values.get("pids.max") == str(PIDS_LIMIT)
        assert values.get("cpu.cfs_quota_us", values.get("cpu.max", "").split(" ")[0]) == "50000"
        assert cgroup.pids() == set()
        # A single-threaded process joins by writing 0 (itself) into each join file: on v1 the
        # per-thread tasks file, which the kernel moves without its global lock.
        versions = {version for version, _ in cgroup.dirs.values()}
        assert {Path(path).name for path in cgroup.join_files} == {
            "tasks" if v == 1 else "cgroup.procs" for v in versions
        }
        script = "import sys\nfor path in sys.argv[1:]:\n    open(path, 'w').write('0\\n')\nprint(open('/proc/self/cgroup').read())"
        joined = subprocess.run([sys.executable, "-c", script, *cgroup.join_files], capture_output=True, text=True)
        assert joined.returncode == 0, joined.stderr
        for _, directory in cgroup.dirs.values():  # each hierarchy's line names the sandbox's cgroup
            assert f"/{directory.name}\n" in joined.stdout, joined.stdout
    finally:
        cgroup.remove()
    assert not any(Path(path).parent.exists() for path in cgroup.procs_files)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
@pytest.mark.parametrize(
    ("storage_mb", "memory_mb", "fstype"), [(64, 256, "tmpfs"), (65, 256, "ext4"), (1024, 512, "ext4")]
)
async def test_the_storage_is_in_memory_only_when_small_against_the_memory_limit(
    tmp_path, no_leaks, storage_mb, memory_mb, fstype
):
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local import LocalSandbox
    from termgym.sandboxes.local.namespace import namespace_mountinfos

    spec = SandboxSpec(
        name="storage",
        context_dir=None,
        dockerfile=None,
        resources=Resources(memory_mb=memory_mb, storage_mb=storage_mb),
    )

    def mounted_at(mountpoint: str, table: str, field: int = 0) -> list[str]:
        return [line.split(" - ")[1].split()[field] for line in table.splitlines() if line.split()[4] == mountpoint]

    sandbox = LocalSandbox(spec)
    async with sandbox:
        host_dir, namespace = sandbox.host_dir, sandbox._mounts
        assert host_dir is not None and namespace is not None  # started, as root: its own mount namespace
        mountpoint = os.path.realpath(host_dir / "fs")
        assert mounted_at(mountpoint, namespace.mountinfo()) == [fstype]
        assert mounted_at(mountpoint, Path("/proc/self/mountinfo").read_text()) == []  # never in the host's table
        stats = os.statvfs(sandbox.files_dir)
        assert (
            abs(stats.f_blocks * stats.f_frsize - (storage_mb << 20)) <= (storage_mb << 20) // 10
        )  # its size, give or take metadata
        result = await sandbox.exec(["/bin/sh", "-c", "stat -c %u /app; touch /app/x"], timeout=10)
        assert result.exit_code == 0 and result.text.split()[0] == "0"  # the sandbox's root owns it
        if fstype == "ext4":  # its image holds metadata only, no blocks reserved to grow it (376 KB and more)
            image = sandbox._storage.image if sandbox._storage is not None else None
            assert image is not None
            assert image.stat().st_blocks * 512 < 256 << 10, image.stat()
            # never flushed to the host's disk, and no kernel thread zeroing its inode tables
            (options,) = mounted_at(mountpoint, namespace.mountinfo(), 2)
            assert {"nobarrier", "noinit_itable"} <= set(options.split(",")), options
    assert namespace.closed and not any(mounted_at(mountpoint, table) for table in namespace_mountinfos())


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts and cgroups need root")
async def test_gc_removes_what_a_killed_run_left_mounted_and_its_cgroups(sandbox_dir):
    """A run killed with SIGKILL leaves its sandbox directory and its cgroups, and nothing mounted
    (its storage was in the sandbox's own mount namespace, which ended with the run); ``termgym gc``
    (``collect_garbage``) removes both."""
    import asyncio
    import signal
    import sys

    from termgym.sandboxes.local import collect_garbage
    from termgym.sandboxes.local.namespace import namespace_mountinfos

    script = (
        "import asyncio, sys\n"
        "from termgym.sandboxes.base import SandboxSpec\n"
        "from termgym.sandboxes.local import LocalSandbox\n"
        "from termgym.tasks import Resources\n"
        "async def main():\n"
        "    sandbox = LocalSandbox(SandboxSpec(name='gc', context_dir=None, dockerfile=None, resources=Resources(memory_mb=256, storage_mb=32)))\n"
        "    await sandbox.start()\n"
        "    print(sandbox.host_dir, *sandbox._cgroup.procs_files, flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None  # stdout=PIPE
    host_dir, *procs_files = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().split()
    process.send_signal(signal.SIGKILL)
    await process.wait()
    await asyncio.sleep(0.2)  # the keeper dies with its parent
    cgroups = [Path(p).parent for p in procs_files]
    assert Path(host_dir).is_dir() and all(c.is_dir() for c in cgroups)
    assert not any(f" {host_dir}/" in table for table in namespace_mountinfos())  # in no namespace
    assert collect_garbage(sandbox_dir) == 1
    assert not Path(host_dir).exists() and not any(c.exists() for c in cgroups)
