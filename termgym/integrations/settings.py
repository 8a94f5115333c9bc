"""Building a harness agent by name (``--agent mini-swe-agent``): the harness, its configuration
and the gateway's upstream, every check that can fail on bad input made before any sandbox starts
(one line each, ``ConfigError``)."""

from __future__ import annotations

from collections.abc import Mapping

from termgym.agents.settings import ModelConfig
from termgym.agents.transport import Endpoint, resolve_api_key
from termgym.errors import ConfigError
from termgym.integrations.harness import Forwarding, HarnessAgent
from termgym.integrations.mini_swe_agent import MiniSweAgent, load_config


def build_harness_agent(
    name: str,
    config: ModelConfig,
    *,
    environ: Mapping[str, str],
    agent_config: str | None = None,
    max_turns: int = 50,
    temperature: float | None = None,
) -> HarnessAgent:
    """The harness ``name`` behind the recording gateway, forwarding to ``config``'s server (its
    base URL and key); ``temperature``, when given, is forced on every call (else the harness's own)."""
    if not config.model:
        raise ConfigError(f"--agent {name} needs --model NAME")
    if config.base_url is None:
        raise ConfigError(f"--agent {name} needs --base-url URL (the model's OpenAI-compatible server)")
    if temperature is not None and not 0 <= temperature <= 2:
        raise ConfigError(f"temperature must be in [0, 2], got {temperature}")
    endpoint = Endpoint(
        base_url=config.base_url, model=config.model, api_key=resolve_api_key(config.api_key_env, dict(environ))
    )
    forced = {} if temperature is None else {"temperature": temperature}
    harness = MiniSweAgent(load_config(agent_config), max_turns=max_turns)
    return HarnessAgent(harness, Forwarding(endpoint.base_url, endpoint.api_key, forced), config.model)
