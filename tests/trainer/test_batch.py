"""``make_batch`` when nothing was sampled: one line that says why (``nothing_to_train``), naming the
prompt's length and the limit when every episode ran out of context before its first reply."""

from __future__ import annotations

import pytest

from termgym.errors import TrainingError
from termgym.trainer.batch import make_batch, nothing_to_train
from termgym.trainer.trajectory import Trajectory


def ended(reason: str | None, prompt_tokens: int = 0, replies: int = 0) -> Trajectory:
    return Trajectory(task="t", stop_reason=reason, prompt_tokens=prompt_tokens, replies=replies)


@pytest.mark.parametrize(
    ("trajectories", "max_context", "message"),
    [
        (
            [ended("context_exhausted", 1432)] * 3,
            1024,
            "every episode (3) ended before its first reply (context_exhausted): the prompt is 1432 tokens, "
            "and --max-context 1024 leaves no room for a reply; give a larger --max-context",
        ),
        (
            [ended("context_exhausted", 1432), ended("context_exhausted", 1500)],
            1024,
            "the prompt is 1432 to 1500 tokens, and --max-context 1024 leaves no room",
        ),
        ([ended("context_exhausted", 700)], None, "the prompt is 700 tokens, and the context limit leaves no room"),
        (
            [ended("context_exhausted", 900), ended("agent_timeout"), ended("agent_timeout")],
            1024,
            "no trajectory sampled anything (stop reasons: agent_timeout 2, context_exhausted 1): "
            "there is nothing to train on",
        ),
        ([ended(None)], 1024, "no trajectory sampled anything (stop reasons: no stop reason 1)"),
        ([], 1024, "no trajectory sampled anything: there is nothing to train on"),
    ],
)
def test_nothing_to_train_says_why_in_one_line(trajectories, max_context, message):
    said = nothing_to_train(trajectories, max_context)
    assert message in said and "\n" not in said


def test_make_batch_refuses_a_batch_with_no_sample_with_that_line():
    trajectories = [ended("context_exhausted", 1432), ended("context_exhausted", 1432)]
    with pytest.raises(TrainingError, match="the prompt is 1432 tokens, and --max-context 1024 leaves no room"):
        make_batch(trajectories, [1.0, 1.0], pad_id=0, max_context=1024)
