"""The task audit: keep only tasks whose verifiers can be trusted (issue 9).

The rubric has eight weighted dimensions; the mechanical audit (``termgym.audit.runner``) scores
three of them from trials (``verifier_correctness``, ``granularity``, ``solution_reliability``, each
in [0, 1]), a judge (``termgym.audit.judge``) may score the other five. A dimension that did not
run is left out and the score renormalised over the weights that did run.

A task is accepted when it has no hard reject (``solution_fails``, ``flaky``, ``weak_verifier``,
``test_leakage``, and from a judge ``hidden_requirements`` and ``solution_shortcut``) and its score
reaches ``min_score`` (default 0.5). Flags (``binary_in_disguise``, ``test_content_in_sandbox``)
are reported without rejecting.

Everything here is pure: no I/O, tested with tables of cases. The weights, each dimension's formula
and each reject's condition: docs/guides/audit.md#score."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from termgym.errors import ConfigError
from termgym.tasks import Task
from termgym.verifiers import DEFAULT_SCALE

WEIGHTS: dict[str, float] = {
    "instruction_verifier_alignment": 0.20,
    "verifier_correctness": 0.15,
    "granularity": 0.10,
    "solution_reliability": 0.15,
    "solution_legitimacy": 0.10,
    "instruction_clarity": 0.10,
    "instruction_completeness": 0.10,
    "task_value": 0.10,
}
MECHANICAL_DIMENSIONS = ("verifier_correctness", "granularity", "solution_reliability")
JUDGE_DIMENSIONS = tuple(d for d in WEIGHTS if d not in MECHANICAL_DIMENSIONS)
HARD_REJECTS = (
    "solution_fails",
    "flaky",
    "weak_verifier",
    "test_leakage",
    "hidden_requirements",
    "solution_shortcut",
)
FLAGS = ("binary_in_disguise", "test_content_in_sandbox")
DEFAULT_MIN_SCORE = 0.5


@dataclass(frozen=True)
class RunResult:
    """What one episode's verifier said: counted assertions passed, of total; resolved."""

    passed: int
    total: int
    resolved: bool
    error: str | None = None


@dataclass(frozen=True)
class MechanicalFindings:
    """Everything the runner measured for one task (no I/O past this point)."""

    oracle: tuple[RunResult, ...]
    null: RunResult | None
    prefixes: tuple[tuple[int, RunResult], ...] = ()  # (steps run, result); () for a one-step solution
    steps: int = 0  # top-level steps in the solution
    deterministic: bool | None = None  # None: not measured (the oracle episode failed)
    leaks: tuple[str, ...] = ()  # tests/ or solution/ files in the build context
    sandbox_copies: tuple[str, ...] = ()  # others whose content is in the prepared sandbox
    scale: int = DEFAULT_SCALE


@dataclass(frozen=True)
class Reject:
    kind: str
    reason: str


@dataclass
class Verdict:
    task: str
    scores: dict[str, float]  # dimension -> [0, 1], only the dimensions that ran
    score: float  # weighted, renormalised over the dimensions that ran
    rejects: list[Reject]
    accepted: bool
    checks: dict[str, str] = field(default_factory=dict)  # check -> one-line result for the table
    judge: str = "not run"
    flags: list[Reject] = field(default_factory=list)  # weaknesses that lower the score, no reject

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "accepted": self.accepted,
            "score": round(self.score, 4),
            "scores": {k: round(v, 4) for k, v in self.scores.items()},
            "rejects": [{"kind": r.kind, "reason": r.reason} for r in self.rejects],
            "flags": [{"kind": r.kind, "reason": r.reason} for r in self.flags],
            "checks": dict(self.checks),
            "judge": self.judge,
        }

    @property
    def assertions(self) -> int | None:
        """How many assertions the verifier counted on the reference solution (None: not known)."""
        counted = self.checks.get("assertions", "").partition("/")[0]
        return int(counted) if counted.isdigit() and int(counted) > 0 else None

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        """The inverse of ``to_dict`` (scores as rounded there)."""
        return cls(
            task=data["task"],
            scores=dict(data["scores"]),
            score=data["score"],
            rejects=[Reject(r["kind"], r["reason"]) for r in data["rejects"]],
            accepted=data["accepted"],
            checks=dict(data["checks"]),
            judge=data["judge"],
            flags=[Reject(r["kind"], r["reason"]) for r in data["flags"]],
        )


