"""What the commands share: the consoles, the one-line usage error, the option groups (backend,
tamper policy, the run's task overrides, the model agent) and the agent the options describe."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from termgym.agents import AGENTS, ModelConfig, make_agent
from termgym.agents.actions import ACTION_FORMATS
from termgym.agents.model import CONTEXT_POLICIES
from termgym.agents.renderers.base import THINKING_RETENTIONS
from termgym.agents.settings import CLIENTS, HARNESS_MODEL_SETTINGS, HARNESSES, build_model_agent
from termgym.cli.summary import INFRASTRUCTURE
from termgym.episode.options import EnvOptions
from termgym.episode.overrides import NETWORK_CHOICES, override_fields
from termgym.episode.tamper import TAMPER_POLICIES
from termgym.errors import ConfigError, did_you_mean
from termgym.images.build import CONFIG_FILES, load_aliases, read_config_file
from termgym.images.pull import PULL_POLICIES
from termgym.integrations.settings import build_harness_agent
from termgym.sandboxes import BACKENDS
from termgym.trial import Agent
from termgym.verifiers import DEFAULT_SCALE

INFRA_ERRORS = INFRASTRUCTURE  # check exits 1 on these: the faults a summary leaves out
# Piped output is not wrapped at 80 columns: tables stay one row per line for tools and logs.
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

# --model and friends: ModelConfig's fields, with the flags' names
MODEL_FLAGS = (
    "model",
    "base_url",
    "api_key_env",
    "action_format",
    "client",
    "tokenizer",
    "renderer",
    "thinking",
    "system_prompt",
    "max_output_tokens",
    "temperature",
    "max_tokens",
    "context_window",
    "context",
    "max_parse_errors",
    "request_timeout",
    "max_retries",
)


class UsageError(ConfigError):
    """Bad command-line input: reported in one line, exit 2."""


# argparse's words for a value outside an argument's choices (a subcommand, --backend, --agent...)
INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>[^']*)' \(choose from (?P<choices>.*)\)$")


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        invalid = INVALID_CHOICE.search(message)
        if invalid and (hint := did_you_mean(invalid["value"], re.findall(r"[^,' ]+", invalid["choices"]))):
            message = f"{message}; {hint}"  # a mistyped choice: the closest ones, as every name lookup says
        raise UsageError(f"{message} (see {self.prog} --help)")


def backend_option(sub: argparse.ArgumentParser, *, cluster: bool = True) -> None:
    sub.add_argument("--backend", default="local", choices=BACKENDS, help="sandbox backend (default: local)")
    if cluster:
        cluster_options(sub)
    sub.add_argument(
        "--image-alias",
        action="append",
        default=[],
        metavar="NAME=IMAGE",
        help="build FROM IMAGE where the Dockerfile names NAME and NAME is absent (docker; repeatable)",
    )


def cluster_options(sub: argparse.ArgumentParser) -> None:
    """``--cluster``: the sandboxes on the nodes of a Ray cluster (docs/guides/cluster.md)."""
    sub.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="run the sandboxes (local or docker backend) on the nodes of a Ray cluster: ray://HOST:PORT, "
        "HOST:PORT, or ray (RAY_ADDRESS, else the cluster started on this machine); needs the ray extra; "
        "waits TERMGYM_RAY_CONNECT_TIMEOUT seconds (default 30) for it to answer",
    )
    sub.add_argument(
        "--cpus-per-sandbox",
        type=float,
        default=1.0,
        metavar="N",
        help="--cluster: the CPUs one sandbox takes on its node; a node runs its CPUs / N at once (default 1)",
    )


def connect_cluster(args: argparse.Namespace) -> Any:
    """The Ray cluster ``--cluster`` names, joined with ``--cpus-per-sandbox``: one line and exit 2
    (``ConfigError``) when no cluster answers there within ``TERMGYM_RAY_CONNECT_TIMEOUT`` seconds,
    ``BackendUnavailable`` (exit 1) when Ray is not installed."""
    from termgym.sandboxes.ray.cluster import connect

    return connect(args.cluster, args.backend, cpus_per_sandbox=args.cpus_per_sandbox)


def run_overrides_options(sub: argparse.ArgumentParser, *, build: bool = True) -> None:
    """Harbor's run overrides, the network choice, the pull policy and the reward scale
    (docs/guides/tasks.md); each override that applied goes in the trial's record."""
    group = sub.add_argument_group("task overrides (recorded in each trial)")
    group.add_argument(
        "--network",
        choices=NETWORK_CHOICES,
        default="task",
        help="task: each phase gets the network its task asks for; none: no network anywhere, recorded as a"
        " warning (default: task)",
    )
    group.add_argument(
        "--pull",
        choices=PULL_POLICIES,
        default="missing",
        help="images from a registry (docker): missing pulls what is absent, as docker run does; never; always"
        " (default: missing)",
    )
    if build:
        group.add_argument(
            "--build", action="store_true", help="build the task's Dockerfile even when it names a docker_image"
        )
    group.add_argument(
        "--agent-timeout-multiplier", type=float, default=1.0, metavar="X", help="scale every agent timeout"
    )
    group.add_argument(
        "--verifier-timeout-multiplier", type=float, default=1.0, metavar="X", help="scale every verifier timeout"
    )
    group.add_argument("--override-cpus", type=float, default=None, metavar="N", help="CPUs for every task")
    group.add_argument("--override-memory-mb", type=int, default=None, metavar="MB", help="memory for every task")
    group.add_argument("--override-storage-mb", type=int, default=None, metavar="MB", help="storage for every task")
    group.add_argument(
        "--reward-scale",
        type=int,
        default=DEFAULT_SCALE,
        metavar="S",
        help=f"the reward's assertion scale S: reward = passed / S, not capped at 1 (default {DEFAULT_SCALE})",
    )


