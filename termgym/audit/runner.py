"""The audit's I/O: trials in fresh sandboxes through the normal trial path, then ``termgym.audit.rubric``.

Per task: k oracle trials (``run_trial`` with ``OracleAgent``), one null trial, up to three prefix
trials (the reference solution cut after a quarter, half and all but one of its top-level commands,
``audit.solution_prefixes``; each runs with the whole ``solution/`` uploaded), and one
determinism episode (the oracle in an ``AsyncTerminalEnv``, then ``verify`` once more on the same
sandbox; the two reports' assertion names and statuses must match). Leakage is checked on the
host, the content hashes and relative paths of ``tests/`` and ``solution/`` against the files of
the environment's build context; and in the determinism episode, before the oracle runs, the
content hashes of the files in the prepared sandbox under the Dockerfile's ``COPY`` destinations
and working directories (``audit.scan_roots``), which catches a copy made by a ``RUN`` step too
(a flag, since a verifier may keep a pristine copy of an input the agent is meant to read).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from termgym.agents import NullAgent, OracleAgent
from termgym.agents.basic import submit_every_step
from termgym.aio import gather_limited
from termgym.audit.cache import AuditCache
from termgym.audit.judge import Judge, JudgeError
from termgym.audit.rubric import (
    DEFAULT_MIN_SCORE,
    MechanicalFindings,
    RunResult,
    Verdict,
    decide,
    find_leaks,
    merge_leaks,
    scan_roots,
    solution_prefixes,
)
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.episode.overrides import override_fields
from termgym.episode.verification import verify
from termgym.errors import ConfigError, TermgymError
from termgym.images.dockerfile import CopyStep, WorkdirStep, parse_dockerfile
from termgym.images.dockerfile_syntax import DockerfileError
from termgym.output import plain_text as plain
from termgym.records import TrialRecord
from termgym.sandboxes.base import Sandbox
from termgym.tasks import Task
from termgym.trial import StepReturn, run_trial

_EMPTY = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class PrefixAgent:
    """Uploads the solution, plus the prefix script as ``/solution/.termgym-prefix.sh``, and runs it."""

    script: str
    name: str = "prefix"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        with tempfile.TemporaryDirectory() as tmp:
            prefix = Path(tmp) / "prefix.sh"
            prefix.write_text(self.script)
            await env.upload([*env.task.solution_files(), (prefix, ".termgym-prefix.sh")], "/solution")
        step = await env.step("bash /solution/.termgym-prefix.sh", timeout=env.agent_timeout)
        return step if env.done else await submit_every_step(env)


def _result(record: TrialRecord) -> RunResult:
    error = f"{record.error['kind']}: {record.error['message']}" if record.error else None
    return RunResult(record.passed, record.total, record.resolved, error)


def _hashes(files: list[tuple[Path, str]]) -> list[tuple[str, str]]:
    return [(relative, hashlib.sha256(path.read_bytes()).hexdigest()) for path, relative in files]


def _protected(task: Task) -> dict[str, list[tuple[str, str]]]:
    return {"tests": _hashes(task.test_files()), "solution": _hashes(task.solution_files())}


def leakage(task: Task, sandbox_files: Sequence[tuple[str, str]] = ()) -> tuple[list[str], list[str]]:
    """Files of ``tests/`` or ``solution/`` present in the build context (by content or path), and
    the others whose content is in ``sandbox_files`` (``(absolute path, sha256)`` from the prepared
    sandbox)."""
    protected = _protected(task)
    in_context = _build_context_leaks(task, protected)
    in_sandbox = find_leaks(protected, list(sandbox_files), min_bytes_hash=_EMPTY)
    return in_context, merge_leaks(in_context, in_sandbox)[len(in_context) :]


def _build_context_leaks(task: Task, protected: dict[str, list[tuple[str, str]]]) -> list[str]:
    context = task.environment_dir
    files = [(p, p.relative_to(context).as_posix()) for p in sorted(context.rglob("*")) if p.is_file()]
    if task.layout == "tb1":  # the task directory is the build context: only copies elsewhere count
        files = [f for f in files if not f[1].startswith("tests/") and f[1] not in ("run-tests.sh", "solution.sh")]
    return find_leaks(protected, _hashes(files), min_bytes_hash=_EMPTY)


_SCAN = r"""
for root in "$@"; do
  [ -d "$root" ] && find "$root" -xdev -type f -size -4M -exec sha256sum {} + 2>/dev/null
