"""Trainer fixtures: one tiny policy directory per session (tokenizer trained, model built once)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the trainer needs the train extra: pip install -e '.[train]'")


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from termgym.trainer.models import build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("policy"), seed=0)


@pytest.fixture(scope="session")
def tiny_policy(tiny_policy_dir: Path):
    from termgym.trainer.models import load_policy

    return load_policy(tiny_policy_dir)
