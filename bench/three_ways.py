"""One policy, three ways, one result: the main job's supervised checkpoint evaluated greedily on
the held-out set by the in-process torch sampler, by the in-process vLLM engine, and by a real
``vllm serve`` reached the way a user evaluates a model (``termgym run --agent model --client
tokens``), all on the same episode loop, renderer and budgets. It prints how many tasks each way
resolves and which tasks differ between ways, with the first turn at which their episodes differ.

    .venv/bin/python bench/three_ways.py [--pool 2000] [--heldout 192] [--sft-steps 750] [--out DIR]
    .venv/bin/python bench/three_ways.py --policy RUN/sft/policy --heldout-dir RUN/tasks/heldout

Without ``--policy`` it runs the main job's first phases (``trainer/pipeline.py``: the pool, the
audit, the tiny policy, the reference trajectories, the supervised warm start) with the tiny
preset's settings, except that the policy's attention heads are 64 wide (vLLM's CPU attention
needs it; ``make demo``'s policy has 32). Greedy decoding in float32 everywhere: a task can still
differ where two candidate tokens' log-probs tie to within the engines' rounding (vLLM's CPU kernels
and torch's sum in different orders), and one flipped token changes the rest of the episode.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console

from termgym.records import TrialRecord
from termgym.tasks import load_task
from termgym.trainer.config import PRESETS, Config, max_context_of
from termgym.trainer.demonstrations import record_demonstrations
from termgym.trainer.evaluate import evaluate
from termgym.trainer.models import load_policy, policy_renderer
from termgym.trainer.pipeline import build_policy, prepare_pool, warm_start
from termgym.trainer.rollout import rollout_options, rollout_settings
from termgym.trainer.vllm_sampler import VllmSampler
from termgym.transcript import read_transcript
from tests.termgym.agents.vllm_server import VllmServer


async def supervised_checkpoint(out: Path, cfg: Config, console: Console) -> tuple[Path, Path]:
    """The main job's phases 1 to 4 into ``out``: the supervised policy and the held-out tasks."""
    pool = await prepare_pool(out, cfg, console)
    policy, tokenizer = build_policy(out, cfg, console)
    renderer = policy_renderer(out / "init", tokenizer, cfg)
    demos = await record_demonstrations(out, cfg, pool.selection, renderer, console)
    await warm_start(out, cfg, demos, policy, tokenizer, console)
    return out / "sft" / "policy", out / "tasks" / "heldout"


