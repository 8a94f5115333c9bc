"""The synchronous Gymnasium face of ``AsyncTerminalEnv``, registered as ``termgym/Terminal-v0``.

``gymnasium.make("termgym/Terminal-v0", task="file-ops/organize-by-extension", backend="local")``.
Observations and actions are text. The async environment does the work on a private event loop;
``close()`` stops the sandbox and the loop.
"""

from __future__ import annotations

import asyncio
import string
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.tasks import Task
from termgym.tasks.bundled import resolve_task

MAX_OBSERVATION_CHARS = 1 << 20
MAX_ACTION_CHARS = 1 << 16


class ShellText(spaces.Text):
    """Any string up to ``max_length`` characters (shell commands and their output are arbitrary
    text); samples are drawn from letters, digits and spaces so that a sampled action is harmless."""

    def __init__(self, max_length: int) -> None:
        super().__init__(max_length=max_length, min_length=0, charset=string.ascii_letters + string.digits + " ")

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


class TerminalEnv(gym.Env[str, str]):
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    def __init__(
        self,
        task: Task | str,
        backend: str = "local",
        max_turns: int = 50,
        command_timeout: float = 180.0,
        render_mode: str | None = None,
    ) -> None:
        resolved = task if isinstance(task, Task) else resolve_task(task)
        options = EnvOptions(backend=backend, max_turns=max_turns, command_timeout=command_timeout)
        self._env = AsyncTerminalEnv(resolved, options)
        self._loop = asyncio.new_event_loop()
        self.observation_space = ShellText(MAX_OBSERVATION_CHARS)
        self.action_space = ShellText(MAX_ACTION_CHARS)
        self.render_mode = render_mode
        self._last_observation = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.action_space.seed(int(self.np_random.integers(0, 2**31 - 1)))
        obs, info = self._loop.run_until_complete(self._env.reset(seed=seed, options=options))
        self._last_observation = obs
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self._loop.run_until_complete(self._env.step(action))
        self._last_observation = obs
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        return self._last_observation if self.render_mode == "ansi" else None

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._env.close())
            self._loop.close()
        super().close()


def register() -> None:
    if "termgym/Terminal-v0" not in gym.registry:
        gym.register(id="termgym/Terminal-v0", entry_point="termgym.gym_env:TerminalEnv")
