"""Red team, erasure on Docker: the agent makes a harness step fail so that its failed episode is
recorded as the infrastructure's fault (``sandbox_error``), which the scheduler retries and never
keeps in the batch.

A path longer than PATH_MAX anywhere in the container makes the engine's diff fail; an artifacts
archive whose entries conflict (a path as a file and as a directory) makes the upload into a
separate verifier's fresh container fail; a hook the image's entrypoint runs holds the keeper back
past the kill step's wait. Once the agent has acted, such a failure is the agent's:
reward 0, an error kind that names it (or no error and the honest grade), kept and never retried.
"""

from __future__ import annotations

import pytest

from termgym.agents import ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.sandboxes.pacing import Pacer
from termgym.scheduling.pool import TaskPool, make_nodes
from termgym.scheduling.runners import TrialRunner
from termgym.scheduling.scheduler import RolloutScheduler, SchedulerConfig
from termgym.tasks import load_task
from tests.helpers import write_task
from tests.redteam.helpers import attack, forged
from tests.redteam.plants import HOOK_DIR, HOOKED_ENTRYPOINT, HOOKED_ENTRYPOINT_SCRIPT, files_archive, planted_tar

pytestmark = [pytest.mark.redteam, pytest.mark.docker]

# 30 nested directories of 200-character names under /root: a path of about 6,000 characters,
# past PATH_MAX (4096), built one relative step at a time.
BEYOND_PATH_MAX = (
    'n=$(printf "x%.0s" $(seq 200)); cd /root && for i in $(seq 30); do mkdir "$n" && cd "$n" || break; done; cd /'
)
AGENTS_KINDS = ("broken_by_agent", "tampered", "verifier_error", None)


@pytest.fixture
def backend() -> str:
    return "docker"


def kind(record) -> str | None:
    return None if record.error is None else record.error["kind"]


async def test_a_path_beyond_path_max_does_not_make_the_trial_an_infrastructure_fault(task_dir, backend, no_leaks):
    record = await attack(task_dir, backend, BEYOND_PATH_MAX)
    assert kind(record) in AGENTS_KINDS, record.error
    assert not forged(record), record


async def test_a_path_beyond_path_max_is_kept_in_the_batch_not_retried(task_dir, backend, no_leaks):
    pacer = Pacer()
    runner = TrialRunner(ScriptedAgent((BEYOND_PATH_MAX,)), EnvOptions(backend=backend, run_id="redteam"), pacer)
    config = SchedulerConfig(batch_size=1, mode="wait", nodes=make_nodes([1]), retries=1)
    scheduler = RolloutScheduler(runner, TaskPool([load_task(task_dir)], shuffle=False), config, pacer=pacer)
    result = await scheduler.step()
    assert [kind(k.record) in AGENTS_KINDS for k in result.kept] == [True], [k.record.error for k in result.kept]
    assert not any(forged(k.record) for k in result.kept)
    assert pacer.granted == 1  # one sandbox: the failure was not erased by a retry


async def test_conflicting_artifacts_do_not_make_a_separate_verification_an_infrastructure_fault(
    tmp_path, backend, no_leaks
):
    """The archive of the artifacts is made by the container's ``tar``, which the agent (root
    there) replaces with one that prints an archive of its own: ``app/out`` as a file, then
    ``app/out/x`` under it, which no fresh container can hold."""
    replace_tar = planted_tar("/usr/bin/tar", files_archive("app/out", "app/out/x"))
    task = write_task(tmp_path, verifier_toml='environment_mode = "separate"', top_toml='artifacts = ["/app/out"]')
    record = await attack(task, backend, "echo x > /app/out", replace_tar)
    assert kind(record) in AGENTS_KINDS, record.error
    assert not forged(record), record


async def test_a_keeper_held_back_by_an_entrypoint_hook_is_not_an_infrastructure_fault(
    tmp_path, backend, no_leaks, monkeypatch
):
    """The image's entrypoint runs the hooks in /docker-entrypoint.d before it starts the keeper;
    the agent's hook sleeps, so the engine never lists a keeper after the kill step's restart. (The
    wait for it is cut to 3 s here, so the test does not sit out the real 30 s.)"""
    from termgym.sandboxes.docker import sandbox as docker

    monkeypatch.setattr(docker, "RESTART_TIMEOUT", 3.0)
    task = write_task(
        tmp_path,
        dockerfile=f"FROM debian:bookworm-slim\nWORKDIR /app\n{HOOKED_ENTRYPOINT}",
        extra_files={"environment/entry.sh": HOOKED_ENTRYPOINT_SCRIPT},
    )
    record = await attack(task, backend, f"echo 'sleep 3600' > {HOOK_DIR}/50-hold.sh")
    assert kind(record) in AGENTS_KINDS, record.error
    assert not forged(record), record
