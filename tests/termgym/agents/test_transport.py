"""The transport's reading of a context-length error, and the place of its two exceptions in the tree
(the episode loop and the trainer catch them by these classes). The faults over HTTP are tested in
``test_model_faults.py``."""

from __future__ import annotations

import pytest

from termgym.agents.transport import envelope_message, named_field, prompt_length, rejected_field
from termgym.errors import AgentDeadline, ContextExceeded, ModelError, TermgymError


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("This model's maximum context length is 2048 tokens. However, your prompt contains 3001 input tokens", 3001),
        ("However, your prompt contains at least 4097 input tokens.", 4097),
        ("you requested 5000 tokens (4000 in the messages, 1000 in the completion)", 4000),
        ("The decoder prompt (length 10) is longer ... request has 2500 input tokens", 2500),
        ("max_tokens=4096 cannot be greater than max_model_len=2048", None),
        ("the prompt has 900 tokens: no room left in 1024", None),
    ],
)
def test_the_prompt_length_is_read_from_the_servers_wordings(message: str, expected: int | None):
    assert prompt_length(message) == expected


def test_a_full_context_is_a_model_error_and_the_deadline_is_not():
    exc = ContextExceeded("too long", prompt_tokens=12)
    assert isinstance(exc, ModelError) and exc.kind == "model_error" and exc.prompt_tokens == 12
    assert ContextExceeded("too long").prompt_tokens is None and str(exc) == "too long"
    deadline = AgentDeadline("out of time")
    assert isinstance(deadline, TermgymError) and not isinstance(deadline, (ModelError, TimeoutError))
    assert deadline.kind == "agent_timeout"


def test_a_rejected_field_is_named_as_a_whole_word():
    fields = ("return_token_ids", "logprobs")
    assert named_field("Unrecognized request argument supplied: return_token_ids", fields) == "return_token_ids"
    assert named_field("logprobs is not supported", fields) == "logprobs"
    assert named_field("top_logprobs must be at most 20", fields) is None  # not a complaint about logprobs
    rejection = ModelError("HTTP 400")
    rejection.__cause__ = _Rejection({"error": {"message": "top_logprobs must be <= 20"}})
    assert rejected_field(rejection, fields) is None
    rejection.__cause__ = _Rejection({"error": {"message": "logprobs are not supported"}})
    assert rejected_field(rejection, fields) == "logprobs"


def test_the_error_envelope_is_read_in_both_shapes():
    assert envelope_message({"error": {"message": "  too\n many  "}}) == "too many"
    assert envelope_message({"message": "bare"}) == "bare"
    assert envelope_message({"error": "text"}) is None and envelope_message(b"raw") is None
    assert envelope_message({"error": {"message": "x" * 900}}, 300) == "x" * 300


class _Rejection(Exception):
    """What the SDK raises: an error carrying the server's JSON body."""

    def __init__(self, body: dict) -> None:
        super().__init__("rejected")
        self.body = body
