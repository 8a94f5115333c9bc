"""The main job's parts (held-out evaluation, plots) and a shortened ``termgym train --preset tiny``
end to end: the run directory, the audited selection as the training pool, no held-out leakage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from termgym.agents.model import LoopSettings
from termgym.agents.renderers import make_renderer
from termgym.cli import main as termgym_main
from termgym.envs.families import generate_split
from termgym.episode.options import EnvOptions
from termgym.records import TrialRecord
from termgym.tasks import load_task
from termgym.trainer.evaluate import EvalSummary, evaluate, paired_change, summarise_records
from termgym.trainer.plots import curves, write_plots
from termgym.trainer.rollout import RolloutSettings

SETTINGS = RolloutSettings(LoopSettings(action_format="text", max_tokens=8, context="none"), 512, 32)


def test_summary_counts_resolved_passed_and_faults_per_family():
    records = [
        TrialRecord("a", "local", "p", resolved=True, reward=0.25, passed=5, family="x"),
        TrialRecord("b", "local", "p", resolved=False, reward=0.1, passed=2, family="x"),
        TrialRecord("c", "local", "p", passed=0, family="y", error={"kind": "sandbox_error", "message": "gone"}),
        TrialRecord("d", "local", "p", passed=1, family="y", error={"kind": "agent_timeout", "message": "slow"}),
    ]
    s = summarise_records(records)
    assert (s.tasks, s.resolved, s.passed, s.errors) == (4, 0.25, 2.0, 1)
    assert s.families == {
        "x": {"tasks": 2, "resolved": 0.5, "passed": 3.5},
        "y": {"tasks": 2, "resolved": 0.0, "passed": 0.5},
    }
    assert s.task_rates == {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0} and s.samples == 0


def test_the_share_of_assertions_passed_weighs_every_episode_by_its_own_task():
    """A long task's many assertions do not swamp a short one's: 5 of 5, 2 of 20, and an episode
    whose verifier never reported (no assertion to share) counts as 0."""
    records = [
        TrialRecord("a", "local", "p", resolved=True, passed=5, total=5, family="x"),
        TrialRecord("b", "local", "p", passed=2, total=20, family="x"),
        TrialRecord("c", "local", "p", passed=0, total=0, family="y"),
    ]
    assert summarise_records(records).passed_share == pytest.approx((1.0 + 0.1 + 0.0) / 3)


def test_sampled_summary_rates_each_task_over_its_episodes():
    records = [
        TrialRecord(t, "local", "p", resolved=ok, passed=int(ok), family=t[0])
        for t, ok in (
            ("a1", True),
            ("a1", False),
            ("a1", True),
            ("a1", True),
            ("b1", False),
            ("b1", False),
            ("b1", True),
            ("b1", False),
        )
    ]
    s = summarise_records(records, samples=4)
    assert (s.tasks, s.resolved, s.samples) == (2, 0.5, 4)
    assert s.task_rates == {"a1": 0.75, "b1": 0.25} and s.families["a"] == {
        "tasks": 1,
        "resolved": 0.75,
        "passed": 0.75,
    }


def summary_resolving(*names: str, rates: dict[str, float] | None = None) -> EvalSummary:
    return EvalSummary(
        tasks=48,
        resolved=len(names) / 48,
        passed=0.0,
        reward=0.0,
        errors=0,
        task_rates={name: 1.0 for name in names} | (rates or {}),
    )


def test_paired_change_counts_flipped_tasks_and_tests_their_split():
    unchanged = paired_change(summary_resolving("a", "b"), summary_resolving("a", "b"))
    assert (unchanged.gained, unchanged.lost, unchanged.p_value) == (0, 0, 1.0)
    three_up = paired_change(summary_resolving("a"), summary_resolving("a", "b", "c", "d"))
    assert (three_up.gained, three_up.lost) == (3, 0) and three_up.p_value == 0.25  # 2 * (1/2)^3
    mixed = paired_change(summary_resolving("a", "b", "c"), summary_resolving("c", "d", "e", "f", "g"))
    assert (mixed.gained, mixed.lost) == (4, 2) and abs(mixed.p_value - 2 * (1 + 6 + 15) / 64) < 1e-12
    clear = paired_change(summary_resolving(), summary_resolving(*"abcdefgh"))
    assert clear.p_value == 2 / 256 and "significant" in clear.describe(48)
    assert "within noise" in three_up.describe(48) and "3 of 48 tasks gained, 0 lost" in three_up.describe(48)
    # sampled: a task counts as gained when its rate rose, lost when it fell, whatever the size
    rates = paired_change(
        summary_resolving(rates={"a": 0.5, "b": 0.25, "c": 0.5}),
        summary_resolving(rates={"a": 0.75, "b": 0.0, "c": 0.5, "d": 0.25}),
    )
    assert (rates.gained, rates.lost) == (2, 1)


async def test_greedy_evaluation_runs_each_task_once_and_is_reproducible(tmp_path, tiny_policy, no_leaks):
    policy, tokenizer = tiny_policy
    tasks = [load_task(p) for p in generate_split(tmp_path, "heldout", 6, seed=1)]
    options = EnvOptions(backend="local", max_turns=2, command_timeout=5.0)
    runs = []
    for _ in range(2):
        seen = []
        summary, records = await evaluate(
            policy,
            make_renderer("chatml", tokenizer),
            tasks,
            options,
            SETTINGS,
            concurrency=3,
            on_record=lambda r, t, seen=seen: seen.append((r.task, t.commands)),
        )
        assert [r.task for r in records] == [t.name for t in tasks]
        assert summary.tasks == 6 and summary.errors == 0
        runs.append(sorted(seen))
    assert runs[0] == runs[1]  # greedy: the same commands whatever the batching


async def test_sampled_evaluation_runs_each_task_k_times_with_draws_fixed_by_the_seed(tmp_path, tiny_policy, no_leaks):
    policy, tokenizer = tiny_policy
    tasks = [load_task(p) for p in generate_split(tmp_path, "heldout", 3, seed=1)]
    options = EnvOptions(backend="local", max_turns=1, command_timeout=5.0)

    async def commands(seed: int, concurrency: int) -> list:
        seen = []
        summary, records = await evaluate(
            policy,
            make_renderer("chatml", tokenizer),
            tasks,
            options,
            SETTINGS,
            concurrency=concurrency,
            samples=4,
            seed=seed,
            on_record=lambda r, t: seen.append((r.task, tuple(t.samples[0].ids))),
        )
        assert summary.samples == 4 and summary.tasks == 3 and len(records) == 12
        assert [r.task for r in records] == [t.name for t in tasks for _ in range(4)]
        return sorted(seen)

    first = await commands(seed=0, concurrency=5)
    assert first == await commands(seed=0, concurrency=2)  # the draws, not the batching, decide
    assert len({c for _, c in first}) > 3  # an untrained policy at temperature 1 types different things
    assert first != await commands(seed=1, concurrency=5)


def test_curves_keep_finite_values_and_plots_are_pngs(tmp_path):
    metrics = [
        {
            "step": 0,
            "reward": 0.1,
            "resolved": 0.0,
            "explained_variance": float("nan"),
            "logprob_gap": 1e-6,
            "scheduler": {"families": {"tv_distance": 0.2}},
        },
        {"step": 1, "reward": 0.2, "resolved": 0.5, "explained_variance": 0.3, "logprob_gap": None, "scheduler": {}},
    ]
    c = curves(metrics)
    assert c["explained_variance"] == ([2], [0.3]) and c["reward"] == ([1, 2], [0.1, 0.2])
    assert c["straggler_bias"] == ([1], [0.2]) and c["logprob_gap"] == ([1], [1e-6])
    paths = write_plots(tmp_path, metrics, sft_losses=[3.0, 2.0], warmup_steps=1)
    assert {p.name for p in paths} == {f"{k}.png" for k in (*c, "sft_loss")}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


@pytest.mark.slow
def test_shortened_demo_end_to_end(tmp_path, no_leaks, capsys):
    run = tmp_path / "run"
    args = [
        "train",
        "--preset",
        "tiny",
        "--out",
        str(run),
        "--pool",
        "10",
        "--heldout",
        "7",
        "--sft-steps",
        "20",
        "--sft-batch-size",
        "8",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--minibatch-size",
        "4",
        "--concurrency",
        "4",
        "--hidden",
        "64",
        "--layers",
        "2",
        "--experts",
        "4",
        "--critic-warmup-steps",
        "1",
        "--eval-samples",
        "2",
        "--ppo-pool",
        "3",
        "--start-floor",
        "0.99",
        "--sft-validation",
        "3",
    ]
    assert termgym_main(args) == 0
    err = capsys.readouterr().err
    assert "supervised start" in err and "after PPO" in err and f"run directory: {run}" in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["heldout"]["sft"]["tasks"] == summary["heldout"]["ppo"]["tasks"] == 7
    sft, ppo = ({t for t, rate in summary["heldout"][label]["task_rates"].items() if rate} for label in ("sft", "ppo"))
    change = summary["heldout"]["change"]
    assert (change["gained"], change["lost"]) == (len(ppo - sft), len(sft - ppo)) and 0 < change["p_value"] <= 1
    assert "after PPO against the supervised start, greedy:" in err and "sampled (2 per task;" in err
    sampled, greedy_rates = summary["heldout"]["sampled"], summary["heldout"]["ppo"]["task_rates"]
    assert sampled["sft"]["samples"] == sampled["ppo"]["samples"] == 2 and set(sampled["ppo"]["task_rates"]) == set(
        greedy_rates
    )
    assert len((run / "eval" / "ppo-sampled.jsonl").read_text().splitlines()) == 2 * len(greedy_rates)
    # the training pool is the audited selection, and nothing of the held-out set reached training
    audit = json.loads((run / "audit.json").read_text())
    accepted = {v["task"] for v in audit if v["accepted"]}
    selection = [Path(line) for line in (run / "selection.txt").read_text().split()]
    assert {load_task(p).name for p in selection} == accepted and summary["accepted"] == len(accepted) > 0
    trained = {json.loads(line)["task"] for line in (run / "ppo" / "trajectories.jsonl").read_text().splitlines()}
    demonstrated = {
        json.loads(line)["task"] for line in (run / "sft" / "demonstrations.jsonl").read_text().splitlines()
    }
    assert trained | demonstrated <= accepted
    assert trained and demonstrated and not trained & demonstrated  # PPO's tasks were never demonstrated
    # the scripted teacher's demonstrations, and its own held-out rate beside the policy's
    teacher = summary["heldout"]["teacher"]
    assert teacher["tasks"] == 7 and "teacher (scripted)" in err and "the teacher resolved" in err
    assert len((run / "eval" / "teacher.jsonl").read_text().splitlines()) == 7
    # a 20-step start cannot pass 99% of the validation split's assertions: said, and the job goes on
    check = summary["start_check"]
    assert check["floor"] == 0.99 and not check["within"] and "fell short of its band" in err
    assert len((run / "eval" / "validation-start.jsonl").read_text().splitlines()) == 3
    heldout = json.loads((run / "tasks" / "heldout" / "split.json").read_text())
    assert "two-files" in {t["family"] for t in heldout["tasks"]}
    evaluated = [json.loads(line)["task"] for line in (run / "eval" / "ppo.jsonl").read_text().splitlines()]
    assert len(evaluated) == 7 and not set(evaluated) & (trained | demonstrated)
    metrics = [json.loads(line) for line in (run / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["warmup"] for m in metrics] == [True, False, False]
    assert (run / "ppo" / "checkpoint.pt").exists() and (run / "sft" / "policy" / "config.json").exists()
    # explained variance is NaN while every return is equal (a 20-step start resolves nothing): no plot then
    finite_ev = any(m["explained_variance"] == m["explained_variance"] for m in metrics)
    assert {p.name for p in (run / "plots").iterdir()} == {
        "reward.png",
        "resolved.png",
        "logprob_gap.png",
        "straggler_bias.png",
        "sft_loss.png",
        "heldout_families.png",
    } | ({"explained_variance.png"} if finite_ev else set())
    # the same directory again: one line, exit 2, the first run untouched
    assert termgym_main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text()) == summary


def test_a_turn_budget_too_small_for_the_references_is_one_clear_line(tmp_path, no_leaks, capsys):
    args = [
        "train",
        "--preset",
        "tiny",
        "--out",
        str(tmp_path / "run"),
        "--pool",
        "5",
        "--heldout",
        "2",
        "--hidden",
        "64",
        "--layers",
        "2",
        "--experts",
        "4",
        "--max-new-tokens",
        "6",
    ]
    assert termgym_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "more than --max-new-tokens 6: the policy could never complete that task" in err[-1]
    assert not (tmp_path / "run" / "sft" / "policy").exists()  # stopped before training


@pytest.mark.parametrize("name", ["tiny", "tiny-long"])
def test_shipped_audit_cache_covers_the_presets_pools_and_agrees_with_a_fresh_audit(name, tmp_path, no_leaks):
    import asyncio

    from termgym.audit.cache import AuditCache
    from termgym.audit.runner import audit_tasks
    from termgym.envs.families import FAMILY_SETS, bundled_audit_cache
    from termgym.trainer.config import PRESETS

    preset = PRESETS[name]
    family_set = preset.get("families", "short")
    tasks = [load_task(p) for p in generate_split(tmp_path, "train", preset["pool"], seed=0, family_set=family_set)]
    cache = AuditCache.load(bundled_audit_cache())
    missing = [t.name for t in tasks if AuditCache.key(t, preset["audit_k"]) not in cache.entries]
    assert not missing, (
        f"{len(missing)} pool tasks are not in the shipped cache: regenerate it (envs/families/__init__.py)"
    )
    sample = tasks[: len(FAMILY_SETS[family_set].train_families)]  # one of each family (drawn round-robin)
    fresh = asyncio.run(audit_tasks(sample, EnvOptions(run_id="cache-check"), k=preset["audit_k"], concurrency=5))
    cached = [cache.get(t, preset["audit_k"]) for t in sample]
    assert None not in cached  # every pool task is in the cache (checked above)
    assert [v.to_dict() for v in fresh] == [c.to_dict() for c in cached if c is not None]


async def test_the_first_family_sets_pool_is_drawn_audited_and_recorded_apart(tmp_path, no_leaks):
    """``--sft-first-families``: its own training pool (no held-out set) under ``run/first``, its
    reference trajectories recorded there; none without it."""
    from dataclasses import replace

    from rich.console import Console

    from termgym.envs.families import FAMILY_SETS
    from termgym.trainer.config import PRESETS, Config
    from termgym.trainer.models import TINY_FAMILY, tiny_tokenizer
    from termgym.trainer.pipeline import first_demonstrations

    cfg = replace(Config(**PRESETS["tiny-long"]), sft_first_pool=4, audit_cache="", concurrency=4)
    renderer, console = make_renderer(TINY_FAMILY, tiny_tokenizer()), Console(quiet=True)
    demos = await first_demonstrations(tmp_path, cfg, renderer, console)
    listing = json.loads((tmp_path / "first" / "tasks" / "train" / "split.json").read_text())
    assert listing["family_set"] == "short" and len(listing["tasks"]) == 4
    assert {t["family"] for t in listing["tasks"]} <= set(FAMILY_SETS["short"].train_families)
    assert not (tmp_path / "first" / "tasks" / "heldout").exists()
    assert sorted(d.task for d in demos) == sorted(f"families/train/{t['dir']}" for t in listing["tasks"])
    assert len((tmp_path / "first" / "sft" / "demonstrations.jsonl").read_text().splitlines()) == 4
    assert await first_demonstrations(tmp_path / "none", replace(cfg, sft_first_families=""), renderer, console) == []


class Saved:
    """Stands in for a policy or tokenizer: what ``warm_start`` calls of them."""

    pad_token_id = 0

    def save_pretrained(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)

    def eval(self):
        pass


def recording_steps(calls: list):
    """A ``supervised_steps`` that notes each stage's rows and step count; loss = stage number."""

    def steps(policy, rows, *, steps, **_settings):
        calls.append((rows, steps))
        stage = len(calls)
        return iter([float(stage)] * steps)

    return steps


