"""A PPO step whose rollouts run on a real Ray cluster (``--cluster``; the session's ``ray_cluster``,
three nodes on 127.0.0.1): the same records and metrics as on one machine, token drift 0, each
trial's sandbox on a node of the cluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT
from tests.trainer.test_ppo import metrics_of, tiny_args

pytest.importorskip("ray", reason="the ray extra")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leaks")]


def test_a_ppo_step_on_the_cluster_keeps_its_records_and_token_drift_zero(ray_cluster, tmp_path, tiny_policy_dir):
    out = tmp_path / "run"
    argv = tiny_args(out, tiny_policy_dir, 1, "--cluster", ray_cluster.address)
    result = subprocess.run(
        [sys.executable, "-m", "termgym", "train", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        env=ray_cluster.env(),
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (metrics,) = metrics_of(out)
    assert metrics["token_drift"] == 0 and metrics["scheduler"]["kept"] == 2 and metrics["action_tokens"] > 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) >= 2 and all(r["error"] is None for r in records), records
    assert all(r["node"].startswith("ray-") for r in records)
    assert {"task", "reward", "passed", "total", "assertions", "turns", "node"} <= set(records[0])