done
exit 0
"""


def _sandbox_roots(task: Task) -> list[str]:
    if task.dockerfile is None:
        return []
    try:
        plan = parse_dockerfile(task.dockerfile.read_text(encoding="utf-8", errors="replace"))
    except DockerfileError:
        return []
    dests = [step.dest for step in plan.steps if isinstance(step, CopyStep)]
    workdirs = [plan.workdir] + [step.path for step in plan.steps if isinstance(step, WorkdirStep)]
    return scan_roots(dests, workdirs)


async def _sandbox_files(sandbox: Sandbox, roots: list[str]) -> list[tuple[str, str]]:
    """``(absolute path, sha256)`` of the regular files under ``roots`` in the prepared sandbox."""
    if not roots:
        return []
    result = await sandbox.exec(["/bin/sh", "-c", _SCAN, "sh", *roots], timeout=120, cwd="/", output_limit=8 << 20)
    files = []
    for line in result.text.splitlines():
        digest, _, path = line.partition("  ")
        if len(digest) == 64 and path:
            files.append((path, digest))
    return files


async def _determinism(task: Task, options: EnvOptions) -> tuple[bool | None, list[tuple[str, str]]]:
    """Verify the oracle's final state twice (None: the episode could not be verified), and the
    files of the prepared sandbox under the Dockerfile's destinations, before the oracle ran."""
    files: list[tuple[str, str]] = []
    try:
        async with AsyncTerminalEnv(task, options) as env:
            instruction, info = await env.reset()
            assert env.sandbox is not None
            files = await _sandbox_files(env.sandbox, _sandbox_roots(task))
            await OracleAgent().run(env, instruction, info)
            first = env.verification
            if first is None or env.sandbox is None:
                return None, files
            second = await verify(task, env.sandbox, reward_scale=options.reward_scale)
    except (TermgymError, ValueError):
        return None, files

    def shape(report) -> list[tuple[str, str]]:
        return [(a.name, a.status) for a in report.assertions]

    same = shape(first.report) == shape(second.report) and first.report.error == second.report.error
    return same, files


async def measure(task: Task, options: EnvOptions, *, k: int = 3) -> MechanicalFindings:
    if k < 1:
        raise ConfigError(f"k must be at least 1, got {k}")
    oracle = [run_trial(task, OracleAgent(), options) for _ in range(k)]
    null = run_trial(task, NullAgent(), options)
    base = task.solution_dir if task.layout == "harbor" and task.solution_dir is not None else task.path
    prefixes, steps = solution_prefixes((base / str(task.solution_script)).read_text(errors="replace"))
    probes = [run_trial(task, PrefixAgent(script), options) for _, script in prefixes]
    records, (deterministic, sandbox_files) = await asyncio.gather(
        asyncio.gather(*oracle, null, *probes), _determinism(task, options)
    )
    in_context, in_sandbox = leakage(task, sandbox_files)
    return MechanicalFindings(
        oracle=tuple(_result(r) for r in records[:k]),
        null=_result(records[k]),
        prefixes=tuple((keep, _result(r)) for (keep, _), r in zip(prefixes, records[k + 1 :])),
        steps=steps,
        deterministic=deterministic,
        leaks=tuple(in_context),
        sandbox_copies=tuple(in_sandbox),
        scale=options.reward_scale,
    )


async def audit_task(
    task: Task, options: EnvOptions, *, k: int = 3, judge: Judge | None = None, min_score: float = DEFAULT_MIN_SCORE
) -> Verdict:
    """The verdict for one task: every mechanical check, then the judge when one is given."""
    if task.solution_script is None:
        findings = MechanicalFindings(oracle=(RunResult(0, 0, False, "the task has no reference solution"),), null=None)
        return decide(task.name, findings, min_score=min_score)
    findings = await measure(task, options, k=k)
    judge_scores, judge_rejects, judge_note = None, None, "not run"
    if judge is not None:
        try:
            answer = await judge.judge(task)
            judge_scores, judge_rejects = answer.scores, answer.rejects
            judge_note = "ran"
        except JudgeError as exc:
            judge_note = f"failed: {exc}"
    verdict = decide(task.name, findings, judge_scores, judge_rejects, min_score=min_score)
    verdict.judge = judge_note
    return verdict


async def audit_tasks(
    tasks: list[Task],
    options: EnvOptions,
    *,
    k: int = 3,
    judge: Judge | None = None,
    concurrency: int = 2,
    min_score: float = DEFAULT_MIN_SCORE,
    cache: AuditCache | None = None,
) -> list[Verdict]:
    """Audit tasks, ``concurrency`` at a time (each runs up to k + 5 episodes at once); in input order.
    With a ``cache`` and no judge, a task whose files an earlier audit saw unchanged (same k and
    minimum score) is not run again, and every fresh verdict is added to the cache."""
    use_cache = judge is None and min_score == DEFAULT_MIN_SCORE
    kept = cache if use_cache else None

    async def one(task: Task) -> Verdict:
        if kept is not None and (cached := kept.get(task, k)) is not None:
            cached.task = task.name  # the same files may sit in a directory of another name
            return cached
        verdict = await audit_task(task, options, k=k, judge=judge, min_score=min_score)
        if kept is not None:
            kept.put(task, k, verdict)
        return verdict

    return await gather_limited([lambda t=task: one(t) for task in tasks], concurrency)


