"""TITO rollouts on the model agent's loop: what is trained is what was sampled (property-based),
segments become samples, batched sampling equals unbatched, and the re-tokenizing mode shows the
drift TITO avoids."""

from __future__ import annotations

import asyncio
from typing import cast

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from termgym.agents.model import ContextPolicy, LoopSettings
from termgym.agents.renderers import make_renderer
from termgym.trainer.rollout import RolloutSettings, retokenized, run_policy_episode
from termgym.trainer.sampler import BatchedSampler, Sampler, TokenSampler, next_token_logprobs
from termgym.trainer.trajectory import Trajectory, token_drift
from tests.trainer.fake_env import FakeEnv


class ScriptedSampler(TokenSampler):
    """Returns a fixed script of (token, logprob), then end-of-turn tokens."""

    def __init__(self, script: list[tuple[int, float]], end: int) -> None:
        self.script, self.end = list(script), end

    async def sample(self, ids, generator):
        return self.script.pop(0) if self.script else (self.end, -0.5)


def scripted(script: list[tuple[int, float]], end: int) -> Sampler:
    # The scripted double implements only what an episode calls of a Sampler (generate_turn,
    # records_routing, forget): it has no model to publish.
    return cast(Sampler, ScriptedSampler(script, end))


def text_settings(
    max_new: int, context: int, *, observation_tokens: int = 16, context_policy: ContextPolicy = "none"
) -> RolloutSettings:
    loop = LoopSettings(action_format="text", max_tokens=max_new, context=context_policy, system_prompt="Be brief.")
    return RolloutSettings(loop, max_context=context, observation_tokens=observation_tokens)


def run_episode(env, instruction, sampler, renderer, rollout, generator=None) -> Trajectory:
    trajectory = Trajectory(task="t")
    asyncio.run(run_policy_episode(env, instruction, {}, sampler, renderer, rollout, generator, trajectory))
    return trajectory


def test_the_opening_prompts_length_is_recorded_even_when_it_leaves_no_room_for_a_reply(tiny_policy):
    _, tokenizer = tiny_policy
    renderer = make_renderer("chatml", tokenizer)
    close = renderer.close_id
    env = FakeEnv(["ok"], 3)
    long_task = "Write every word of the list below to words.txt, one per line: " + "alpha beta gamma " * 40
    crowded = run_episode(env, long_task, scripted([], close), renderer, text_settings(8, 64))
    assert crowded.stop_reason == "context_exhausted" and crowded.replies == 0 and not crowded.samples
    assert crowded.prompt_tokens == len(env.transcript.segments[0].ids) > 64  # the whole opening, over the limit
    submit = tokenizer("```bash\n:submit\n```", add_special_tokens=False).input_ids
    roomy = run_episode(
        FakeEnv(["ok"], 3), "Stop.", scripted([(t, -1.0) for t in submit], close), renderer, text_settings(16, 256)
    )
    assert roomy.replies == 1 and roomy.prompt_tokens == roomy.samples[0].loss_mask.index(1)  # the ids before the reply