def served_records(policy_dir: Path, heldout: Path, cfg: Config, out: Path) -> list[TrialRecord]:
    """``termgym run`` with the tokens client against a ``vllm serve`` of ``policy_dir``."""
    settings = rollout_settings(cfg)
    with VllmServer(policy_dir, served_model_name="policy", max_model_len=max_context_of(cfg)) as server:
        command = [
            *(sys.executable, "-m", "termgym", "run", str(heldout)),
            *("--agent", "model", "--client", "tokens", "--base-url", server.base_url, "--model", "policy"),
            *("--tokenizer", str(policy_dir), "--renderer", cfg.renderer, "--temperature", "0"),
            *("--action-format", cfg.action_format, "--system-prompt", settings.loop.system_prompt or ""),
            *("--max-tokens", str(cfg.max_new_tokens), "--max-output-tokens", str(cfg.observation_tokens)),
            *("--context-window", str(max_context_of(cfg)), "--context", cfg.context),
            *("--max-turns", str(cfg.max_turns), "-n", str(cfg.concurrency), "--out", str(out)),
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return [TrialRecord(**json.loads(line)) for line in (out / "trials.jsonl").read_text().splitlines()]


def commands_of(record: TrialRecord) -> list[str]:
    """The commands of a served trial, then its stop reason (as the in-process ways record them)."""
    turns = read_transcript(record.transcript or "")["turns"]
    return [*(t["action"]["command"] for t in turns if t["action"]["kind"] == "command"), record.stop_reason or ""]


# the comparison's own start: a tiny policy built here (head_dim 64 for vLLM) on the short families' references
THREE_WAYS_START = dict(init="", families="short", demonstrations="reference", ppo_pool=0)


async def main_async(args) -> int:
    console = Console(file=sys.stderr, width=None if sys.stderr.isatty() else 140)
    cfg = replace(
        Config(**PRESETS["tiny"]),
        pool=args.pool,
        heldout=args.heldout,
        sft_steps=args.sft_steps,
        generator="vllm",
        **THREE_WAYS_START,
    )  # generator vllm: the tiny policy is built with head_dim 64
    out = Path(args.out or time.strftime("runs/three-ways-%Y%m%d-%H%M%S", time.gmtime()))
    if args.policy:
        policy_dir, heldout = Path(args.policy), Path(args.heldout_dir)
    else:
        policy_dir, heldout = await supervised_checkpoint(out / "main-job", cfg, console)
    policy, tokenizer = load_policy(policy_dir)
    renderer = policy_renderer(policy_dir, tokenizer, cfg)
    tasks = [load_task(p) for p in sorted(heldout.iterdir()) if p.is_dir()]
    settings, ways, commands, seconds = rollout_settings(cfg), {}, {}, {}

    async def in_process(name: str, sampler=None) -> None:
        seen: dict[str, list[str]] = {}
        began = time.monotonic()
        _, records = await evaluate(
            policy,
            renderer,
            tasks,
            rollout_options(cfg, f"three-ways-{name}"),
            settings,
            concurrency=cfg.concurrency,
            sampler=sampler,
            on_record=lambda r, t: seen.__setitem__(r.task, [*t.commands, t.stop_reason or ""]),
        )
        seconds[name] = time.monotonic() - began
        ways[name] = {r.task: r.resolved for r in records}
        commands[name] = seen

    await in_process("torch sampler")
    engine = VllmSampler(copy.deepcopy(policy), policy_dir, max_context=max_context_of(cfg), seed=cfg.seed)
    try:
        await in_process("vLLM engine", engine)
    finally:
        engine.close()
    began = time.monotonic()
    served = served_records(policy_dir, heldout, cfg, out / "served")
    seconds["vllm serve + termgym run"] = time.monotonic() - began
    ways["vllm serve + termgym run"] = {r.task: r.resolved for r in served}
    commands["vllm serve + termgym run"] = {r.task: commands_of(r) for r in served}

    names = list(ways)
    print(f"held-out set: {len(tasks)} tasks, greedy, policy {policy_dir}")
    print("| way | resolved | differs from the torch sampler | seconds |\n|---|---|---|---|")
    for name in names:
        differs = sum(ways[name][t.name] != ways[names[0]][t.name] for t in tasks)
        print(f"| {name} | {sum(ways[name].values())} | {differs} | {seconds[name]:.0f} |")
    for name in names[1:]:
        for task in tasks:
            mine, base = commands[name].get(task.name, []), commands[names[0]].get(task.name, [])
            if mine != base:
                turn = next((i for i, (a, b) in enumerate(zip(mine, base)) if a != b), min(len(mine), len(base)))
                outcome = f"{ways[names[0]][task.name]} -> {ways[name][task.name]}"
                print(f"  {name}: {task.name} differs from turn {turn} (resolved {outcome})")
    (out / "three-ways.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "three-ways.json").write_text(json.dumps({"ways": ways, "commands": commands, "seconds": seconds}))
    return 0


def main() -> int:
    assert __doc__ is not None
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=int, default=PRESETS["tiny"]["pool"])
    parser.add_argument("--heldout", type=int, default=PRESETS["tiny"]["heldout"])
    parser.add_argument("--sft-steps", type=int, default=450)  # a fresh tiny policy needs its 450 steps
    parser.add_argument("--policy", default=None, help="a supervised policy directory (head_dim >= 64)")
    parser.add_argument("--heldout-dir", default=None, help="with --policy: the held-out tasks")
    parser.add_argument("--out", default=None)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
