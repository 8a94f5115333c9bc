"""mini-swe-agent (PyPI ``mini-swe-agent``, pinned in the ``harnesses`` extra) on termgym, unchanged.

Two ways in: ``--agent mini-swe-agent`` (``MiniSweAgent``, a ``termgym.integrations.harness.Harness``:
mini-swe-agent's own ``DefaultAgent`` loop, its default or the user's configuration, the recording
gateway as its model endpoint, the trial's sandbox as its environment); and
``environment_class: termgym.integrations.mini_swe_agent.TermgymEnvironment`` in a mini-swe-agent
config (the user's own run acts in a termgym sandbox; submitting verifies the task and puts the
reward in the exit message's ``extra["termgym"]``; ``close()`` stops the sandbox).

``TermgymEnvironment`` keeps mini-swe-agent's semantics (each action in a fresh subshell at its
``cwd``, with the configuration's ``env`` and ``timeout``; the submit sentinel submits) and
termgym's (the turn budget and the agent time end the episode with ``LimitsExceeded``, output
caps, the sandbox's lifetime). Importing this module does not import mini-swe-agent; the classes
import it when used, and without it say in one line which extra to install.

In full: docs/guides/harnesses.md#mini-swe-agent-as-a-termgym-agent."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import platform
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from termgym.errors import ConfigError
from termgym.integrations.harness import EnvBridge, HarnessResult, HarnessStopped

NAME = "mini-swe-agent"
SUBMIT_LINE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
EXTRA_HINT = "--agent mini-swe-agent needs the harnesses extra: pip install -e '.[harnesses]'"
CONFIGS = Path(__file__).resolve().parent / "configs"


def require() -> None:
    """Import mini-swe-agent quietly (no banner, no cost-map download); ``ConfigError`` naming the
    extra when it is not installed."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price list
    # mini-swe-agent retries a failed model call 10 times, waiting up to 60 s between tries; in an RL
    # run a trial that long is lost anyway, so 3 unless the user says (litellm retries within each)
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "3")
    try:
        import litellm
        import minisweagent  # noqa: F401
    except ImportError:
        raise ConfigError(EXTRA_HINT) from None
    litellm.suppress_debug_info = True  # no "Provider List" banners on stdout


def load_config(path: str | os.PathLike | None) -> dict[str, Any]:
    """The harness configuration: the user's YAML (``--agent-config``; a bare name is looked up
    among mini-swe-agent's own and termgym's ``configs/``), else mini-swe-agent's ``mini.yaml``;
    one line when it cannot be read."""
    require()
    import yaml
    from minisweagent.config import builtin_config_dir

    if path is None:
        target = builtin_config_dir / "mini.yaml"
    else:
        given = Path(path)
        candidates = [given, CONFIGS / given, CONFIGS / f"{given}.yaml", builtin_config_dir / given]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise ConfigError(f"--agent-config {path}: no such file")
        target = found
    try:
        data = yaml.safe_load(target.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--agent-config {target}: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("agent"), dict):
        raise ConfigError(f"--agent-config {target}: not a mini-swe-agent config (no agent: section)")
    return data


@dataclass
class MiniSweAgent:
    """mini-swe-agent's ``DefaultAgent`` as a termgym harness (module docstring). ``max_turns``
    caps its model calls too (its ``step_limit``, when the configuration's is unset or larger)."""

    config: dict[str, Any]
    max_turns: int = 50
    name: str = NAME
    submit_command: str = f"echo {SUBMIT_LINE}"

    def run(self, base_url: str, model: str, bridge: EnvBridge, instruction: str, info: dict) -> HarnessResult:
        require()
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.models import get_model

        config = copy.deepcopy(self.config)
        model_config = dict(config.get("model") or {})
        model_config["model_name"] = f"openai/{model}"
        model_config["model_kwargs"] = {
            **(model_config.get("model_kwargs") or {}),
            "api_base": base_url,
            "api_key": "termgym",
        }
        model_config["cost_tracking"] = "ignore_errors"  # a local model has no price
        environment = dict(config.get("environment") or {})
        environment.pop("environment_class", None)
        agent_config = dict(config.get("agent") or {})
        limit = int(agent_config.get("step_limit") or 0)
        agent_config["step_limit"] = min(limit, self.max_turns) if limit > 0 else self.max_turns
        agent_config.pop("output_path", None)  # termgym keeps the transcript
        harness_model = get_model(config=model_config)
        agent = DefaultAgent(harness_model, TermgymEnvironment(bridge=bridge, **environment), **agent_config)
        try:
            extra = agent.run(instruction)
            status = str(extra.get("exit_status") or "")
            return HarnessResult(status, messages=agent.messages)
        except Exception as exc:
            return HarnessResult(
                type(exc).__name__,
                error=" ".join(str(exc).split())[:300],
                messages=agent.messages,
                context_error="ContextWindowExceeded" in type(exc).__name__,
            )


# -- the environment ------------------------------------------------------------------------------


def _environment_config_class() -> Any:
    require()
    from pydantic import BaseModel

    class TermgymEnvironmentConfig(BaseModel):
        cwd: str = ""
        env: dict[str, str] = {}
        timeout: int = 30
        # standalone use (not bound to a termgym trial): the task and where to run it
        task: str = ""
        backend: str = "local"
        max_turns: int = 1000

    return TermgymEnvironmentConfig


