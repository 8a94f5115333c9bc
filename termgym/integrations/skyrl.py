"""termgym as a SkyRL-gym environment: ``import termgym.integrations.skyrl`` registers the id ``termgym``.

``skyrl_gym.make("termgym", env_config=..., extras={"task": NAME_OR_DIR, "backend": "local"})``, or a
SkyRL dataset row with ``env_class: termgym`` and those extras (``write_dataset`` writes such rows).
Per-row extras override the ``env_config`` defaults; the keys are ``SETTINGS`` (other extras are
ignored; an unknown ``env_config`` key is an error).

The episode is termgym's own (``AsyncTerminalEnv``), driven from SkyRL's synchronous calls on
termgym's shared loop (``termgym.integrations.sync_loop``): ``init(prompt)`` starts the sandbox
(an empty prompt becomes termgym's opening); ``step(action)`` parses the reply with termgym's
action parser (``text`` or ``tool`` format) and runs the command in the persistent shell; the
episode ends as the model agent's does, the final step verifies and its reward is termgym's
(passed / S), every other step's is 0. ``close()`` always stops the sandbox; so does interpreter
exit for an environment never closed. Bad input raises ``TermgymEnvError`` (a
``skyrl_gym.error.Error``) in one line, at ``make``, before any sandbox starts.

In full: docs/guides/frameworks.md#skyrl-gym."""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from termgym.agents.actions import (
    ACTION_FORMATS,
    Command,
    ParseFailure,
    Submit,
    parse_hermes,
    parse_text,
    parse_tool_calls,
)
from termgym.agents.model import ReplyActor
from termgym.agents.prompts import system_prompt, task_prompt
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.errors import ConfigError, TermgymError
from termgym.integrations import sync_loop
from termgym.integrations.outcome import outcome
from termgym.sandboxes import preflight
from termgym.tasks import Task
from termgym.tasks.bundled import bundled_task_path, resolve_task

ENV_ID = "termgym"


class TermgymEnvError(skyrl_gym.error.Error):
    """A termgym environment that cannot be made: an unknown task, an unavailable backend, a bad setting."""


@dataclass(frozen=True)
class Settings:
    """What one episode runs with; every field may come from ``env_config`` or the row's extras."""

    task: str = ""
    backend: str = "local"
    action_format: str = "text"
    max_turns: int = 20
    command_timeout: float = 180.0
    agent_timeout: float | None = None  # None: the task's own
    max_output_chars: int = 10_000
    max_parse_errors: int = 3
    reward_scale: int | None = None  # None: termgym's default S
    tamper: str = "fail"

    def env_options(self) -> EnvOptions:
        """The environment's options (``ConfigError`` for a value out of range)."""
        options = EnvOptions(
            backend=self.backend,
            max_turns=self.max_turns,
            command_timeout=self.command_timeout,
            agent_timeout=self.agent_timeout,
            tamper=self.tamper,
        )
        return options if self.reward_scale is None else replace(options, reward_scale=self.reward_scale)


SETTINGS = tuple(field.name for field in fields(Settings))
_INTEGERS = ("max_turns", "max_output_chars", "max_parse_errors", "reward_scale")
_NUMBERS = ("command_timeout", "agent_timeout")
_OPTIONAL = ("agent_timeout", "reward_scale")


def _checked(key: str, value: Any) -> Any:
    """``value`` as setting ``key`` takes it (an integer, a float, a string, None where allowed);
    ``ConfigError`` for another type. numpy scalars from a parquet file count as numbers."""
    if value is None and key in _OPTIONAL:
        return None
    if key in _INTEGERS and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if key in _NUMBERS and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if key not in _INTEGERS + _NUMBERS and isinstance(value, str):
        return value
    kind = "an integer" if key in _INTEGERS else "a number" if key in _NUMBERS else "a string"
    raise ConfigError(f"termgym setting {key}: expected {kind}, got {value!r}")


