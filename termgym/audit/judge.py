"""The audit's pluggable judge: the rubric dimensions no trial can measure.

A ``Judge`` reads a task (instruction, tests, reference solution) and answers scores in [0, 1] for
``audit.JUDGE_DIMENSIONS`` (instruction-verifier alignment, solution legitimacy, instruction
clarity and completeness, task value), each with a reason, plus hard rejects
(``hidden_requirements``, ``solution_shortcut``, ``test_leakage``, ``weak_verifier``).

``OpenAIJudge`` asks any OpenAI-compatible ``/v1/chat/completions`` endpoint (a vLLM server, for
one) through the same transport as the model agent (``termgym.agents.transport``). The answer is
parsed defensively: the first JSON object in the reply; unknown dimensions and reject kinds are
dropped, scores are clamped to [0, 1] (a 1-5 or 0-10 scale is rescaled), and a reply with no
usable score raises ``JudgeError``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

from termgym.agents.transport import Endpoint, call, openai_client
from termgym.audit.rubric import JUDGE_DIMENSIONS, WEIGHTS, Reject
from termgym.errors import AgentDeadline, ConfigError, ModelError, TermgymError
from termgym.tasks import Task

JUDGE_REJECTS = ("hidden_requirements", "solution_shortcut", "test_leakage", "weak_verifier")
MAX_FILE_CHARS = 6000

RUBRIC = f"""You audit a terminal task used to train LLM agents. Score each dimension from 0 to 1:
- instruction_verifier_alignment (weight {WEIGHTS["instruction_verifier_alignment"]:.2f}): every test checks something
  the instruction asks for, and everything the instruction asks for is tested.
- solution_legitimacy ({WEIGHTS["solution_legitimacy"]:.2f}): the reference solution solves the task as stated,
  without shortcuts (hard-coding expected outputs, reading the tests, special-casing the checks).
- instruction_clarity ({WEIGHTS["instruction_clarity"]:.2f}): unambiguous, names paths and formats.
- instruction_completeness ({WEIGHTS["instruction_completeness"]:.2f}): no requirement is checked that the
  instruction does not state.
- task_value ({WEIGHTS["task_value"]:.2f}): a realistic, useful skill, neither trivial nor arbitrary.
The mechanical audit scores verifier correctness (0.15), granularity (0.10) and solution reliability (0.15).
Hard rejects, each with a reason: hidden_requirements (the tests check something the instruction does not
state), solution_shortcut, test_leakage (the agent can see the tests or the answers), weak_verifier (the
tests pass for wrong or trivial work).
Answer with one JSON object only:
{{"scores": {{"<dimension>": <0..1>, ...}}, "reasons": {{"<dimension>": "<one sentence>", ...}},
 "hard_rejects": [{{"kind": "<kind>", "reason": "<one sentence>"}}]}}"""


class JudgeError(TermgymError):
    """The judge could not be asked, or its answer held no usable score."""


@dataclass(frozen=True)
class JudgeAnswer:
    scores: dict[str, float]
    reasons: dict[str, str] = field(default_factory=dict)
    rejects: list[Reject] = field(default_factory=list)


class Judge(Protocol):
    async def judge(self, task: Task) -> JudgeAnswer: ...


def task_prompt(task: Task) -> str:
    """The task as the judge reads it: instruction, test files and solution files (each cut)."""
    parts = [f"# Instruction\n{task.instruction.strip()}"]
    for title, files in (("Test file", task.test_files()), ("Solution file", task.solution_files())):
        for path, relative in files:
            text = path.read_text(encoding="utf-8", errors="replace")
            parts.append(f"# {title} {relative}\n{text[:MAX_FILE_CHARS]}")
    return "\n\n".join(parts)


def parse_answer(content: str) -> JudgeAnswer:
    """The judge's reply to a ``JudgeAnswer`` (see the module docstring for what is tolerated)."""
    data = _first_json_object(content)
    if not isinstance(data, dict) or not isinstance(data.get("scores"), dict):
        raise JudgeError("the judge's reply holds no JSON object with 'scores'")
    values = {k: v for k, v in data["scores"].items() if k in JUDGE_DIMENSIONS and _number(v)}
    if not values:
        raise JudgeError("the judge's reply scores none of the rubric dimensions")
    top = max(values.values())
    divisor = 1.0 if top <= 1 else 5.0 if top <= 5 else 10.0
    scores = {k: min(1.0, max(0.0, float(v) / divisor)) for k, v in values.items()}
    raw_reasons = data.get("reasons")
    reasons = {k: str(v)[:500] for k, v in raw_reasons.items() if k in scores} if isinstance(raw_reasons, dict) else {}
    rejects = []
    for item in data.get("hard_rejects") or []:
        if isinstance(item, dict) and item.get("kind") in JUDGE_REJECTS:
            rejects.append(Reject(item["kind"], "judge: " + " ".join(str(item.get("reason", "")).split())[:500]))
    return JudgeAnswer(scores, reasons, rejects)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _first_json_object(content: str) -> object:
    decoder = json.JSONDecoder()
    start = content.find("{")
    while start >= 0:
        try:
            return decoder.raw_decode(content, start)[0]
        except json.JSONDecodeError:
            start = content.find("{", start + 1)
    return None


@dataclass(frozen=True)
class OpenAIJudge:
    """Asks an OpenAI-compatible server through the model agent's client (the ``openai`` SDK, its
    retries and timeouts); ``url`` is its base (``http://host:8000`` or ``.../v1``)."""

    url: str
    model: str
    api_key: str | None = None
    timeout: float = 120.0
    max_retries: int = 2

    @property
    def base_url(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith("/v1") else base + "/v1"

    async def judge(self, task: Task) -> JudgeAnswer:
        """One request (a client per task: an audit asks once per task, so nothing is kept open)."""
        try:
            endpoint = Endpoint(self.base_url, self.model, self.api_key, self.timeout, self.max_retries)
        except ConfigError as exc:
            raise JudgeError(str(exc)) from None
        messages = [{"role": "system", "content": RUBRIC}, {"role": "user", "content": task_prompt(task)}]
        deadline = time.monotonic() + self.timeout * (self.max_retries + 1) + 30
        client = openai_client(endpoint, connections=2)
        try:
            reply = await call(
                client.chat.completions.create(model=self.model, temperature=0, messages=messages),
                deadline,
                f"{self.base_url} judge",
            )
        except (ModelError, AgentDeadline) as exc:
            raise JudgeError(str(exc)) from exc
        finally:
            await client.close()
        choices = getattr(reply, "choices", None)
        content = choices[0].message.content if choices else None
        if not isinstance(content, str):
            raise JudgeError("the judge's reply has no choices[0].message.content text")
        return parse_answer(content)
