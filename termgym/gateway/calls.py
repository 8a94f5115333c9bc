"""What the gateway records of each model call, and the token samples built from a session's calls
(pure functions, no I/O).

A ``Call`` is one request a harness sent through its session: the request it sent (after the
gateway forced its settings), the status and body the upstream answered, the prompt and
completion token ids and the log-probs the upstream returned (vLLM: ``return_token_ids``,
``logprobs``), usage and timing.

``merge_calls`` is the renderers' bridge rule applied to what a server returned: calls merge into
one sample while each call's prompt ids extend the sample so far (the previous prompt and
completion) exactly; what the prompt adds is the bridge (outside the loss), the completion is
sampled (mask 1, its log-probs kept). A prompt that does not extend it starts a new segment and is
counted as a break (``bridge_breaks`` of the segment it ended): never a silent merge. Calls the
upstream answered without token ids are counted as ``untracked`` and end the chain (the next
prompt cannot extend ids nobody saw).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from termgym.agents.transport import int_list
from termgym.transcript import Segment

CHAT_PATH = "/chat/completions"
COMPLETIONS_PATH = "/completions"


@dataclass
class Call:
    """One model call of a session, as the gateway saw it."""

    index: int
    path: str  # CHAT_PATH or COMPLETIONS_PATH
    request: dict[str, Any]  # the body sent upstream (the harness's, with the forced settings)
    status: int = 0  # what the harness was answered; 0 until answered
    response: dict[str, Any] | None = None  # the answer's JSON body, when it was JSON
    error: str | None = None  # a one-line reason when the call failed (upstream error, deadline...)
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    usage: dict[str, Any] | None = None
    started: float = 0.0  # seconds since the session opened
    latency: float = 0.0  # seconds from the request's arrival to its answer
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The call's fields, shallow: the record shares the request and answer it holds (a deep copy
        of every message and id, at each trial's end on the gateway's loop, stalled every session:
        bench/gateway.py)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def token_fields(path: str, body: dict[str, Any]) -> tuple[list[int] | None, list[int] | None, list[float] | None]:
    """The prompt ids, completion ids and per-token log-probs of a response ``body`` in vLLM's
    shapes: chat puts the prompt's ids at the top level and the completion's in
    ``choices[0].token_ids``, log-probs in ``choices[0].logprobs.content``; completions put both
    in the choice, log-probs in ``choices[0].logprobs.token_logprobs``. Missing parts are None;
    log-probs whose count differs from the completion ids are None (they cannot be aligned)."""
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    prompt = int_list(body.get("prompt_token_ids")) or int_list(choice.get("prompt_token_ids"))
    completion = int_list(choice.get("token_ids"))
    scores = choice.get("logprobs")
    logprobs: list[float] | None = None
    if isinstance(scores, dict):
        if path == CHAT_PATH and isinstance(scores.get("content"), list):
            logprobs = [
                float(item.get("logprob", 0.0)) if isinstance(item, dict) else 0.0 for item in scores["content"]
            ]
        elif isinstance(scores.get("token_logprobs"), list):
            logprobs = [float(x) if isinstance(x, (int, float)) else 0.0 for x in scores["token_logprobs"]]
    if logprobs is not None and (completion is None or len(logprobs) != len(completion)):
        logprobs = None
    return prompt, completion, logprobs


@dataclass
class Merged:
    """The token samples of a session: one ``Segment`` per unbroken chain of calls."""

    segments: list[Segment]
    breaks: int  # prompts that did not extend the sample before them
    untracked: int  # answered calls without token ids
    without_logprobs: int  # calls with ids but no log-probs (0.0 stands in: not fit for PPO's ratio)

    @property
    def break_rate(self) -> float:
        """Breaks per boundary between consecutive tracked calls (bridges kept plus breaks), as the
        trainer's ``bridge_break_rate`` counts them."""
        boundaries = sum(s.bridges for s in self.segments) + self.breaks
        return self.breaks / boundaries if boundaries else 0.0


def merge_calls(calls: Sequence[Call]) -> Merged:
    """The session's samples by the bridge rule (module docstring), calls taken in arrival order;
    only answered calls (status 200) count."""
    segments: list[Segment] = []
    breaks = untracked = without_logprobs = 0
    current: Segment | None = None
    for call in sorted(calls, key=lambda c: c.index):
        if call.status != 200:
            continue
        prompt, completion = call.prompt_ids, call.completion_ids
        if prompt is None or completion is None:
            untracked += 1
            current = None
            continue
        logprobs = call.logprobs
        if logprobs is None:
            without_logprobs += 1
            logprobs = [0.0] * len(completion)
        if current is not None and len(prompt) >= len(current.ids) and prompt[: len(current.ids)] == current.ids:
            bridge = prompt[len(current.ids) :]
            current.ids += bridge
            current.mask += [0] * len(bridge)
            current.logprobs += [0.0] * len(bridge)
            current.bridges += 1
        else:
            broke = current is not None
            if current is not None:
                current.bridge_breaks += 1
                breaks += 1
            current = Segment(len(segments), "bridge_break" if broke else "start")
            current.ids, current.mask, current.logprobs = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
            segments.append(current)
        current.ids += completion
        current.mask += [1] * len(completion)
        current.logprobs += list(logprobs)
    return Merged(segments, breaks, untracked, without_logprobs)