def with_audited_count(task: Task, verdict: Verdict) -> Task:
    """``task`` held to the number of assertions its audit counted, unless it declares its own."""
    if task.expected_assertions is not None or verdict.assertions is None:
        return task
    return replace(task, expected_assertions=verdict.assertions)


def weighted_score(scores: dict[str, float]) -> float:
    """The weighted mean over the dimensions present (renormalised); 0.0 when none is."""
    unknown = set(scores) - set(WEIGHTS)
    if unknown:
        raise ConfigError(f"unknown rubric dimensions: {sorted(unknown)}")
    weight = sum(WEIGHTS[d] for d in scores)
    return sum(WEIGHTS[d] * min(1.0, max(0.0, s)) for d, s in scores.items()) / weight if weight else 0.0


def mechanical_scores(
    f: MechanicalFindings,
) -> tuple[dict[str, float], list[Reject], list[Reject], dict[str, str]]:
    """The three mechanical dimensions, the hard rejects, the flags and a one-line result per check."""
    if f.scale < 1:
        raise ConfigError(f"scale must be positive, got {f.scale}")
    rejects: list[Reject] = []
    flags: list[Reject] = []
    checks: dict[str, str] = {}
    k = len(f.oracle)
    resolved = sum(r.resolved for r in f.oracle)
    checks["oracle"] = f"{resolved}/{k}"
    if k and resolved == 0:
        errors = sorted({r.error for r in f.oracle if r.error})
        first = f.oracle[0]
        detail = f"; error: {errors[0]}" if errors else f" ({first.passed}/{first.total} assertions passed)"
        rejects.append(Reject("solution_fails", f"the reference solution resolved 0/{k} fresh sandboxes{detail}"))
    elif resolved < k:
        rejects.append(Reject("flaky", f"the reference solution resolved only {resolved}/{k} fresh sandboxes"))
    total = max((r.total for r in f.oracle), default=0)
    if f.null is not None:
        total = max(total, f.null.total)
    checks["assertions"] = f"{total}/{f.scale}"
    verified = f.null is not None or any(r.error is None for r in f.oracle)  # some verifier ran
    if total == 0 and verified:
        rejects.append(Reject("weak_verifier", "the verifier counted no assertion"))

    null_share = 0.0
    if f.null is None:
        checks["null"] = "not run"
    else:
        checks["null"] = f"{f.null.passed}/{f.null.total}"
        null_share = f.null.passed / f.null.total if f.null.total else 0.0
        if f.null.resolved:
            rejects.append(
                Reject("weak_verifier", f"doing nothing resolves it ({f.null.passed}/{f.null.total} assertions)")
            )

    if f.deterministic is None:
        checks["determinism"] = "not measured"
    elif f.deterministic:
        checks["determinism"] = "same"
    else:
        checks["determinism"] = "differs"
        rejects.append(Reject("flaky", "verifying the same final state twice gave different reports"))

    if not f.prefixes:
        checks["partial"] = "n/a"
        partial = 0.5
    else:
        checks["partial"] = " ".join(f"{run}/{f.steps}:{r.passed}" for run, r in f.prefixes)
        floor = f.null.passed if f.null is not None else 0  # what passes for nothing is no progress
        if any(floor < r.passed < r.total for _, r in f.prefixes):
            partial = 1.0
        else:
            partial = 0.0
            seen = ", ".join(f"{run} steps {r.passed}/{r.total}" for run, r in f.prefixes)
            flags.append(
                Reject(
                    "binary_in_disguise",
                    f"no prefix of the solution earns partial credit beyond doing nothing ({seen})",
                )
            )

    found = [f"{len(f.leaks)} in context"] * bool(f.leaks) + [f"{len(f.sandbox_copies)} in sandbox?"] * bool(
        f.sandbox_copies
    )
    checks["leakage"] = ", ".join(found) or "none"
    for leak in f.leaks:
        rejects.append(Reject("test_leakage", leak))
    for copy in f.sandbox_copies:
        flags.append(Reject("test_content_in_sandbox", copy))

    scores = {
        "verifier_correctness": 0.0 if f.deterministic is False else 1.0 - null_share,
        "granularity": 0.5 * min(total, f.scale) / f.scale + 0.5 * partial,
        "solution_reliability": resolved / k if k else 0.0,
    }
    return scores, rejects, flags, checks


