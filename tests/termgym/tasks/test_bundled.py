"""Every bundled task is sound on every backend: the reference solution resolves it, doing nothing
does not."""

from __future__ import annotations

import hashlib

import pytest

from termgym.agents import NullAgent, OracleAgent
from termgym.episode.options import EnvOptions
from termgym.tasks import discover_tasks, load_task
from termgym.tasks.bundled import bundled_root, bundled_task_paths
from termgym.trial import run_trial

TASKS = bundled_task_paths()
IDS = [f"{p.parent.name}/{p.name}" for p in TASKS]


def test_there_are_enough_tasks_in_enough_families():
    tasks = discover_tasks(bundled_root())
    assert len(tasks) >= 12
    assert len({t.family for t in tasks}) >= 3


@pytest.mark.parametrize("path", TASKS, ids=IDS)
async def test_oracle_resolves_every_assertion(path, backend, no_leaks):
    record = await run_trial(load_task(path), OracleAgent(), EnvOptions(backend=backend, run_id="bundled"))
    assert record.error is None, record.error
    assert record.resolved and record.passed == record.total
    assert 3 <= record.total <= 8
    assert record.report_format == "ctrf"


@pytest.mark.parametrize("path", TASKS, ids=IDS)
async def test_null_agent_fails_an_assertion(path, backend, no_leaks):
    record = await run_trial(load_task(path), NullAgent(), EnvOptions(backend=backend, run_id="bundled"))
    assert record.error is None, record.error
    assert not record.resolved and record.passed < record.total


@pytest.mark.parametrize("path", TASKS, ids=IDS)
def test_no_test_or_solution_file_is_in_the_environment(path):
    def digests(directory):
        return {hashlib.sha256(f.read_bytes()).hexdigest() for f in directory.rglob("*") if f.is_file()}

    visible = digests(path / "environment")
    assert not visible & digests(path / "tests")
    assert not visible & digests(path / "solution")
