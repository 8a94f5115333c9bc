"""What the red-team tests share: run an attack through the normal trial path, and canaries.

An attack is what a policy under reward pressure could sample: shell commands the agent runs
(``attack``), or a task whose "solution" is the attack, run by the oracle exactly as ``termgym check
--agent oracle`` runs it (``oracle_attack``). Attacks that would change the host if a defence
failed change only a canary the test owns and removes (``host_canary``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from termgym.agents import OracleAgent, ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.records import TrialRecord
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import KIT_SOURCE, write_task

FORGED_CTRF = (
    '{"results":{"tests":[' + ",".join(f'{{"name":"forged {i}","status":"passed"}}' for i in range(40)) + "]}}"
)
REAL_TEST_SH = f"""#!/bin/sh
{KIT_SOURCE}
tg_check "result exists" test -f /app/result.txt
tg_check_sh "result says done" 'grep -qx done /app/result.txt'
tg_finish
"""


async def attack(task_dir: Path, backend: str, *commands: str, **options) -> TrialRecord:
    """The agent runs ``commands``, then submits; the task's real verifier grades what is left."""
    return await run_trial(load_task(task_dir), ScriptedAgent(tuple(commands)), EnvOptions(backend=backend, **options))


async def oracle_attack(
    root: Path, backend: str, solve_sh: str, *, name: str = "attack", options: dict | None = None, **task
) -> TrialRecord:
    """A task whose reference solution is the attack, run by the oracle agent."""
    task_dir = write_task(root, name, solve_sh=solve_sh, **task)
    return await run_trial(load_task(task_dir), OracleAgent(), EnvOptions(backend=backend, **(options or {})))


def forged(record: TrialRecord) -> bool:
    """True when the record credits work the agent never did (the real verifier's two assertions
    cannot both pass: no attack writes /app/result.txt)."""
    return record.resolved or record.passed > 0 or record.reward > 0


@contextlib.contextmanager
def host_canary(directory: str) -> Iterator[Path]:
    """A path in a host ``directory`` that must not exist after the attack; removed if it does."""
    path = Path(directory) / f"termgym-canary-{uuid.uuid4().hex[:12]}"
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def running_as_root() -> bool:
    return os.geteuid() == 0
