"""TITO rollouts: what is trained is what was sampled (property-based), batched sampling equals
unbatched, and the re-tokenizing mode shows the drift TITO avoids."""

from __future__ import annotations

import asyncio
from typing import cast

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from termgym.env import SUBMIT
from termgym.trainer.chat import ChatFormat
from termgym.trainer.rollout import RolloutSettings, Trajectory, drive_episode, retokenized, token_drift
from termgym.trainer.sampler import BatchedSampler, Sampler, TokenSampler, next_token_logprobs


class ScriptedSampler(TokenSampler):
    """Returns a fixed script of (token, logprob), then end-of-turn tokens."""

    def __init__(self, script: list[tuple[int, float]], end: int) -> None:
        self.script, self.end = list(script), end

    async def sample(self, ids, generator):
        return self.script.pop(0) if self.script else (self.end, -0.5)


class FakeEnv:
    """Echoes hostile observations; truncates after ``max_turns`` commands; SUBMIT ends it."""

    def __init__(self, observations: list[str], max_turns: int) -> None:
        self.observations, self.max_turns = observations, max_turns
        self.done, self.turns, self.actions = False, 0, []

    async def step(self, action: str):
        self.actions.append(action)
        if action == SUBMIT:
            self.done = True
            return "", 1.0, True, False, {}
        self.turns += 1
        self.done = self.turns >= self.max_turns
        return self.observations[(self.turns - 1) % len(self.observations)], 0.0, False, self.done, {}


def scripted(script: list[tuple[int, float]], end: int) -> Sampler:
    # The scripted double implements only what drive_episode calls of a Sampler (generate_turn,
    # records_routing): it has no model to publish.
    return cast(Sampler, ScriptedSampler(script, end))


turn_strategy = st.tuples(
    st.lists(st.integers(min_value=4, max_value=1023), max_size=12),  # ordinary tokens
    st.sampled_from(["end", "submit", "none"]),  # how the turn stops
)
hostile_text = st.lists(
    st.sampled_from(list("ab $\n\t<|>_imendsubt") + ["<|im_end|>", "<|submit|>", "é"]), max_size=20
).map("".join)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.lists(turn_strategy, min_size=1, max_size=5),
    observations=st.lists(hostile_text, min_size=1, max_size=3),
    instruction=hostile_text,
    max_turns=st.integers(1, 5),
    max_new=st.integers(1, 10),
    context=st.integers(60, 600),
)
def test_trained_ids_are_the_sampled_ids_and_the_mask_covers_exactly_them(
    tiny_policy, turns, observations, instruction, max_turns, max_new, context
):
    _, tokenizer = tiny_policy
    chat = ChatFormat(tokenizer)
    script = []
    for tokens, stop in turns:
        script += [(t, -1.0 - i / 100) for i, t in enumerate(tokens)]
        script += {"end": [(chat.im_end, -0.1)], "submit": [(chat.submit, -0.2)], "none": []}[stop]
    env = FakeEnv(observations, max_turns)
    trajectory = Trajectory(task="t")
    rollout = RolloutSettings(max_new_tokens=max_new, max_context=context, observation_tokens=16)
    asyncio.run(
        drive_episode(env, instruction, scripted(script, chat.im_end), chat, rollout, torch.Generator(), trajectory)
    )

    prompt = chat.prompt(instruction)
    assert trajectory.ids[: len(prompt)] == prompt
    sampled_positions = set()
    for (start, end), sampled in zip(trajectory.turns, trajectory.sampled):
        assert trajectory.ids[start:end] == sampled  # never decoded and re-encoded
        sampled_positions |= set(range(start, end))
    assert {i for i, m in enumerate(trajectory.loss_mask) if m} == sampled_positions
    assert len(trajectory.loss_mask) == len(trajectory.logprobs) == len(trajectory.ids)
    assert all(lp != 0.0 for i, lp in enumerate(trajectory.logprobs) if i in sampled_positions)
    assert all(lp == 0.0 for i, lp in enumerate(trajectory.logprobs) if i not in sampled_positions)
    assert token_drift(trajectory) == 0
    assert len(trajectory.ids) <= max(context, len(prompt))  # a prompt too long is kept whole, nothing sampled
    assert env.done  # every episode ends verified (submitted or truncated by the env)
    # Text never becomes a stop token: outside the sampled spans, <|submit|> never appears.
    assert all(t != chat.submit for i, t in enumerate(trajectory.ids) if i not in sampled_positions)


def test_a_turn_that_runs_out_of_tokens_is_closed_by_the_framing(tiny_policy):
    _, tokenizer = tiny_policy
    chat = ChatFormat(tokenizer)
    env = FakeEnv(["out"], max_turns=2)
    trajectory = Trajectory(task="t")
    script = [(10, -1.0), (11, -1.0), (12, -1.0)]
    rollout = RolloutSettings(max_new_tokens=3, max_context=400)
    asyncio.run(
        drive_episode(env, "do it", scripted(script, chat.im_end), chat, rollout, torch.Generator(), trajectory)
    )
    end = trajectory.turns[0][1]
    assert trajectory.ids[end] == chat.im_end and trajectory.loss_mask[end] == 0