def tamper_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--tamper",
        choices=TAMPER_POLICIES,
        default="fail",
        help="when the traced verifier loaded a file the agent wrote outside its work: fail scores the "
        "trial 0 and names the file, warn keeps the verdict and records them (default: fail; a task "
        "whose verifier runs the agent's work elsewhere declares [verifier].agent_paths)",
    )


def agent_options(sub: argparse.ArgumentParser) -> None:
    """``--agent`` and the model agent's settings (docs/guides/agents.md)."""
    sub.add_argument(
        "--agent",
        default=None,
        choices=AGENTS,
        help="oracle = reference solution, null = submit at once, model = an LLM (default: model with --model, "
        "else oracle), mini-swe-agent = the mini-swe-agent harness behind the recording gateway",
    )
    sub.add_argument(
        "--agent-config",
        default=None,
        metavar="YAML",
        help="--agent mini-swe-agent: its configuration file (default: its own mini.yaml)",
    )
    sub.add_argument("--max-turns", type=int, default=50, help="turns per episode (default 50)")
    group = sub.add_argument_group("model agent (--agent model)")
    group.add_argument("--model", default=None, help="the model's name on its server")
    group.add_argument(
        "--base-url", default=None, help="OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (default: OpenAI's)"
    )
    group.add_argument(
        "--api-key-env", default=None, metavar="VAR", help="environment variable holding the API key (default: none)"
    )
    group.add_argument("--action-format", choices=ACTION_FORMATS, default=None, help="tool calls or a fenced command")
    group.add_argument(
        "--client", choices=CLIENTS, default=None, help="chat: the server renders; tokens: token ids in and out"
    )
    group.add_argument("--tokenizer", default=None, help="tokens client: tokenizer directory (default: --model)")
    group.add_argument(
        "--renderer",
        default=None,
        help="tokens client: the chat format (auto, chatml, qwen-xml, llama3, template; default auto: from the"
        " model's files)",
    )
    group.add_argument(
        "--thinking",
        choices=THINKING_RETENTIONS,
        default=None,
        help="tokens client: earlier reasoning kept in the prompt (all, cycle: within the tool cycle, strip;"
        " default cycle)",
    )
    group.add_argument("--system-prompt", default=None, help="the system prompt (default: the action format's own)")
    group.add_argument(
        "--max-output-tokens",
        type=int,
        default=None,
        help="tokens client: tokens kept of each observation (default 2048)",
    )
    group.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 1.0)")
    group.add_argument("--max-tokens", type=int, default=None, help="tokens per reply (default 4096)")
    group.add_argument("--context-window", type=int, default=None, help="tokens (default: what the server says)")
    group.add_argument("--context", choices=CONTEXT_POLICIES, default=None, help="when the window fills up")
    group.add_argument("--max-parse-errors", type=int, default=None, help="unparsable replies in a row (default 3)")
    group.add_argument("--request-timeout", type=float, default=None, help="seconds per request attempt")
    group.add_argument("--max-retries", type=int, default=None, help="retries of a failed request (default 4)")