async def test_the_warm_start_learns_the_first_set_then_the_pool(tmp_path, monkeypatch):
    from dataclasses import replace

    from rich.console import Console

    from termgym.trainer import pipeline
    from termgym.trainer.config import Config
    from termgym.trainer.sft import Demonstration

    calls: list = []
    monkeypatch.setattr(pipeline, "supervised_steps", recording_steps(calls))
    first = [Demonstration("short", ("ls",), [1, 2], [0, 1])]
    demos = [Demonstration("long", ("ls", "pwd"), [3, 4, 5], [0, 1, 1])]
    cfg = replace(Config(), sft_steps=2, sft_first_families="short", sft_first_pool=1, sft_first_steps=3)
    quiet = Console(quiet=True)
    losses = await pipeline.warm_start(tmp_path, cfg, demos, Saved(), Saved(), quiet, first)
    assert calls == [([([1, 2], [0, 1])], 3), ([([3, 4, 5], [0, 1, 1])], 2)]
    assert losses == [1.0, 1.0, 1.0, 2.0, 2.0]  # every step's loss, the first set's first
    assert json.loads((tmp_path / "sft" / "losses.json").read_text()) == losses
    calls.clear()
    assert await pipeline.warm_start(tmp_path, cfg, demos, Saved(), Saved(), quiet) == [1.0, 1.0]
    assert calls == [([([3, 4, 5], [0, 1, 1])], 2)]