def decide(
    task: str,
    findings: MechanicalFindings,
    judge_scores: dict[str, float] | None = None,
    judge_rejects: list[Reject] | None = None,
    *,
    min_score: float = DEFAULT_MIN_SCORE,
) -> Verdict:
    """Combine the mechanical findings and an optional judge's answer into the verdict."""
    scores, rejects, flags, checks = mechanical_scores(findings)
    judge = "not run"
    if judge_scores is not None:
        scores.update({d: s for d, s in judge_scores.items() if d in JUDGE_DIMENSIONS})
        judge = "ran"
    rejects += judge_rejects or []
    score = weighted_score(scores)
    accepted = not rejects and score >= min_score
    return Verdict(task, scores, score, rejects, accepted, checks, judge, flags)


def select_order(verdicts: list[Verdict]) -> list[str]:
    """Accepted tasks, best score first (ties by name): what ``--select`` writes."""
    accepted = [v for v in verdicts if v.accepted]
    return [v.task for v in sorted(accepted, key=lambda v: (-v.score, v.task))]


# -- leakage -------------------------------------------------------------------------------------


def find_leaks(
    protected: dict[str, list[tuple[str, str]]], visible: list[tuple[str, str]], *, min_bytes_hash: str = ""
) -> list[str]:
    """``protected``: group ("tests", "solution") -> [(relative path, sha256)]; ``visible``: the
    files the agent's environment is built from, [(relative path, sha256)]. A protected file leaks
    when a visible file has its content, or its relative path (beyond a bare file name shared
    by chance: the path must have a directory part, or the content must match). Files whose hash
    is ``min_bytes_hash`` (the caller passes the hash of empty content) never match by content."""
    by_hash: dict[str, str] = {h: p for p, h in visible if h != min_bytes_hash}
    paths = {p for p, _ in visible}
    leaks = []
    for group, files in protected.items():
        for path, digest in files:
            if digest in by_hash and digest != min_bytes_hash:
                leaks.append(f"{group}/{path} is in the environment as {by_hash[digest]} (same content)")
            elif ("/" in path and path in paths) or f"{group}/{path}" in paths:
                leaks.append(f"{group}/{path} is in the environment by path")
    return leaks


def scan_roots(copy_dests: list[str], workdirs: list[str]) -> list[str]:
    """Where to look for leaked files in a prepared sandbox: the directories the Dockerfile copies
    into and its working directories; never ``/`` itself (too broad), nor ``/tests``, ``/solution``
    or ``/logs`` (termgym fills those itself, after the agent)."""
    roots = set()
    for dest in copy_dests:
        roots.add(dest.rstrip("/") if dest.endswith("/") else dest.rsplit("/", 1)[0])
    roots.update(w.rstrip("/") for w in workdirs)
    private = ("/tests", "/solution", "/logs")
    return sorted(r for r in roots if r and r.startswith("/") and not r.startswith(private))


def merge_leaks(*groups: list[str]) -> list[str]:
    """One reason per protected file: the first group that reports it wins."""
    seen, merged = set(), []
    for leaks in groups:
        for leak in leaks:
            key = leak.split(" is in the ", 1)[0]
            if key not in seen:
                seen.add(key)
                merged.append(leak)
    return merged


# -- prefixes of the reference solution ----------------------------------------------------------

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_TOKEN = re.compile(r";;|;|&&|\|\||\||\(|\)|[^\s;|&()]+")
_OPENERS = {"if", "for", "while", "until", "case", "select", "{"}
_CLOSERS = {"fi", "done", "esac", "}"}
_COMMAND_START = {";", ";;", "&&", "||", "|", "(", ")", "do", "then", "else", "elif", "{", "!"}


