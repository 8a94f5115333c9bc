"""Red team, resources on the embedded backend (Docker always had the engine's limits): a process
storm, a memory hog and a disk filler are held to the task's limits, and the record says which
limit the sandbox reached.

Each attack is bounded even if its limit failed (1,000 sleeping processes, 1 GB of memory, 200 MB
of disk, all gone with the sandbox), so a broken defence cannot take the test machine down.
"""

from __future__ import annotations

import pytest

from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from tests.helpers import write_task
from tests.redteam.helpers import attack, running_as_root

pytestmark = [pytest.mark.redteam]
limits_need_root = pytest.mark.skipif(
    not running_as_root(), reason="cgroups and a sized file system need root on the embedded backend"
)


def _warned(record, fragment: str) -> bool:
    return any(fragment in warning for warning in record.warnings)


@limits_need_root
async def test_a_process_storm_is_capped_and_recorded(tmp_path, no_leaks):
    task = write_task(tmp_path)
    # Under dash (the image's sh), which gives up at the first refused fork: bash retries a refused
    # fork for 15 s (1 + 2 + 4 + 8) before it gives up, which the test only waited through.
    storm = "sh -c 'for i in $(seq 1000); do sleep 30 & done' 2>/dev/null; echo $? > /app/status"
    record = await attack(task, "local", storm, "echo done > /app/result.txt", command_timeout=60)
    assert record.error is None and record.resolved, record.error  # verified all the same
    assert _warned(record, "process limit (512)"), record.warnings


@limits_need_root
async def test_a_memory_hog_is_killed_and_recorded(tmp_path, no_leaks):
    task = write_task(tmp_path, environment_toml="memory_mb = 96")
    hog = "head -c 1000000000 /dev/zero | tail > /dev/null; echo hog-exit=$?"
    record = await attack(task, "local", hog, "echo done > /app/result.txt", command_timeout=60)
    assert record.error is None and record.resolved, record.error
    assert _warned(record, "memory limit (96 MB)"), record.warnings


@limits_need_root
async def test_a_disk_filler_hits_the_storage_limit(tmp_path, no_leaks):
    """The file stops at the task's storage; a verifier that then has no room to run is the agent's
    doing (reward 0, kept), and the record says the limit was reached."""
    task = load_task(write_task(tmp_path, environment_toml="storage_mb = 32"))
    async with AsyncTerminalEnv(task, EnvOptions()) as env:
        await env.reset()
        observation, *_ = await env.step("head -c 200000000 /dev/zero > /app/big; wc -c < /app/big")
        _, reward, _, _, info = await env.step(SUBMIT)
    assert "No space left on device" in observation and int(observation.split()[-1]) <= 32 << 20
    assert reward == 0.0 and info["error"]["kind"] == "broken_by_agent"
    assert "the sandbox reached its storage limit (32 MB)" in info["warnings"]


async def test_a_limit_that_cannot_be_enforced_is_a_warning_not_silence(tmp_path, no_leaks, monkeypatch):
    """Where cgroups or a sized file system are unavailable (not root, no loop device), the record
    says which limit is not enforced."""
    from termgym.sandboxes import limits
    from termgym.sandboxes.local import storage

    monkeypatch.setattr(limits, "find_hierarchies", lambda *args, **kwargs: {})

    async def no_loop_device(*args, **kwargs):
        raise OSError("the host has no loop devices (/dev/loop-control)")

    monkeypatch.setattr(storage.SizedFilesystem, "create", no_loop_device)
    record = await attack(write_task(tmp_path), "local", "echo done > /app/result.txt")
    assert record.resolved
    for fragment in (
        "memory limit not enforced",
        "process-count limit not enforced",
        "CPU limit not enforced",
        "storage limit enforced per file only",
    ):
        assert _warned(record, fragment), record.warnings
