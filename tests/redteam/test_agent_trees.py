"""Red team, file trees shaped to crash termgym: what the agent leaves in its sandbox must never raise
out of termgym.

The embedded backend resets the verifier's directories from the host, and every backend copies the
task's artifacts out into the trial's directory: a directory chain deeper than Python's recursion
limit, a path longer than PATH_MAX, an archive holding ``f`` as a file and ``f/x`` under it. Each
must end as a record (the trial scored honestly, or 0 with an error kind that names the agent, and a
warning where something was not kept), never as an exception out of ``run_trial``, which would lose
the record, nor out of ``run_trials``, which would lose the whole batch's.
"""

from __future__ import annotations

import pytest

from termgym.agents import ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from termgym.trial import run_trials
from tests.helpers import write_task
from tests.redteam.helpers import attack, forged
from tests.redteam.plants import LOCAL_BIN_FIRST, files_archive, planted_tar

pytestmark = [pytest.mark.redteam]

DEPTH = 1500  # past Python's default recursion limit (1000)
AGENTS_KINDS = ("broken_by_agent", "tampered", "verifier_error", None)


def deep_chain(directory: str, depth: int = DEPTH) -> str:
    """A command making a chain of ``depth`` one-letter directories under ``directory``."""
    return f'mkdir -p {directory} && cd {directory} && mkdir -p "$(printf "d/%.0s" $(seq {depth}))"; cd /'


def kind(record) -> str | None:
    return None if record.error is None else record.error["kind"]


@pytest.mark.parametrize("directory", ["/logs/verifier", "/tests", "/tmp/.termgym-verifier"])
async def test_a_directory_chain_deeper_than_the_recursion_limit_does_not_raise(
    task_dir, no_leaks, directory, tmp_path
):
    record = await attack(task_dir, "local", deep_chain(directory), trials_dir=str(tmp_path / "trials"))
    assert not forged(record), record
    assert kind(record) in AGENTS_KINDS, record.error


async def test_a_deep_chain_in_one_trial_loses_no_record_of_the_batch(tmp_path, no_leaks):
    attacked = load_task(write_task(tmp_path, "attacked"))
    honest = load_task(write_task(tmp_path, "honest"))
    jobs = [
        (attacked, ScriptedAgent((deep_chain("/logs/verifier"),))),
        (honest, ScriptedAgent(("echo done > /app/result.txt",))),
    ]
    records = await run_trials(jobs, EnvOptions(backend="local"), concurrency=2)
    assert [r.task for r in records] == ["attacked", "honest"]
    assert not forged(records[0]) and records[1].resolved, records


async def test_an_artifact_path_beyond_path_max_does_not_raise(tmp_path, no_leaks):
    """30 nested 200-character directories under /logs/artifacts: about 6,000 characters, past the
    host's PATH_MAX where the trial's directory unpacks them."""
    beyond = (
        'n=$(printf "x%.0s" $(seq 200)); mkdir -p /logs/artifacts && cd /logs/artifacts'
        ' && for i in $(seq 30); do mkdir "$n" && cd "$n" || break; done; echo deep > f; cd /'
    )
    task = write_task(tmp_path)
    trials = tmp_path / "trials"
    record = await attack(task, "local", beyond, trials_dir=str(trials))
    assert not forged(record) and kind(record) in AGENTS_KINDS, record
    assert any("artifact" in warning for warning in record.warnings), record.warnings


@pytest.mark.parametrize(
    ("backend", "where", "dockerfile"),
    [
        ("local", "/root/.local/bin/tar", LOCAL_BIN_FIRST),
        pytest.param("docker", "/root/.local/bin/tar", LOCAL_BIN_FIRST, marks=pytest.mark.docker),
        pytest.param("docker", "/usr/bin/tar", None, marks=pytest.mark.docker),
    ],
    ids=["local-path-tar", "docker-path-tar", "docker-replaced-tar"],
)
async def test_an_artifacts_archive_with_a_file_under_a_file_does_not_raise(
    tmp_path, backend, where, dockerfile, no_leaks
):
    """The archive of the artifacts is made by the sandbox's tar, found on the image's PATH (or
    replaced, on Docker, where the agent is root over /usr/bin): it holds ``f``, then ``f/x``."""
    task = write_task(tmp_path, **({"dockerfile": dockerfile} if dockerfile else {}))
    trials = tmp_path / "trials"
    record = await attack(
        task,
        backend,
        planted_tar(where, files_archive("logs/artifacts/f", "logs/artifacts/f/x")),
        trials_dir=str(trials),
    )
    assert not forged(record) and kind(record) in AGENTS_KINDS, record
    for kept in record.artifacts:
        assert (trials / record.trial_id / kept).resolve().is_relative_to(trials / record.trial_id), kept
