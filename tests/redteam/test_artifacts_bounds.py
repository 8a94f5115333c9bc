"""Red team, the artifacts' bounds: what a trial copies out of the agent's sandbox onto the host is
bounded by what lands there, not by the size of the archive it travels in.

The archive is made in the sandbox, by a ``tar`` the agent can plant (on the image's PATH, or in
place of /usr/bin/tar on Docker): a 10 KB archive of one sparse member may claim any size. And a
sparse file of terabytes costs the agent nothing to make but reads as zeros for as long as it is
read (a replaced ``tar`` the verifier never runs is no tampering: the trial is graded and exported). The trial's directory must keep at most ``MAX_ARTIFACT_BYTES`` of artifacts, a trial scored
``tampered`` none at all, and the export must end promptly whatever the agent left.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from termgym.episode.artifacts import MAX_ARTIFACT_BYTES
from tests.helpers import write_task
from tests.redteam.helpers import attack, forged
from tests.redteam.plants import LOCAL_BIN_FIRST, planted_tar, sparse_archive

pytestmark = [pytest.mark.redteam]

CLAIMED = 256 << 20  # what the sparse member claims: four times the bound (its archive holds 10 KB)


def artifact_sizes(trials_dir: Path) -> list[int]:
    """The sizes of the files kept under every trial's ``artifacts`` directory."""
    sizes = []
    for root, _, files in os.walk(trials_dir):
        if "artifacts" in Path(root).relative_to(trials_dir).parts:
            sizes += [os.stat(os.path.join(root, name), follow_symlinks=False).st_size for name in files]
    return sizes


@pytest.mark.parametrize(
    ("backend", "where", "dockerfile", "tamper"),
    [
        ("local", "/root/.local/bin/tar", LOCAL_BIN_FIRST, None),
        pytest.param("docker", "/root/.local/bin/tar", LOCAL_BIN_FIRST, None, marks=pytest.mark.docker),
        pytest.param("docker", "/usr/bin/tar", None, None, marks=pytest.mark.docker),
        # the kit's last command replaced: the verifier loads it, so the trial is tampered
        pytest.param("docker", "/usr/bin/rm", None, "fail", marks=pytest.mark.docker),
    ],
    ids=["local-path-tar", "docker-path-tar", "docker-replaced-tar", "docker-replaced-rm-tampered"],
)
async def test_a_sparse_member_in_a_small_archive_keeps_no_more_than_the_bound(
    tmp_path, backend, where, dockerfile, tamper, no_leaks
):
    task = write_task(tmp_path, **({"dockerfile": dockerfile} if dockerfile else {}))
    trials = tmp_path / "trials"
    options = {"tamper": tamper} if tamper else {}
    plant = planted_tar(where, sparse_archive("logs/artifacts/big", CLAIMED))
    record = await attack(task, backend, plant, trials_dir=str(trials), **options)
    assert not forged(record), record
    sizes = artifact_sizes(trials)
    assert sum(sizes) <= MAX_ARTIFACT_BYTES and all(size <= MAX_ARTIFACT_BYTES for size in sizes), sizes
    if tamper:  # a trial scored tampered: nothing of its sandbox is kept
        assert record.error is not None and record.error["kind"] == "tampered", record.error
        assert record.artifacts == [] and sizes == [], record.artifacts


async def test_a_sparse_file_of_terabytes_does_not_hold_the_trial(tmp_path, no_leaks):
    """8 TiB of holes under /logs/artifacts (the embedded backend's file system takes it): the old
    export read its zeros until its 120 s timeout."""
    task = write_task(tmp_path)
    trials = tmp_path / "trials"
    started = time.monotonic()
    record = await attack(
        task, "local", "mkdir -p /logs/artifacts && truncate -s 8T /logs/artifacts/big", trials_dir=str(trials)
    )
    elapsed = time.monotonic() - started
    assert not forged(record), record
    assert elapsed < 30, f"the trial took {elapsed:.0f}s"
    sizes = artifact_sizes(trials)
    assert sum(sizes) <= MAX_ARTIFACT_BYTES and all(size <= MAX_ARTIFACT_BYTES for size in sizes), sizes