turn_strategy = st.tuples(
    st.lists(st.integers(min_value=12, max_value=1023), max_size=12),  # ordinary tokens
    st.sampled_from(["end", "command", "submit", "none"]),  # how the turn ends
)
hostile_text = st.lists(
    st.sampled_from([*list("ab $\n\t<|>_imendsubt`"), "<|im_end|>", "<|im_start|>", "<tool_call>", "```", "é"]),
    max_size=20,
).map("".join)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.lists(turn_strategy, min_size=1, max_size=5),
    observations=st.lists(hostile_text, min_size=1, max_size=3),
    instruction=hostile_text,
    max_turns=st.integers(1, 5),
    max_new=st.integers(1, 24),
    context=st.integers(60, 600),
)
def test_trained_ids_are_the_sampled_ids_and_the_mask_covers_exactly_them(
    tiny_policy, turns, observations, instruction, max_turns, max_new, context
):
    _, tokenizer = tiny_policy
    renderer = make_renderer("chatml", tokenizer)
    close = renderer.close_id
    command = tokenizer("```bash\nls\n```", add_special_tokens=False).input_ids
    submit = tokenizer("```bash\n:submit\n```", add_special_tokens=False).input_ids
    script = []
    for tokens, stop in turns:
        body = {"end": tokens, "command": command, "submit": submit, "none": tokens}[stop]
        script += [(t, -1.0 - i / 100) for i, t in enumerate(body)]
        script += [] if stop == "none" else [(close, -0.1)]
    env = FakeEnv(observations, max_turns)
    trajectory = run_episode(env, instruction, scripted(script, close), renderer, text_settings(max_new, context))

    assert env.done  # every episode ends verified: submitted, or truncated with a stop reason
    assert trajectory.stop_reason is not None
    specials = set(tokenizer.all_special_ids) | {tokenizer.convert_tokens_to_ids(t) for t in ("<tool_call>", "<think>")}
    for sample in trajectory.samples:
        sampled_positions = set()
        for (start, end), sampled in zip(sample.turns, sample.sampled):
            assert sample.ids[start:end] == sampled  # never decoded and re-encoded
            sampled_positions |= set(range(start, end))
        assert {i for i, m in enumerate(sample.loss_mask) if m} == sampled_positions
        assert len(sample.loss_mask) == len(sample.logprobs) == len(sample.ids)
        assert all(lp != 0.0 for i, lp in enumerate(sample.logprobs) if i in sampled_positions)
        assert all(lp == 0.0 for i, lp in enumerate(sample.logprobs) if i not in sampled_positions)
        assert len(sample.ids) <= context + 1  # the context, and at most a synthesized close
        # Text never becomes a special id: outside the sampled spans, the only special ids are the
        # framing's (no <tool_call> or <think>: the text format renders none).
        framing = [t for i, t in enumerate(sample.ids) if i not in sampled_positions and t in specials]
        assert tokenizer.convert_tokens_to_ids("<tool_call>") not in framing
        assert tokenizer.convert_tokens_to_ids("<think>") not in framing
        opens, closes = sample.ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")), sample.ids.count(close)
        assert framing.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == opens  # only the framing opens turns
        assert opens == closes + (sample.ids[-1] != close)  # every turn is closed, but a last one left open
    assert token_drift(trajectory) == 0
    assert trajectory.bridge_breaks == 0  # ChatML keeps every prefix


def test_a_reply_that_runs_out_of_tokens_is_closed_outside_the_loss(tiny_policy):
    _, tokenizer = tiny_policy
    renderer = make_renderer("chatml", tokenizer)
    env = FakeEnv(["out"], max_turns=2)
    script = [(20, -1.0), (21, -1.0), (22, -1.0)]
    trajectory = run_episode(env, "do it", scripted(script, renderer.close_id), renderer, text_settings(3, 400))
    (sample,) = trajectory.samples
    end = sample.turns[0][1]
    assert sample.ids[end] == renderer.close_id and sample.loss_mask[end] == 0
    assert trajectory.parse_errors >= 1  # three arbitrary tokens are no fenced command


def test_a_command_runs_and_the_submit_ends_the_episode(tiny_policy):
    _, tokenizer = tiny_policy
    renderer = make_renderer("chatml", tokenizer)
    close = renderer.close_id
    reply = lambda text: [(t, -0.5) for t in tokenizer(text, add_special_tokens=False).input_ids] + [(close, -0.1)]  # noqa: E731
    script = reply("```bash\necho hi\n```") + reply("```bash\n:submit\n```")
    env = FakeEnv(["hi"], max_turns=4)
    trajectory = run_episode(env, "say hi", scripted(script, close), renderer, text_settings(24, 400))
    assert env.actions[0] == "echo hi" and trajectory.commands == ["echo hi"]
    assert trajectory.stop_reason == "submitted" and len(trajectory.samples) == 1
    assert trajectory.bridges == 1 and trajectory.replies == 2