def agent_from_args(args: argparse.Namespace, *, connections: int = 1) -> Agent:
    """The agent the options name; model settings given to another agent are a usage error."""
    given = {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name, None) is not None}
    name = args.agent or ("model" if given.get("model") else "oracle")
    agent_config = getattr(args, "agent_config", None)
    if agent_config is not None and name not in HARNESSES:
        raise UsageError(f"--agent-config applies to --agent {' or '.join(HARNESSES)} only")
    if name in HARNESSES:
        extra = [n for n in given if n not in HARNESS_MODEL_SETTINGS]
        if extra:
            flags = ", ".join("--" + n.replace("_", "-") for n in extra)
            raise UsageError(
                f"{flags}: the model agent's settings; --agent {name} takes only --model, --base-url, --api-key-env,"
                " --temperature"
            )
        config = ModelConfig.from_mapping({k: v for k, v in given.items() if k != "temperature"})
        return build_harness_agent(
            name,
            config,
            environ=os.environ,
            agent_config=agent_config,
            max_turns=args.max_turns,
            temperature=given.get("temperature"),
        )
    if name != "model":
        if given:
            flags = ", ".join("--" + n.replace("_", "-") for n in given)
            raise UsageError(f"{flags}: model settings apply to --agent model only")
        return make_agent(name)
    return build_model_agent(ModelConfig.from_mapping(given), environ=os.environ, connections=max(1, connections))


def env_options(args: argparse.Namespace, run_id: str, trials_dir: Path) -> EnvOptions:
    """The episode options of a trial command (``check``, ``run``): its backend, image aliases,
    tamper policy and turn budget, transcripts kept under ``trials_dir``."""
    return EnvOptions(
        backend=args.backend,
        run_id=run_id,
        image_aliases=load_aliases(args.image_alias),
        tamper=args.tamper,
        max_turns=args.max_turns,
        trials_dir=str(trials_dir),
        keep=getattr(args, "keep", False),
        cluster=getattr(args, "cluster", None),
        **override_fields(args),
    )


async def close_agent(agent: Agent) -> None:
    close = getattr(agent, "aclose", None)
    if close is not None:
        await close()


def apply_config_file(sub: argparse.ArgumentParser, command: str, files: tuple[str, ...] = CONFIG_FILES) -> None:
    """Defaults for ``command`` from the first config file found: its ``[model]`` table, then its
    ``[<command>]`` table, keyed by flag names (``base-url`` or ``base_url``). Flags still win. A
    key the command has no flag for, or a value outside a flag's choices, is one line."""
    found = read_config_file(files)
    if found is None:
        return
    path, data = found
    actions = {a.dest: a for a in sub._actions}
    defaults: dict[str, Any] = {}
    for table in ("model", command):
        values = data.get(table, {})
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: [{table}] must be a table")
        if table == "model" and "agent" not in actions:
            continue
        for key, value in values.items():
            dest = key.replace("-", "_")
            action = actions.get(dest)
            if action is None or dest in ("help", "task", "tasks"):
                raise ConfigError(f"{path}: [{table}] {key}: `termgym {command}` has no such setting")
            if action.choices is not None and value not in action.choices:
                raise ConfigError(f"{path}: [{table}] {key} must be one of {', '.join(map(str, action.choices))}")
            defaults[dest] = Path(value) if action.type is Path and isinstance(value, str) else value
    sub.set_defaults(**defaults)
