"""``termgym shell``: step a task's environment by hand, as an agent would, in a real terminal.

The session is a trial like any other (``termgym.trial.run_trial`` with the agent ``you``): its
turns, its time and its transcript (``runs/<run id>/trials/<trial id>/trajectory.json``) are
recorded the same way, and the closing line says what the record says.

Guarantees:
- Ctrl-C while a command runs stops that command (``AsyncTerminalEnv.interrupt``: the sandbox's
  shell keeps its directory, variables and background jobs) and shows its output so far, noted
  ``[interrupted]``; it counts as a turn. Ctrl-C at the prompt drops the line being typed;
  Ctrl-D or ``:quit`` leaves without verifying; ``:submit`` verifies and ends; ``:help`` lists them;
- on a terminal, lines are edited with readline and the history is kept per task under the user's
  cache directory (``history_path``), at most ``HISTORY_LENGTH`` lines;
- a command's output reaches a terminal through ``display_safe`` (colours kept, nothing that
  changes the terminal itself), and anything else through ``terminal_safe``.
While you type at the prompt the session waits for you: the prompt is read on the event loop's
thread, so that Ctrl-C can reach it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import re
import signal
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType

from rich.text import Text

from termgym.cli import common
from termgym.cli.common import UsageError
from termgym.cli.episodes import print_notes, print_record
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.episode.overrides import override_fields
from termgym.images.build import load_aliases
from termgym.output import display_safe, terminal_safe
from termgym.output import plain_text as plain
from termgym.records import TrialRecord
from termgym.sandboxes import attach_sandbox, preflight
from termgym.sandboxes.base import Sandbox
from termgym.tasks import Task
from termgym.tasks.bundled import resolve_task
from termgym.trial import StepReturn, run_trial

QUIT = ":quit"
HELP = ":help"
HISTORY_LENGTH = 1000
ATTACHED_TIMEOUT_SEC = 7 * 24 * 3600.0  # the agent timeout of an attached session without a task
HELP_TEXT = f"""\
{SUBMIT}   verify the task and end the session (shows the reward and the assertions)
{QUIT}     leave without verifying (or Ctrl-D)
{HELP}     this list
Ctrl-C stops the running command (the shell keeps its state); at the prompt it drops the line.
A line that ends in a backslash continues on the next."""


async def cmd_shell(args: argparse.Namespace) -> int:
    if args.task is None and args.attach is None:
        raise UsageError("shell needs a task (or --attach ID)")
    task = resolve_task(args.task) if args.task is not None else None
    await asyncio.to_thread(preflight, args.backend)
    attached = await attach_sandbox(args.backend, args.attach) if args.attach is not None else None
    if task is None:
        assert attached is not None
        task = no_task(attached)
    run_id = f"shell-{uuid.uuid4().hex[:8]}"
    options = EnvOptions(
        backend=args.backend,
        max_turns=args.max_turns,
        run_id=run_id,
        image_aliases=load_aliases(args.image_alias),
        trials_dir=str(Path("runs") / run_id / "trials"),
        keep=args.keep,
        **override_fields(args),
    )
    terminal = sys.stdin.isatty()
    with line_history(history_path(task.name) if terminal else None):
        agent = HumanAgent(on_terminal=sys.stdout.isatty(), can_submit=args.task is not None)
        record = await run_trial(task, agent, options, attached=attached)
    print_closing(record)
    return 0


def no_task(sandbox: Sandbox) -> Task:
    """The stand-in task of a session in an attached sandbox without one (``--attach ID`` alone):
    named after the sandbox, nothing to verify, no agent timeout to speak of."""
    name = sandbox.spec.name or "attached"
    return Task(
        name=name,
        family="",
        path=Path("."),
        layout="harbor",
        instruction=f"(a kept sandbox, {name}: no task to verify here)",
        environment_dir=Path("."),
        dockerfile=None,
        docker_image=None,
        compose_file=None,
        solution_dir=None,
        solution_script=None,
        tests_dir=Path("."),
        test_script="",
        agent_timeout_sec=ATTACHED_TIMEOUT_SEC,
        verifier_timeout_sec=1.0,
        build_timeout_sec=1.0,
        resources=sandbox.spec.resources,
        network=False,
        verifier_env={},
        environment_env={},
        workdir=None,
        metadata={},
    )


def history_path(task_name: str, environ: Mapping[str, str] = os.environ) -> Path:
    """Where ``termgym shell`` keeps the readline history of ``task_name``:
    ``$XDG_CACHE_HOME`` (else ``~/.cache``) ``/termgym/history/<slug>``, the slug being the name
    with every run of characters outside ``[A-Za-z0-9._-]`` replaced by ``_``."""
    cache = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", task_name).strip("._") or "task"
    return Path(cache) / "termgym" / "history" / slug


@contextlib.contextmanager
def line_history(path: Path | None) -> Iterator[None]:
    """readline line editing for ``input()``, with ``path``'s history loaded before and saved
    after (capped at ``HISTORY_LENGTH`` lines); nothing at all when ``path`` is None."""
    if path is None:
        yield
        return
    try:
        import readline
    except ImportError:  # a Python built without it: plain input()
        yield
        return
    readline.clear_history()
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(HISTORY_LENGTH)
    try:
        yield
    finally:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError as exc:
            common.err.print(plain(f"warning: the shell history was not saved: {exc}"))


class HumanAgent:
    """The person at the terminal, as an agent: reads commands, shows what they printed."""

    name = "you"

    def __init__(self, *, on_terminal: bool, can_submit: bool = True, read: Callable[[str], str] = input) -> None:
        self.on_terminal = on_terminal
        self.can_submit = can_submit  # False: no task to verify (an attached sandbox alone)
        self._read = read

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        verifies = f"{SUBMIT} verifies" if self.can_submit else "no task to verify"
        header = plain(f" ({info['backend']}) · {verifies} · {QUIT} leaves · {HELP} lists the commands\n")
        common.out.print(Text.assemble((terminal_safe(env.task.name), "bold"), header))
        common.out.print(plain(instruction))
        for warning in info["warnings"]:
            common.err.print(plain(f"warning: {warning}"))
        cwd = info["workdir"]
        step: StepReturn | None = None
        with sigint_router(env) as router:
            while True:
                line = router.prompt(functools.partial(read_command, self._read, terminal_safe(f"{cwd}$ ")))
                if line is None:  # Ctrl-C at the prompt
                    print(flush=True)
                    continue
                command = line.strip()
                if not command:
                    continue
                if command == QUIT:
                    return step
                if command == HELP:
                    common.out.print(plain(HELP_TEXT))
                    continue
                if command == SUBMIT and not self.can_submit:
                    common.out.print(plain(f"no task to verify here: {SUBMIT} needs shell TASK --attach ID"))
                    continue
                if command == SUBMIT:
                    step = await env.step(SUBMIT)
                    if env.done:
                        return step
                    # a multi-step task: the step was verified, the next one's instruction follows
                    obs, _, _, _, step_info = step
                    common.out.print(plain(f"step {step_info.get('step', '?')}: {obs}"))
                    continue
                with router.stepping():
                    step = await env.step(line)
                obs, _, terminated, truncated, step_info = step
                self.show(obs)
                cwd = step_info.get("cwd") or cwd
                if terminated or truncated:
                    return step

    def show(self, text: str) -> None:
        """A command's output: as printed, minus what would change the terminal (``display_safe``)
        on a terminal; plain text (``terminal_safe``) anywhere else."""
        if not text:
            return
        shown = display_safe(text) if self.on_terminal else terminal_safe(text)
        if not shown.endswith("\n"):
            shown += "\n"
        common.out.file.write(shown)
        common.out.file.flush()


def read_command(read: Callable[[str], str], prompt: str) -> str:
    """One command: a line, and the next ones while a line ends in a backslash. ``EOFError``
    (Ctrl-D) reads as ``:quit``."""
    try:
        lines = [read(prompt)]
        while lines[-1].endswith("\\"):
            lines.append(read("> "))
    except EOFError:
        print(flush=True)
        return QUIT
    return "\n".join(lines)


class _SigintRouter:
    """Where Ctrl-C goes during a session: at the prompt, ``KeyboardInterrupt`` in ``input()``
    (the line is dropped); during a command, ``env.interrupt()`` on the loop; anywhere else (a
    verification, printing), the handler that was there before (asyncio's: cancel the session)."""

    def __init__(self, env: AsyncTerminalEnv, previous: Callable[[int, FrameType | None], object] | None) -> None:
        self._env = env
        self._loop = asyncio.get_running_loop()
        self._previous = previous
        self._state = "busy"

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self._state == "prompt":
            raise KeyboardInterrupt
        if self._state == "stepping":
            self._loop.call_soon_threadsafe(self._env.interrupt)
        elif callable(self._previous):
            self._previous(signum, frame)
        else:
            raise KeyboardInterrupt

    def prompt(self, read: Callable[[], str]) -> str | None:
        """``read()``, or None when Ctrl-C came while it waited."""
        self._state = "prompt"
        try:
            return read()
        except KeyboardInterrupt:
            return None
        finally:
            self._state = "busy"

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        self._state = "stepping"
        try:
            yield
        finally:
            self._state = "busy"


@contextlib.contextmanager
def sigint_router(env: AsyncTerminalEnv) -> Iterator[_SigintRouter]:
    """A ``_SigintRouter`` as the SIGINT handler while the block runs; the previous one after."""
    previous = signal.getsignal(signal.SIGINT)
    router = _SigintRouter(env, previous if callable(previous) else None)
    signal.signal(signal.SIGINT, router.handle)
    try:
        yield router
    finally:
        signal.signal(signal.SIGINT, previous)


def print_closing(record: TrialRecord) -> None:
    """The session's end: the record as ``check`` prints it when the task was verified, else one
    line (turns, time, why); then where the transcript went."""
    if record.report_format or record.stop_reason:
        print_record(record)
    else:
        total = record.timings.get("total", 0.0)
        common.out.print(plain(f"left without verifying · {record.turns} turns · {total:.1f}s"))
        print_notes(record)
    if record.transcript:
        common.err.print(f"transcript: {record.transcript}", markup=False)