async def test_the_pool_stage_stops_at_the_first_check_that_holds(tmp_path, monkeypatch):
    from dataclasses import replace

    from rich.console import Console

    from termgym.trainer import pipeline
    from termgym.trainer.config import Config
    from termgym.trainer.sft import Demonstration

    monkeypatch.setattr(pipeline, "supervised_steps", recording_steps([]))
    checked: list[int] = []

    async def stop(steps: int) -> bool:
        checked.append(steps)
        return steps >= 40

    demos = [Demonstration("long", ("ls",), [3, 4], [0, 1])]
    cfg = replace(Config(), sft_steps=100, sft_check_every=20)
    first = [Demonstration("short", ("ls",), [1, 2], [0, 1])]
    cfg_first = replace(cfg, sft_first_families="short", sft_first_pool=1, sft_first_steps=30)
    losses = await pipeline.warm_start(tmp_path, cfg_first, demos, Saved(), Saved(), Console(quiet=True), first, stop)
    assert checked == [20, 40]  # the first stage is never checked; the second ends at the first true
    assert len(losses) == 30 + 40
    checked.clear()
    never = await pipeline.warm_start(
        tmp_path, replace(cfg, sft_steps=50), demos, Saved(), Saved(), Console(quiet=True), None, lambda s: stop(0)
    )
    assert len(never) == 50 and checked == [0, 0, 0]  # at 20, 40, and the last step, 50


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"sft_first_families": "medium"}, "--sft-first-families"),
        ({"sft_first_families": "short", "sft_first_pool": 0}, "--sft-first-families"),
        ({"sft_first_families": "short", "sft_first_steps": 0}, "--sft-first-families"),
        ({"sft_stop_share": 1.5}, "--sft-stop-share"),
        ({"sft_stop_share": -0.1}, "--sft-stop-share"),
        ({"sft_check_every": 0}, "--sft-stop-share"),
        ({"sft_validation": 0}, "--sft-stop-share"),
    ],
)
def test_a_supervised_start_that_cannot_run_is_one_line(changes, flag):
    from dataclasses import replace

    from termgym.errors import ConfigError
    from termgym.trainer.checks import check_config
    from termgym.trainer.config import PRESETS, Config

    check_config(Config(**PRESETS["tiny-long"]))  # the preset itself is fine
    with pytest.raises(ConfigError, match=flag) as caught:
        check_config(replace(Config(**PRESETS["tiny-long"]), **changes))
    assert "\n" not in str(caught.value)