def read_settings(env_config: Any, extras: Mapping[str, Any] | None) -> Settings:
    """``Settings`` from SkyRL's ``env_config`` (a mapping or an OmegaConf config; None) and a row's
    extras, which win. ``ConfigError`` in one line for an unknown ``env_config`` key, a value of the
    wrong type, or no task."""
    config = dict(env_config.items()) if env_config is not None else {}
    unknown = sorted(set(config) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"termgym env_config: unknown key(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    values = {**config, **{key: value for key, value in (extras or {}).items() if key in SETTINGS}}
    checked = {key: _checked(key, value) for key, value in values.items()}
    settings = Settings(**checked)
    if not settings.task:
        raise ConfigError('termgym needs a task: extras={"task": NAME_OR_DIR} (or env_config.task)')
    if settings.action_format not in ACTION_FORMATS:
        raise ConfigError(
            f"termgym action_format must be one of {', '.join(ACTION_FORMATS)}, got {settings.action_format!r}"
        )
    for key in ("max_output_chars", "max_parse_errors"):
        if getattr(settings, key) < 1:
            raise ConfigError(f"termgym setting {key} must be at least 1, got {getattr(settings, key)}")
    return settings


def opening(action_format: str, instruction: str, workdir: str | None) -> list[dict[str, str]]:
    """termgym's first two messages: the action format's system prompt and the task."""
    return [
        {"role": "system", "content": system_prompt("tool" if action_format == "tool" else "text")},
        {"role": "user", "content": task_prompt(instruction, workdir)},
    ]


class TermgymEnv(BaseTextEnv):
    """One termgym episode behind SkyRL-gym's ``BaseTextEnv`` (the module docstring says how)."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        try:
            self.settings = read_settings(env_config, extras)
            self.task: Task = resolve_task(self.settings.task)
            options = self.settings.env_options()
            preflight(options.backend)
        except TermgymError as exc:
            raise TermgymEnvError(str(exc)) from None
        self.max_turns = self.settings.max_turns
        self._env = AsyncTerminalEnv(self.task, options)
        self._actor = ReplyActor(self._env, self.settings.max_parse_errors, self.settings.max_output_chars)
        self._started = False
        self.final: dict[str, Any] = {}  # the final step's metadata once the episode has ended

    # -- SkyRL-gym's interface --------------------------------------------------------------------

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if self._started:
            raise TermgymEnvError("termgym env: init() called twice; make a new environment per episode")
        self._started = True
        sync_loop.track(self)
        try:
            instruction, info = sync_loop.run(self._env.reset())
        except TermgymError as exc:
            self.close()
            raise TermgymEnvError(f"termgym could not start {self.task.name}: {exc}") from None
        if not prompt:
            prompt = opening(self.settings.action_format, instruction, info.get("workdir"))
        return prompt, {"task": self.task.name, "backend": info["backend"], "workdir": info.get("workdir")}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if not self._started or self._env.done:
            raise TermgymEnvError("termgym env: step() without a running episode (call init() first)")
        self.turns += 1
        return sync_loop.run(self._step(action))

    def close(self) -> None:
        sync_loop.untrack(self)
        sync_loop.run(self._env.close())

    async def aclose(self) -> None:
        """The async face of ``close`` (the sync loop's exit hook closes with it)."""
        await self._env.close()

    def get_metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {"turns": self.turns}
        for key in ("reward", "resolved", "passed", "total"):
            if key in self.final:
                metrics[key] = self.final[key]
        return metrics

    # -- the episode ------------------------------------------------------------------------------

    async def _step(self, reply: str) -> BaseTextEnvStepOutput:
        if self._env.remaining_time <= 0:
            return self._ended(await self._env.truncate("agent_timeout"))
        ended, shown = await self._actor.act(self._parse(reply))
        return self._ended(ended) if ended is not None else await self._next(shown)

    def _parse(self, reply: str) -> Command | Submit | ParseFailure:
        if self.settings.action_format == "tool":
            _, calls = parse_hermes(reply)
            return parse_tool_calls(calls)
        return parse_text(reply)

    async def _next(self, shown: str) -> BaseTextEnvStepOutput:
        """The observation of a turn that did not end the episode, unless it was the last reply
        the turn budget allows: then the episode ends, verified, as the model agent's does."""
        if self.turns >= self.settings.max_turns:
            return self._ended(await self._env.truncate("max_turns"))
        role = "tool" if self.settings.action_format == "tool" else "user"
        return BaseTextEnvStepOutput(
            observations=[{"role": role, "content": shown}],
            reward=0.0,
            done=False,
            metadata={},
            postprocessed_action=None,
        )

    def _ended(self, step: tuple[str, float, bool, bool, dict]) -> BaseTextEnvStepOutput:
        _, reward, _, _, info = step
        metadata = {"task": self.task.name, **outcome(reward, info, self._env.transcript.stop_reason)}
        self.final = metadata
        return BaseTextEnvStepOutput(
            observations=[], reward=float(reward), done=True, metadata=metadata, postprocessed_action=None
        )


def dataset_rows(
    tasks: Iterable[str], *, backend: str = "local", action_format: str = "text", **settings: Any
) -> list[dict[str, Any]]:
    """One SkyRL dataset row per task (a bundled name or a task directory): the prompt (termgym's
    opening), ``env_class: termgym`` and the extras the environment reads. A task directory is
    written as an absolute path; a bundled task by its name. ``ConfigError`` for an unknown task."""
    rows = []
    for name in tasks:
        task = resolve_task(name)
        checked = read_settings(
            None, {"task": _task_reference(name, task), "backend": backend, "action_format": action_format, **settings}
        )
        rows.append(
            {
                "data_source": "termgym",
                "prompt": opening(action_format, task.instruction, None),
                "env_class": ENV_ID,
                "reward_spec": {"method": "termgym_verifier"},
                "extra_info": {"task": task.name, "family": task.family},
                **{key: getattr(checked, key) for key in ("task", "backend", "action_format", *settings)},
            }
        )
    return rows


def write_dataset(tasks: Iterable[str], path: str | os.PathLike[str], **options: Any) -> Path:
    """``dataset_rows`` written as a parquet file at ``path`` (what SkyRL's ``data.train_data`` reads)."""
    import pandas

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    pandas.DataFrame(dataset_rows(tasks, **options)).to_parquet(target, index=False)
    return target


def _task_reference(name: str, task: Task) -> str:
    """How a row names its task: the bundled name when it is one, else the directory's absolute path."""
    bundled = not Path(name).exists() and bundled_task_path(name) is not None
    return name if bundled else str(task.path.resolve())


def register() -> None:
    """Register ``termgym`` with SkyRL-gym (done on import; idempotent)."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:TermgymEnv")


register()