class TermgymEnvironment:
    """A mini-swe-agent environment whose commands run in a termgym sandbox (module docstring).
    Bound to a trial when termgym creates it (``bridge``); standalone otherwise, when it starts
    the ``task`` of its configuration on ``backend`` in a loop thread of its own."""

    def __init__(self, *, bridge: EnvBridge | None = None, config_class: type | None = None, **kwargs: Any) -> None:
        self.config = (config_class or _environment_config_class())(**kwargs)
        self._own: _OwnEpisode | None = None
        if bridge is None:
            if not self.config.task:
                raise ConfigError(
                    "TermgymEnvironment needs a task (environment: task: PATH) when termgym does not run it"
                )
            self._own = _OwnEpisode.start(self.config.task, self.config.backend, self.config.max_turns)
            bridge = self._own.bridge
        self.bridge = bridge
        self.result: dict[str, Any] | None = None  # the verification, once submitted

    @property
    def instruction(self) -> str:
        return self._own.instruction if self._own is not None else ""

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import LimitsExceeded, Submitted

        command = str(action.get("command", ""))
        where = cwd or self.config.cwd or self.bridge.info.get("workdir") or "/"
        exports = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in self.config.env.items() if _name_ok(k))
        wrapped = f"( cd -- {shlex.quote(where)} || exit 1\n{exports}{command}\n)"
        seconds = timeout or self.config.timeout
        try:
            _, _, terminated, truncated, info = self.bridge.step(wrapped, timeout=seconds)
        except HarnessStopped:
            raise LimitsExceeded(_exit("LimitsExceeded", "the termgym episode is over")) from None
        if terminated or truncated:
            raise LimitsExceeded(
                _exit(
                    "LimitsExceeded", f"the termgym episode ended ({info.get('stop_reason') or 'its budget ran out'})"
                )
            )
        output = {
            "output": str(info.get("output", "")),
            "returncode": code if isinstance(code := info.get("exit_code"), int) else -1,  # None: timed out
            "exception_info": "",
        }
        if info.get("timed_out"):
            output["returncode"] = -1
            output["exception_info"] = (
                f"An error occurred while executing the command: Command timed out after {seconds} seconds"
            )
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_LINE and output["returncode"] == 0:
            submission = "".join(lines[1:])
            try:
                observation, reward, terminated, truncated, step_info = self.bridge.submit()
            except HarnessStopped:
                raise LimitsExceeded(_exit("LimitsExceeded", "the termgym episode is over")) from None
            if not (terminated or truncated):  # a multi-step task: its next step's instruction
                return {"output": observation, "returncode": 0, "exception_info": ""}
            self.result = {
                "reward": reward,
                **{k: step_info.get(k) for k in ("resolved", "passed", "total") if k in step_info},
            }
            exit_message = _exit("Submitted", submission)
            exit_message["extra"]["termgym"] = self.result
            raise Submitted(exit_message)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The configuration, the kernel's ``uname`` fields (``system``, ``release``, ``version``,
        ``machine``: the templates of mini-swe-agent's own configs use them; every backend but
        Daytona shares this machine's kernel), the sandbox's ``workdir`` and ``backend``. Not the
        host's environment variables, which ``LocalEnvironment`` adds: they are not the sandbox's."""
        uname = platform.uname()._asdict()
        uname.pop("node", None)
        values = {
            **self.config.model_dump(),
            **uname,
            "workdir": self.bridge.info.get("workdir"),
            "backend": self.bridge.info.get("backend"),
        }
        if self._own is not None:
            values["termgym_instruction"] = self._own.instruction
        return {**values, **kwargs}

    def serialize(self) -> dict:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                },
                "termgym": self.result,
            }
        }

    def close(self) -> None:
        """Stop a standalone episode's sandbox and loop (nothing to do when termgym runs the trial)."""
        own, self._own = self._own, None
        if own is not None:
            own.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _exit(status: str, content: str) -> dict[str, Any]:
    return {
        "role": "exit",
        "content": content,
        "extra": {"exit_status": status, "submission": content if status == "Submitted" else ""},
    }


def _name_ok(name: str) -> bool:
    return name.isidentifier()


@dataclass
class _OwnEpisode:
    """A standalone episode: an event loop in a thread, the environment reset on it."""

    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    env: Any
    bridge: EnvBridge
    instruction: str
    closed: bool = field(default=False)

    @classmethod
    def start(cls, task_path: str, backend: str, max_turns: int) -> _OwnEpisode:
        from termgym.env import AsyncTerminalEnv
        from termgym.episode.options import EnvOptions
        from termgym.tasks.bundled import resolve_task

        task = resolve_task(task_path)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="termgym-environment", daemon=True)
        thread.start()
        env = AsyncTerminalEnv(task, EnvOptions(backend=backend, max_turns=max_turns))
        try:
            instruction, info = asyncio.run_coroutine_threadsafe(env.reset(), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            raise
        return cls(loop, thread, env, EnvBridge(env, loop, info), instruction)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.bridge.closed = True
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.env.close(), self.loop).result(timeout=120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()
