"""The trainer's one configuration dataclass, its presets, and the command line built from it.

Every field has a docstring right under it; ``--help`` shows it (read from this file's source, so
the two cannot disagree). ``--preset NAME`` sets a preset's values first; flags given explicitly win.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Config:
    model: str = ""
    """policy directory (any causal LM with its tokenizer, loaded locally); empty: build the tiny Qwen3-MoE policy into OUT/init"""
    tasks: tuple[str, ...] = ()
    """task directories or bundled task names; empty: every bundled task"""
    out: str = "runs/train"
    """run directory: metrics.jsonl, trajectories.jsonl, records.jsonl, checkpoint.pt, policy/"""
    backend: str = "local"
    """sandbox backend (local = the embedded one)"""
    steps: int = 10
    """training steps (each: one batch of rollouts, then one update)"""
    batch_size: int = 8
    """trajectories kept per step (the global batch)"""
    launch: int | None = None
    """trials launched per step (cancel, carry-over, reweight modes); default batch x 560/512"""
    mode: str = "wait"
    """scheduler mode: wait, cancel, carry-over or reweight"""
    concurrency: int = 8
    """trials in flight at once (one rollout node with this cap)"""
    max_turns: int = 4
    """commands per episode before the environment truncates it"""
    command_timeout: float = 10.0
    """seconds per command"""
    max_new_tokens: int = 48
    """tokens the policy may sample per turn"""
    max_context: int = 1024
    """tokens per episode, prompt and observations included; beyond it the episode is truncated"""
    observation_tokens: int = 128
    """tokens kept of each observation"""
    gamma: float = 1.0
    """discount over action tokens"""
    lam: float = 1.0
    """GAE lambda"""
    clip: float = 0.2
    """PPO ratio clip (symmetric)"""
    value_clip: float = 0.5
    """value-loss clip around the rollout-time values"""
    actor_lr: float = 1e-6
    """policy learning rate (Adam)"""
    critic_lr: float = 1.5e-5
    """critic learning rate (Adam)"""
    max_grad_norm: float = 1.0
    """gradient clipping, per model"""
    update_epochs: int = 2
    """passes over each batch"""
    minibatch_size: int = 4
    """trajectories per minibatch"""
    critic_warmup_steps: int = 2
    """steps of critic-only updates on rollouts of the starting policy before the first policy update"""
    seed: int = 0
    """seeds the tiny policy, the task order, sampling and minibatch order"""
    checkpoint_every: int = 1
    """steps between checkpoints (and at the end)"""
    resume: bool = False
    """continue from OUT/checkpoint.pt if it exists"""
    fsdp: bool = False
    """under torchrun: shard policy and critic with FSDP2 (fully_shard) instead of replicating them"""
    retokenize: bool = False
    """demonstration only: train on re-tokenized text instead of the sampled ids (token drift > 0)"""
    routing_replay: bool = True
    """R3 for MoE policies: the log-prob recompute and the loss forwards use the experts the sampler chose at sampled tokens (prompt and observation tokens route freely); turns the router load-balancing loss off. No effect on a dense policy"""


PRESETS: dict[str, dict] = {
    # For these machines: a tiny MoE policy, four quick bundled tasks, short episodes, larger
    # learning rates than the published ones (which are for billion-parameter models).
    "tiny": dict(
        tasks=("text-processing/word-frequency", "file-ops/organize-by-extension",
               "shell-scripting/ipv4-filter", "archives/extract-configs"),  # fmt: skip
        steps=4, batch_size=4, concurrency=4, max_turns=2, command_timeout=5.0, max_new_tokens=16,
        max_context=1024, observation_tokens=64, actor_lr=1e-4, critic_lr=1e-3, update_epochs=2,
        minibatch_size=2, critic_warmup_steps=1,
    ),
}


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right under it in the class body)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[node.target.id] = " ".join(str(following.value.value).split())  # type: ignore[union-attr]
    return docs


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line from the caller, not argparse's usage block
        raise ValueError(f"{message} (see {self.prog} --help)")


def build_parser(prog: str = "termgym train") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Train a terminal agent with PPO on termgym tasks.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="start from a preset (tiny: for a CPU)")
    docs = field_docs(Config)
    for f in dataclasses.fields(Config):
        flag, help_text = "--" + f.name.replace("_", "-"), f"{docs[f.name]} (default: {f.default!r})"
        kind = str(f.type)
        if kind == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif kind.startswith("tuple"):
            parser.add_argument(flag, nargs="*", default=None, help=help_text)
        else:
            convert = {"int": int, "float": float, "str": str, "int | None": int}[kind]
            parser.add_argument(flag, type=convert, default=None, help=help_text)
    return parser


def parse_config(argv: Sequence[str] | None = None) -> Config:
    """Defaults, then the preset, then the flags given explicitly."""
    args = build_parser().parse_args(argv)
    values = dict(PRESETS[args.preset]) if args.preset else {}
    for f in dataclasses.fields(Config):
        given = getattr(args, f.name)
        if given is not None:
            values[f.name] = tuple(given) if isinstance(given, list) else given
    return Config(**values)