def test_elided_history_continues_as_a_new_sample_with_the_earlier_tokens_as_prompt(tiny_policy):
    _, tokenizer = tiny_policy
    renderer = make_renderer("chatml", tokenizer)
    close = renderer.close_id
    reply = [(t, -0.5) for t in tokenizer("```bash\nls\n```", add_special_tokens=False).input_ids] + [(close, -0.1)]
    env = FakeEnv(["x" * 200], max_turns=8)
    rollout = text_settings(16, 260, observation_tokens=40, context_policy="truncate")
    trajectory = run_episode(env, "list", scripted(reply * 8, close), renderer, rollout)
    assert len(trajectory.samples) >= 2
    assert [s.reason for s in trajectory.samples][1:] == ["truncate"] * (len(trajectory.samples) - 1)
    assert token_drift(trajectory) == 0
    for sample in trajectory.samples:
        assert sample.loss_mask[0] == 0 and sum(sample.loss_mask) >= 1  # each sample opens with its prompt


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
    from termgym.trainer.trajectory import Sample

    _, tokenizer = tiny_policy
    renderer = make_renderer("chatml", tokenizer)
    encode = renderer.encode
    word = next(w for w in ("mkdir", "grep", "echo", "sort") if len(encode(w)) == 1)
    pieces = [encode(c)[0] for c in word]  # a valid sampling of the word, one byte at a time
    prompt = renderer.render([{"role": "user", "content": "x"}])
    ids = prompt + pieces + [renderer.close_id]
    sample = Sample(
        ids=ids,
        loss_mask=[0] * len(prompt) + [1] * (len(pieces) + 1),
        logprobs=[0.0] * len(prompt) + [-1.0] * (len(pieces) + 1),
        turns=[(len(prompt), len(ids))],
        sampled=[[*pieces, renderer.close_id]],
    )
    trajectory = Trajectory(task="t", samples=[sample])
    assert token_drift(trajectory) == 0
    assert token_drift(retokenized(trajectory, tokenizer)) > 0


def test_policy_runner_on_the_embedded_backend(tiny_policy, tmp_path, no_leaks):
    """One real episode through the scheduler's Runner seam; a broken task becomes a record, not an exception."""
    from termgym.episode.options import EnvOptions
    from termgym.sandboxes.pacing import Pacer
    from termgym.scheduling.pool import Node
    from termgym.scheduling.runners import TrialProgress
    from termgym.tasks import load_task
    from termgym.trainer.rollout import PolicyRunner
    from tests.helpers import write_task

    model, tokenizer = tiny_policy
    runner = PolicyRunner(
        BatchedSampler(model),
        make_renderer("chatml", tokenizer),
        EnvOptions(max_turns=1, command_timeout=5.0),
        Pacer(),
        text_settings(4, 400),
        seed=3,
    )
    good = load_task(write_task(tmp_path / "good"))
    broken = load_task(write_task(tmp_path / "broken", dockerfile="FROM debian:bookworm-slim\nRUN exit 3\n"))

    async def both():
        progress = TrialProgress(launch=7)  # the scheduler's launch index
        trajectory = await runner.run_one(good, Node("n", 1), 5, progress)
        return trajectory, progress, await runner.run_one(broken, Node("n", 1), 5, TrialProgress())

    trajectory, progress, failed = asyncio.run(both())
    record = runner.record_of(trajectory)
    assert record.error is None and record.total == 2 and record.agent == "policy"
    assert trajectory.policy_version == 5 and trajectory.reward == record.reward
    assert progress.env is not None and progress.created_at is not None  # paced, and watched
    assert sum(trajectory.samples[0].loss_mask) >= 1 and token_drift(trajectory) == 0
    # the launch index seeds the episode: the scheduler's, else the next after those seen
    assert (trajectory.launch, failed.launch) == (7, 8)
    sampled = sum(sum(sample.loss_mask) for sample in trajectory.samples)
    assert runner.work_of(trajectory) == sampled + len(trajectory.commands)  # the work clock's units
    failed_error = runner.record_of(failed).error
    assert failed_error is not None
    assert failed_error["kind"] == "build_failed"
