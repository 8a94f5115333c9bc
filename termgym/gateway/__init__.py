"""The recording model gateway: an OpenAI-compatible server between an unchanged agent harness and
its model, one session per trial, every call's token ids and log-probs recorded, and the token
samples a trainer takes built from them (``server``, ``upstreams``, ``calls``, ``shapes``)."""

from termgym.gateway.calls import Call, Merged, merge_calls
from termgym.gateway.server import SESSION_HEADER, Gateway, GatewaySession
from termgym.gateway.upstreams import Answer, ForwardUpstream, SessionUpstream, Upstream

__all__ = [
    "SESSION_HEADER",
    "Answer",
    "Call",
    "ForwardUpstream",
    "Gateway",
    "GatewaySession",
    "Merged",
    "SessionUpstream",
    "Upstream",
    "merge_calls",
]
