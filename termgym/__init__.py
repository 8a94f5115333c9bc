"""termgym: terminal tasks in real sandboxes for training LLM agents with reinforcement learning.

``termgym.load_task(path)`` reads a task directory (Harbor / Terminal-Bench 2 or Terminal-Bench 1
layout); ``termgym.make(task, backend="local")`` gives an ``AsyncTerminalEnv``; importing termgym
registers the Gymnasium environment ``termgym/Terminal-v0``.
"""

from termgym.env import SUBMIT, AsyncTerminalEnv, make
from termgym.episode.options import EnvOptions
from termgym.errors import SandboxError, TermgymError
from termgym.gym_env import TerminalEnv, register
from termgym.tasks import Task, TaskError, load_task

register()

__all__ = [
    "SUBMIT",
    "AsyncTerminalEnv",
    "EnvOptions",
    "SandboxError",
    "Task",
    "TaskError",
    "TermgymError",
    "TerminalEnv",
    "load_task",
    "make",
]