def test_batched_next_token_logprobs_equal_unbatched(tiny_policy):
    model, _ = tiny_policy
    sequences = [[1, 5, 9, 200], [1, 7], [1, 300, 301, 302, 303, 304, 305], [1]]
    batched = next_token_logprobs(model, sequences)
    for row, seq in enumerate(sequences):
        assert torch.allclose(batched[row], next_token_logprobs(model, [seq])[0], atol=1e-5)


def test_the_sampler_serves_concurrent_requests_in_one_forward_and_samples_as_alone(tiny_policy):
    model, _ = tiny_policy
    sequences = [[1, 5, 9], [1, 7], [1, 300, 301, 302]]

    async def concurrently():
        sampler = BatchedSampler(model)
        results = await asyncio.gather(
            *(sampler.sample(s, torch.Generator().manual_seed(i)) for i, s in enumerate(sequences))
        )
        return sampler, results

    sampler, together = asyncio.run(concurrently())
    assert (sampler.forwards, sampler.requests) == (1, 3)

    async def alone(seq, seed):
        return await BatchedSampler(model).sample(seq, torch.Generator().manual_seed(seed))

    for i, seq in enumerate(sequences):
        token, logprob = asyncio.run(alone(seq, i))
        assert together[i][0] == token
        assert abs(together[i][1] - logprob) < 1e-5


def test_a_failure_after_the_forward_fails_every_unanswered_request_instead_of_hanging_it(tiny_policy, monkeypatch):
    model, _ = tiny_policy
    real, calls = torch.multinomial, []

    def fails_second(*args, **kwargs):  # e.g. probabilities that are not finite for one row
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", fails_second)

    async def concurrently():
        sampler = BatchedSampler(model)
        requests = (sampler.sample([1, 5 + i], torch.Generator().manual_seed(i)) for i in range(3))
        return await asyncio.wait_for(asyncio.gather(*requests, return_exceptions=True), 10)

    first, *rest = asyncio.run(concurrently())
    assert isinstance(first, tuple)  # answered before the failure
    assert all(isinstance(r, RuntimeError) for r in rest)


def test_retokenizing_drifts_where_tito_does_not(tiny_policy):
    _, tokenizer = tiny_policy
    chat = ChatFormat(tokenizer)
    word = next(w for w in ("mkdir", "grep", "echo", "sort") if len(chat.text(w)) == 1)
    pieces = [chat.text(c)[0] for c in word]  # a valid sampling of the word, one byte at a time
    prompt = chat.prompt("x")
    ids = prompt + pieces + [chat.im_end]
    trajectory = Trajectory(
        task="t",
        ids=ids,
        loss_mask=[0] * len(prompt) + [1] * (len(pieces) + 1),
        logprobs=[0.0] * len(prompt) + [-1.0] * (len(pieces) + 1),
        turns=[(len(prompt), len(ids))],
        sampled=[pieces + [chat.im_end]],
    )
    assert token_drift(trajectory) == 0
    assert token_drift(retokenized(trajectory, tokenizer)) > 0


def test_policy_runner_on_the_embedded_backend(tiny_policy, tmp_path, no_leaks):
    """One real episode through the scheduler's Runner seam; a broken task becomes a record, not an exception."""
    from termgym.env import EnvOptions
    from termgym.sandboxes.pacing import Pacer
    from termgym.scheduling.scheduler import Node, TrialProgress
    from termgym.tasks import load_task
    from termgym.trainer.rollout import PolicyRunner
    from tests.helpers import write_task

    model, tokenizer = tiny_policy
    runner = PolicyRunner(
        BatchedSampler(model),
        ChatFormat(tokenizer),
        EnvOptions(max_turns=1, command_timeout=5.0),
        Pacer(),
        RolloutSettings(max_new_tokens=4, max_context=400),
        seed=3,
    )
    good = load_task(write_task(tmp_path / "good"))
    broken = load_task(write_task(tmp_path / "broken", dockerfile="FROM debian:bookworm-slim\nRUN exit 3\n"))

    async def both():
        progress = TrialProgress()
        trajectory = await runner.run_one(good, Node("n", 1), 5, progress)
        return trajectory, progress, await runner.run_one(broken, Node("n", 1), 5, TrialProgress())

    trajectory, progress, failed = asyncio.run(both())
    record = runner.record_of(trajectory)
    assert record.error is None and record.total == 2 and record.agent == "policy"
    assert trajectory.policy_version == 5 and trajectory.reward == record.reward
    assert progress.env is not None and progress.created_at is not None  # paced, and watched
    assert sum(trajectory.loss_mask) >= 1 and token_drift(trajectory) == 0
    failed_error = runner.record_of(failed).error
    assert failed_error is not None
    assert failed_error["kind"] == "build_failed"