# -- the command line (termgym audit) -------------------------------------------------------------


async def run_audit(args, tasks: list[Task], console) -> int:
    """``termgym audit``: the per-task table (or JSON), ``--select`` written; the exit code."""
    from rich.table import Table
    from rich.text import Text

    from termgym.audit.judge import OpenAIJudge
    from termgym.images.build import load_aliases
    from termgym.sandboxes import preflight

    if args.k < 1:
        raise ConfigError(f"--k must be at least 1, got {args.k}")
    if args.concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {args.concurrency}")
    if (args.judge_url is None) != (args.judge_model is None):
        raise ConfigError("--judge-url and --judge-model go together")
    min_score = DEFAULT_MIN_SCORE if args.min_score is None else args.min_score
    judge = (
        OpenAIJudge(args.judge_url, args.judge_model, os.environ.get("TERMGYM_JUDGE_API_KEY"))
        if args.judge_url
        else None
    )
    if args.cluster:
        from termgym.sandboxes.ray.cluster import connect

        connect(args.cluster, args.backend, cpus_per_sandbox=args.cpus_per_sandbox)
    else:
        await asyncio.to_thread(preflight, args.backend)
    options = EnvOptions(
        backend=args.backend,
        cluster=args.cluster,
        run_id=f"audit-{uuid.uuid4().hex[:8]}",
        image_aliases=load_aliases(args.image_alias),
        **override_fields(args),
    )
    cache_path: Path | None = args.cache
    cache = AuditCache.load(cache_path) if cache_path is not None else None
    verdicts = await audit_tasks(
        tasks, options, k=args.k, judge=judge, concurrency=args.concurrency, min_score=min_score, cache=cache
    )
    if cache is not None and cache_path is not None:
        cache.save(cache_path)
    if args.select is not None:
        args.select.parent.mkdir(parents=True, exist_ok=True)
        args.select.write_text("".join(f"{path}\n" for path in _selected_paths(tasks, verdicts)))
    if args.json:
        print(json.dumps([v.to_dict() for v in verdicts], indent=2))
    else:
        table = Table(title=f"task audit · k={args.k} · judge {'on' if judge else 'not run'}", title_justify="left")
        columns = ("task", "oracle", "null", "prefixes", "asserts", "twice", "leaks", "score", "verdict", "flags")
        for column in columns:
            table.add_column(column, justify="left" if column in ("task", "verdict", "flags") else "right")

        for v in verdicts:
            reasons = "; ".join(f"{r.kind}: {r.reason}" for r in v.rejects)
            verdict = (
                Text("accept", style="green")
                if v.accepted
                else Text.assemble(("reject", "red"), plain(f" {reasons or f'score under {min_score:g}'}"))
            )
            c = v.checks
            table.add_row(
                plain(v.task.removeprefix("termgym/")),
                plain(c.get("oracle", "-")),
                plain(c.get("null", "-")),
                plain(c.get("partial", "-")),
                plain(c.get("assertions", "-")),
                plain(c.get("determinism", "-")),
                plain(c.get("leakage", "-")),
                f"{v.score:.3f}",
                verdict,
                plain(", ".join(_SHORT_FLAGS.get(f.kind, f.kind) for f in v.flags) or "-"),
            )
        console.print(table)
        accepted = sum(v.accepted for v in verdicts)
        console.print(
            f"{accepted}/{len(verdicts)} tasks accepted"
            + (f" · selection: {args.select}" if args.select else "")
            + (f" · {cache.hits} verdicts from the cache {args.cache}" if cache is not None else "")
        )
    return 1 if args.strict and not all(v.accepted for v in verdicts) else 0


_SHORT_FLAGS = {"binary_in_disguise": "binary?", "test_content_in_sandbox": "copy in sandbox?"}


def _selected_paths(tasks: list[Task], verdicts: list[Verdict]) -> list[str]:
    """Accepted task directories in score order (``audit.select_order``); training shuffles it."""
    from termgym.audit.rubric import select_order

    paths = {task.name: str(task.path) for task in tasks}
    return [paths[name] for name in select_order(verdicts)]
