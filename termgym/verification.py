"""Verification, exactly as DESIGN.md orders it, on any backend.

After the agent ends: every process the agent started is killed; ``/logs/verifier`` is emptied and
recreated; ``/tests`` is replaced by a fresh copy of the task's tests (with the assertion kit at
``/tests/.termgym/assert.sh``); the test script runs as root with a clean environment (the image's
own ENV, the task's verifier env, ``TEST_DIR=/tests``), in the image's working directory, under the
verifier timeout. Reports are then read from ``/logs/verifier`` (regular files only, size-capped)
and the first match wins (see ``verifiers.select_report``).

What the agent did to ``/logs/verifier`` or ``/tests`` cannot count: both are recreated after its
processes are gone, and reports are read only from what the verifier wrote.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import resources

from termgym.errors import SandboxError
from termgym.sandboxes.base import DEFAULT_PATH, Sandbox, tar_of_files
from termgym.tasks import Task
from verifiers import MAX_REPORT_BYTES, AssertionReport, compute_reward, select_report

KIT_PATH = "/tests/.termgym/assert.sh"
MAX_REPORT_FILES = 32
VERIFIER_OUTPUT_LIMIT = 1 << 20

_RESET = r"""
[ -L /logs ] && rm -f /logs
mkdir -p /logs
rm -rf /logs/verifier /tests 2>/dev/null
mkdir -p /logs/verifier /tests
find /tests -mindepth 1 -delete
"""

# Each regular file at the top of /logs/verifier as: name NUL size NUL first-(cap+1)-bytes.
_READ_REPORTS = r"""
cap=$1; n=0
cd /logs/verifier 2>/dev/null || exit 0
for f in * .[!.]*; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  n=$((n + 1)); [ "$n" -le "$2" ] || break
  size=$(head -c "$cap" -- "$f" | wc -c)
  printf '%s\0%s\0' "$f" "$size"
  head -c "$cap" -- "$f"
done
"""


@dataclass(frozen=True)
class Verification:
    report: AssertionReport
    reward: float
    exit_code: int | None
    timed_out: bool
    output: str
    duration: float


def assertion_kit() -> bytes:
    return resources.files("verifiers").joinpath("kit/assert.sh").read_bytes()


def verifier_env(task: Task, sandbox: Sandbox) -> dict[str, str]:
    env = {"PATH": DEFAULT_PATH, **sandbox.env}
    env.update(
        HOME="/root",
        LANG="C.UTF-8",
        TEST_DIR="/tests",
        TERMGYM_ASSERT=KIT_PATH,
        **dict(task.verifier_env),
    )
    return env


async def verify(task: Task, sandbox: Sandbox, *, reward_scale: int) -> Verification:
    """Run the task's verifier in ``sandbox``; raises ``SandboxError`` only for infrastructure faults."""
    started = time.monotonic()
    await sandbox.kill_agent_processes()
    reset = await sandbox.exec(["/bin/sh", "-c", _RESET], timeout=60, cwd="/")
    if reset.exit_code != 0:
        raise SandboxError(f"could not reset /tests and /logs/verifier: {reset.text.strip()[:200]}")
    kit = (".termgym/assert.sh", assertion_kit(), 0o755)
    await sandbox.upload_tar(tar_of_files(task.test_files(), [kit]), "/tests")
    script = f"/tests/{task.test_script}"
    await sandbox.exec(["chmod", "+x", script], timeout=30, cwd="/")
    result = await sandbox.exec(
        [script],
        env=verifier_env(task, sandbox),
        cwd=sandbox.workdir,
        timeout=task.verifier_timeout_sec,
        output_limit=VERIFIER_OUTPUT_LIMIT,
    )
    files = await read_report_files(sandbox)
    report = select_report(files, result.text, None if result.timed_out else result.exit_code)
    return Verification(
        report=report,
        reward=compute_reward(report, reward_scale),
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        output=result.text,
        duration=time.monotonic() - started,
    )


async def read_report_files(sandbox: Sandbox) -> dict[str, bytes]:
    """The top-level regular files of ``/logs/verifier``; each cut at MAX_REPORT_BYTES + 1 bytes so
    that an oversized report is seen as oversized, never read whole."""
    cap = MAX_REPORT_BYTES + 1
    limit = MAX_REPORT_FILES * (cap + 512)
    result = await sandbox.exec(
        ["/bin/sh", "-c", _READ_REPORTS, "sh", str(cap), str(MAX_REPORT_FILES)],
        timeout=60,
        cwd="/",
        output_limit=limit,
    )
    return parse_report_stream(result.output)


def parse_report_stream(data: bytes) -> dict[str, bytes]:
    """Decode ``name NUL size NUL bytes`` records; a malformed tail is ignored."""
    files: dict[str, bytes] = {}
    position = 0
    while position < len(data):
        name_end = data.find(b"\0", position)
        size_end = data.find(b"\0", name_end + 1) if name_end >= 0 else -1
        if size_end < 0:
            break
        try:
            size = int(data[name_end + 1 : size_end])
        except ValueError:
            break
        name = data[position:name_end].decode("utf-8", errors="replace")
        files[name] = data[size_end + 1 : size_end + 1 + size]
        position = size_end + 1 + size
    return files
