"""Who drives an episode: ``null``, ``oracle``, ``scripted`` (``basic``), and the model agent
(``model``: one loop for every LLM, through the client seam of ``client``, implemented by
``chat`` and ``tokens`` over ``transport``)."""

from termgym.agents.basic import NullAgent, OracleAgent, ScriptedAgent
from termgym.agents.model import LoopSettings, ModelAgent
from termgym.agents.settings import AGENTS, ModelConfig, make_agent

__all__ = [
    "AGENTS",
    "LoopSettings",
    "ModelAgent",
    "ModelConfig",
    "NullAgent",
    "OracleAgent",
    "ScriptedAgent",
    "make_agent",
]