def _strip_quotes(line: str, quote: str | None) -> tuple[str, str | None]:
    """The line with quoted text blanked and the comment dropped; the quote still open at its end."""
    out = []
    i = 0
    while i < len(line):
        c = line[i]
        if quote is None:
            if c == "\\":
                out.append("\\" if i == len(line) - 1 else "  ")  # a trailing backslash continues
                i += 2
                continue
            if c in "'\"":
                quote = c
                out.append(" ")
            elif c == "#" and (i == 0 or line[i - 1] in " \t;"):
                break
            else:
                out.append(c)
        elif c == quote:
            quote = None
            out.append(" ")
        elif c == "\\" and quote == '"':
            i += 1
        i += 1
    return "".join(out), quote


def split_top_level(script: str) -> list[int] | None:
    """The line index at which each top-level command of a bash script ends (inclusive).

    Blank lines, comments and the shebang are not commands. A command continues over a trailing
    backslash, a trailing ``|``/``&&``/``||``, an open quote, a here-document body and any block
    (``if``/``fi``, ``for``/``while``/``until``/``select``/``done``, ``case``/``esac``, braces,
    parentheses). Returns None when the script does not parse this simply (unbalanced blocks or an
    unterminated here-document): the caller then treats the solution as one step.
    """
    ends: list[int] = []
    stack: list[str] = []
    quote: str | None = None
    heredoc: tuple[str, bool] | None = None
    pending = continued = False  # a command has started and not ended; its last line continues
    for index, raw in enumerate(script.splitlines()):
        if heredoc is not None:
            word, strip_tabs = heredoc
            if (raw.lstrip("\t") if strip_tabs else raw) == word:
                heredoc = None
                if not stack and not continued:
                    ends.append(index)
                    pending = False
            continue
        was_quoted = quote is not None
        line, quote = _strip_quotes(raw, quote)
        if not line.strip() and not was_quoted and not pending:
            continue
        pending = True
        at_start = not was_quoted
        for token in _TOKEN.findall(line):
            if (at_start and token in _OPENERS) or token == "(":
                stack.append(token)
            elif token == ")":
                if stack and stack[-1] == "(":
                    stack.pop()
                elif not (stack and stack[-1] == "case"):  # in a case, ``pattern)`` closes nothing
                    return None
            elif token in _CLOSERS and (at_start or token == "}"):
                if not stack or _CLOSER_OF.get(stack[-1]) != token:
                    return None
                stack.pop()
            at_start = token in _COMMAND_START or token in _OPENERS or token in _CLOSERS
        match = _HEREDOC.search(raw) if "<<" in line else None  # the word may be quoted
        continued = line.rstrip().endswith(("\\", "|", "&&", "||")) or quote is not None
        if match is not None:
            heredoc = (match.group(2), match.group(0).startswith("<<-"))
            continue
        if not stack and not continued:
            ends.append(index)
            pending = False
    if stack or heredoc is not None or quote is not None:
        return None
    return ends


_CLOSER_OF = {"if": "fi", "for": "done", "while": "done", "until": "done", "select": "done", "case": "esac", "{": "}"}


def prefix_lengths(steps: int) -> list[int]:
    """How many top-level steps each prefix probe runs: a quarter, a half (rounded up) and all but
    the last, deduplicated, within [1, steps - 1]; [] for fewer than two steps."""
    if steps < 2:
        return []
    return sorted({max(1, steps // 4), (steps + 1) // 2, steps - 1} & set(range(1, steps)))


def solution_prefixes(script: str) -> tuple[list[tuple[int, str]], int]:
    """``([(steps kept, prefix script)...], steps in all)`` for the probes of ``prefix_lengths``;
    no probe for a script of fewer than two top-level commands or one that does not split simply
    (``split_top_level``: the solution then counts as one step)."""
    ends = split_top_level(script)
    if ends is None:
        return [], 1
    lines = script.splitlines()
    return [(keep, "\n".join(lines[: ends[keep - 1] + 1]) + "\n") for keep in prefix_lengths(len(ends))], len(ends)
