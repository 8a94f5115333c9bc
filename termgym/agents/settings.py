"""Building an agent by name: ``oracle``, ``null``, or ``model`` with its ``ModelConfig`` (the
command line's ``--model``, ``--base-url`` and friends, or a ``termgym.toml``).

Every check that can fail on bad input happens here, before any sandbox starts: the base URL, the
API key's variable, the tokenizer of the tokens client, the numbers. Each failure is one line
(``ConfigError``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from termgym.agents.actions import ActionFormat
from termgym.agents.basic import NullAgent, OracleAgent
from termgym.agents.chat import ChatClient
from termgym.agents.model import ContextPolicy, LoopSettings, ModelAgent
from termgym.agents.transport import DEFAULT_MAX_RETRIES, DEFAULT_REQUEST_TIMEOUT, Endpoint, Server, resolve_api_key
from termgym.errors import ConfigError, UnknownName
from termgym.trial import Agent

ClientKind = Literal["chat", "tokens"]
CLIENTS: tuple[ClientKind, ...] = ("chat", "tokens")
AGENTS = ("oracle", "null", "model", "mini-swe-agent")
HARNESSES = ("mini-swe-agent",)  # unchanged agent harnesses behind the recording gateway (termgym.integrations)
# the model settings a harness takes; the rest are the model agent's own loop and client
HARNESS_MODEL_SETTINGS = ("model", "base_url", "api_key_env", "temperature")
OPENAI_BASE_URL = "https://api.openai.com/v1"


@dataclass(frozen=True)
class ModelConfig:
    model: str | None = None
    base_url: str | None = None  # None: OpenAI's API (the key from OPENAI_API_KEY unless api_key_env says)
    api_key_env: str | None = None
    action_format: ActionFormat = "tool"
    client: ClientKind = "chat"
    tokenizer: str | None = None  # tokens client; None: the model name (a local directory)
    renderer: str = "auto"  # tokens client: the chat format (auto: decided from the model's files)
    thinking: str = "cycle"  # tokens client: how much earlier reasoning the prompt keeps
    temperature: float = 1.0
    max_tokens: int = 4096
    context_window: int | None = None  # None: what the server reports
    context: ContextPolicy = "truncate"
    max_parse_errors: int = 3
    max_output_chars: int = 10_000
    max_output_tokens: int | None = 2048  # tokens client only (it has the tokenizer)
    system_prompt: str | None = None  # None: the action format's own
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES
    logprobs: bool = True

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ModelConfig:
        """From a mapping of field names (a config file's table, parsed flags); unknown names are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown model setting(s): {', '.join(unknown)}")
        return cls(**{k: v for k, v in values.items() if v is not None})


def make_agent(name: str, model: ModelConfig | None = None, *, environ: Mapping[str, str] | None = None) -> Agent:
    """The agent ``name``; ``model`` configures the model agent (and is refused for the others). A
    harness (``HARNESSES``) sits a layer above: ``termgym.integrations.settings.build_harness_agent``."""
    if name in HARNESSES:
        raise ConfigError(f"--agent {name} is a harness: termgym.integrations.settings.build_harness_agent builds it")
    if name == "oracle":
        return OracleAgent()
    if name == "null":
        return NullAgent()
    if name == "model":
        return build_model_agent(model or ModelConfig(), environ=os.environ if environ is None else environ)
    raise UnknownName("unknown agent", name, AGENTS)


def build_model_agent(config: ModelConfig, *, environ: Mapping[str, str], connections: int = 1000) -> ModelAgent:
    if not config.model:
        raise ConfigError("--agent model needs --model NAME")
    if config.client not in CLIENTS:
        raise ConfigError(f"client must be one of {', '.join(CLIENTS)}, got {config.client!r}")
    if not 0 <= config.temperature <= 2:
        raise ConfigError(f"temperature must be in [0, 2], got {config.temperature}")
    if config.context_window is not None and config.context_window < 2:
        raise ConfigError(f"context window must be at least 2 tokens, got {config.context_window}")
    base_url, key_env = config.base_url, config.api_key_env
    if base_url is None:
        base_url, key_env = OPENAI_BASE_URL, key_env or "OPENAI_API_KEY"
    endpoint = Endpoint(
        base_url=base_url,
        model=config.model,
        api_key=resolve_api_key(key_env, dict(environ)),
        request_timeout=config.request_timeout,
        max_retries=config.max_retries,
    )
    loop = LoopSettings(
        action_format=config.action_format,
        max_tokens=config.max_tokens,
        max_parse_errors=config.max_parse_errors,
        context=config.context,
        max_output_chars=config.max_output_chars,
        system_prompt=config.system_prompt,
    )
    server = Server(endpoint, connections=connections, context_length=config.context_window)
    if config.client == "tokens":
        from termgym.agents.renderers import renderer_for_model_dir
        from termgym.agents.tokens import TokensClient, load_tokenizer

        source = config.tokenizer or config.model
        renderer = renderer_for_model_dir(
            source, config.renderer, thinking=config.thinking, tokenizer=load_tokenizer(source)
        )
        client: Any = TokensClient(
            server, renderer, temperature=config.temperature, max_observation_tokens=config.max_output_tokens
        )
    else:
        client = ChatClient(server, temperature=config.temperature, logprobs=config.logprobs)
    return ModelAgent(client, loop)