def test_an_init_that_is_no_model_a_negative_ppo_pool_or_a_floor_above_one_is_one_line(tmp_path):
    from dataclasses import replace

    from termgym.errors import ConfigError
    from termgym.trainer.checks import check_config
    from termgym.trainer.config import PRESETS, TINY_BASE, Config

    assert (TINY_BASE / "config.json").is_file() and (TINY_BASE / "tokenizer.json").is_file()  # shipped
    for changes, said in (
        ({"init": str(tmp_path)}, "not a model directory"),
        ({"ppo_pool": -1}, "--ppo-pool"),
        ({"start_floor": 1.5}, "--start-floor"),
    ):
        with pytest.raises(ConfigError, match=said) as caught:
            check_config(replace(Config(**PRESETS["tiny"]), **changes))
        assert "\n" not in str(caught.value)


def test_ppo_keeps_its_share_of_the_pool_spread_over_the_audit_order():
    from termgym.trainer.pipeline import kept_for_ppo

    tasks = [f"t{i}" for i in range(10)]
    supervised, reinforced = kept_for_ppo(tasks, 3)  # type: ignore[arg-type]  # only ordered here
    assert reinforced == ["t0", "t3", "t6"] and supervised == [t for t in tasks if t not in reinforced]
    assert kept_for_ppo(tasks, 0) == (tasks, tasks) == kept_for_ppo(tasks, 10)  # type: ignore[arg-type]


def test_the_family_plot_groups_each_evaluation_by_family(tmp_path):
    from termgym.trainer.plots import family_bars, write_family_plot

    heldout = {
        "supervised start": {"a": {"resolved": 0.25}, "b": {"resolved": 0.0}},
        "after PPO": {"a": {"resolved": 0.75}},
    }
    families, rates = family_bars(heldout)
    assert families == ["a", "b"] and rates["supervised start"] == [0.25, 0.0]
    assert rates["after PPO"][0] == 0.75 and rates["after PPO"][1] != rates["after PPO"][1]  # NaN: not evaluated
    path = write_family_plot(tmp_path / "plots" / "f.png", heldout)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
