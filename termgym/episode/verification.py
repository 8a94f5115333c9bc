"""Verification, exactly as DESIGN.md orders it, on any backend, hardened against the agent.

After the agent ends, every process in the sandbox is ended; ``/logs/verifier``, ``/tests`` and the
verifier's ``HOME`` are replaced by fresh directories, ``/tests`` gets a fresh copy of the task's
tests, and the test script runs as root under the verifier timeout with a clean environment
(``verifier_env``). When it exits, every process is ended again, and only then are the report files
read (regular files, size-capped, at most ``MAX_REPORT_FILES``), graded by
``verifiers.select_report`` and held to the task's assertion count
(``verifiers.check_assertion_count``).

Guarantees: what the agent did to ``/logs/verifier``, ``/tests`` or its home cannot count; a
process the verifier started cannot rewrite a report while it is read; a harness step that fails
inside the sandbox raises ``SandboxBroken``. Where the agent is root in the file system the
verifier runs in (Docker, Daytona), a tool it replaced is not prevented but detected: a load of a
file the agent wrote outside its work fails the trial (``termgym.episode.guard``).

The order step by step: docs/guides/tasks.md#verification; the threat model: docs/security.md."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

from termgym.aio import cancel_and_wait
from termgym.episode.guard import HARNESS_PATH, HARNESS_PATHS, LoadGuard
from termgym.episode.loads import Forged, under
from termgym.episode.tamper import tamper_warning
from termgym.errors import SandboxBroken, TermgymError
from termgym.sandboxes.base import DEFAULT_PATH, ROOT, Sandbox, runs_as_root
from termgym.sandboxes.capabilities import HostFiles, agent_changes, host_files
from termgym.sandboxes.changes import trusted_search_paths
from termgym.sandboxes.files import tar_of_files
from termgym.tasks import Task
from termgym.verifiers import (
    MAX_REPORT_BYTES,
    AssertionReport,
    check_assertion_count,
    compute_reward,
    report_format_of,
    select_report,
    too_many_files_report,
)

KIT_PATH = "/tests/.termgym/assert.sh"
VERIFIER_HOME = "/tmp/.termgym-verifier/home"
KIT_SCRATCH = "/tmp/.termgym-verifier/kit"  # the assertion kit's scratch directory (TG_SCRATCH)
FRESH_DIRS = (*HARNESS_PATHS, VERIFIER_HOME, KIT_SCRATCH)  # what _RESET makes fresh
MAX_REPORT_FILES = 32
VERIFIER_OUTPUT_LIMIT = 1 << 20

# Replace /logs/verifier, /tests, the verifier's home and the kit's scratch directory with fresh
# empty directories, whatever the agent left there (a plain file or a symlink in place of /logs, a
# directory that cannot be removed), and fail, saying so, when that is not possible. With an
# argument, /logs/verifier, the home and the scratch directory are made open to a verifier that
# does not run as root (mode 0777, as Harbor does) as they are made (umask 000), never by a chmod
# that would follow a link a process of the agent's (an entrypoint's hook, run again at the kill
# step) put in their place; their parent must be made here.
_RESET = r"""
for d in /logs /tests; do
  if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -f "$d"; fi
done
rm -rf /logs/verifier /tests/* /tests/.[!.]* /tests/..?* /tmp/.termgym-verifier 2>/dev/null
mkdir -p /logs /tests /tmp 2>/dev/null
mkdir /tmp/.termgym-verifier 2>/dev/null || { echo "cannot make /tmp/.termgym-verifier a fresh directory"; exit 1; }
[ -z "$1" ] || umask 000
mkdir /logs/verifier /tmp/.termgym-verifier/home /tmp/.termgym-verifier/kit 2>/dev/null
for d in /logs/verifier /tests /tmp/.termgym-verifier/home /tmp/.termgym-verifier/kit; do
  [ -d "$d" ] && [ ! -L "$d" ] || { echo "cannot make $d a fresh directory"; exit 1; }
  for f in "$d"/* "$d"/.[!.]* "$d"/..?*; do
    if [ -e "$f" ] || [ -L "$f" ]; then echo "cannot empty $d"; exit 1; fi
  done
done
"""

# The report files at the top of /logs/verifier (regular files named as a report format reads them)
# as: name NUL size NUL first-(cap+1)-bytes. More than $2 of them: their count per format, exit 4.
_READ_REPORTS = r"""
cap=$1; max=$2
cd /logs/verifier 2>/dev/null && [ "$(pwd -P)" = /logs/verifier ] || exit 0  # never through a link
n=0; ctrf=0; junit=0; tap=0; reward=0
for f in * .[!.]*; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  case $f in
    ctrf.json) ctrf=$((ctrf + 1)) ;;
    *.xml) junit=$((junit + 1)) ;;
    *.tap) tap=$((tap + 1)) ;;
    reward.json|reward.txt) reward=$((reward + 1)) ;;
    *) continue ;;
  esac
  n=$((n + 1))
done
if [ "$n" -gt "$max" ]; then
  printf 'ctrf=%d junit=%d tap=%d reward-file=%d' "$ctrf" "$junit" "$tap" "$reward"; exit 4
fi
for f in * .[!.]*; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  case $f in ctrf.json|*.xml|*.tap|reward.json|reward.txt) ;; *) continue ;; esac
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
    system_changes: tuple[str, ...] | None = None  # what the agent changed outside its work; None: unknown
    tampered: bool = False  # a step loaded a file the agent wrote, under the "fail" policy
    warnings: tuple[str, ...] = ()  # search-path entries left out of the verifier's environment, loads let through
    forged: tuple[str, ...] = ()  # each file the agent wrote that a step loaded, and how


class TooManyReports(TermgymError):
    """The verifier wrote more report files than ``MAX_REPORT_FILES``; ``counts`` per format."""

    def __init__(self, counts: dict[str, int]) -> None:
        super().__init__(f"{sum(counts.values())} report files")
        self.counts = counts


def assertion_kit() -> bytes:
    return resources.files("termgym.verifiers").joinpath("kit/assert.sh").read_bytes()


def verifier_env(task: Task, sandbox: Sandbox) -> tuple[dict[str, str], list[str]]:
    """The test script's whole environment, and a warning per search variable it leaves out
    entries of: the image's own environment (never the agent's) without the search-path entries
    the agent could have written (``termgym.sandboxes.changes.trusted_search_paths``: only those
    under system directories stay; ``PATH`` falls back to ``DEFAULT_PATH``), a fresh ``HOME``,
    Python without user site-packages and without the working directory on ``sys.path``, git
    without the agent's global config and with its hooks and fsmonitor off, then the task's
    ``[verifier].env``, which may override any of these (and is trusted as its author wrote it;
    the tamper check watches what it names, ``SandboxSpec.watched``)."""
    image_env, dropped = trusted_search_paths({"PATH": DEFAULT_PATH, **sandbox.env})
    env = {"PATH": DEFAULT_PATH, **image_env}
    env.update(
        HOME=VERIFIER_HOME,
        LANG="C.UTF-8",
        TEST_DIR="/tests",
        TERMGYM_ASSERT=KIT_PATH,
        TG_SCRATCH=KIT_SCRATCH,
        PYTHONNOUSERSITE="1",
        PYTHONSAFEPATH="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_CONFIG_COUNT="2",
        GIT_CONFIG_KEY_0="core.fsmonitor",
        GIT_CONFIG_VALUE_0="false",
        GIT_CONFIG_KEY_1="core.hooksPath",
        GIT_CONFIG_VALUE_1="/dev/null",
        **dict(task.verifier_env),
    )
    by_variable: dict[str, list[str]] = {}
    for name, entry in dropped:
        if name not in task.verifier_env:
            by_variable.setdefault(name, []).append(entry or "(empty: the working directory)")
    warnings = [
        f"the verifier's {name} leaves out what the agent could write: {', '.join(entries)} "
        "(a task that trusts it sets [verifier].env)"
        for name, entries in by_variable.items()
    ]
    return env, warnings


async def verify(
    task: Task, sandbox: Sandbox, *, reward_scale: int, tamper: str = "fail", user: str | None = None
) -> Verification:
    """Run the task's verifier in ``sandbox``. Raises ``SandboxBroken`` when a harness step fails
    inside the sandbox and ``SandboxError`` for infrastructure faults; everything the verifier
    itself does is data in the result. Every step that runs in the sandbox is traced
    (``termgym.episode.guard``): a trial whose verifier (or a harness step) loaded a file the agent
    wrote outside its work is ``tampered`` under ``tamper="fail"`` (the default): reward 0, the
    files named; under ``"warn"`` it keeps its verdict, with a warning. A task that declares
    ``[verifier].allow_system_changes`` is never checked. With ``user`` (``[verifier].user``, where
    the backend ``supports_users``) the test script runs as that user, ``/logs/verifier`` and its
    home made writable for it (mode 0777, as Harbor does), as for an image's ``USER``; the harness
    steps run as the sandbox's root (``harness_user``)."""
    started = time.monotonic()
    await sandbox.check_alive()  # a sandbox the agent killed is not revived to be graded
    await sandbox.kill_agent_processes()
    guard = LoadGuard(task, sandbox)
    # The engine lists the agent's changes while the harness resets what the verifier uses (the
    # harness's own directories, left out of the list): the list is the agent's alone.
    listing = asyncio.ensure_future(agent_changes(sandbox))
    broken: SandboxBroken | None = None  # a harness step the agent broke: tampering, if that is what broke it
    try:
        guard.harness_user, fallback = await harness_user(sandbox, listing)
        try:
            await _prepare_tests(task, sandbox, user, guard)
        except SandboxBroken as exc:
            broken = exc
        guard.known(await listing)
    except BaseException:
        await cancel_and_wait(listing)
        raise
    changes = tuple(sorted(guard.changes)) if guard.changes is not None else None
    env, warnings = verifier_env(task, sandbox)
    warnings += [fallback] if fallback else []
    if broken is None:
        try:
            await guard.drop_caches()
        except SandboxBroken as exc:
            broken = exc
    if tamper == "fail" and (forged := await guard.findings()):  # the harness's reset loaded them
        return _tampered(forged, changes, started)
    if broken is not None:
        raise broken
    env.setdefault("TG_START_MS", str(time.time_ns() // 1_000_000))  # the kit's start, without a clock to fork
    result = await guard.run(
        "the verifier",
        user,
        [f"/tests/{task.test_script}"],
        env=env,
        cwd=sandbox.workdir,
        timeout=task.verifier_timeout_sec,
        output_limit=VERIFIER_OUTPUT_LIMIT,
    )
    await sandbox.kill_agent_processes()  # nothing the verifier started may touch its reports now
    exit_code = None if result.timed_out else result.exit_code
    try:
        files = await read_report_files(sandbox, guard)
    except TooManyReports as exc:
        report = too_many_files_report(exc.counts, MAX_REPORT_FILES, task.report_format)
    else:
        report = select_report(files, result.text, exit_code, declared=task.report_format)
    if forged := await _forged(guard, tamper, warnings):
        return _tampered(forged, changes, started)
    warnings += guard.warnings()
    report = check_assertion_count(report, task.expected_assertions)
    return Verification(
        report=report,
        reward=compute_reward(report, reward_scale),
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        output=result.text,
        duration=time.monotonic() - started,
        system_changes=changes,
        warnings=tuple(warnings),
    )


async def _forged(guard: LoadGuard, tamper: str, warnings: list[str]) -> list[Forged]:
    """The forged loads of every step that fail the trial (none under ``warn``: a warning instead)."""
    forged = await guard.findings()
    if forged and tamper != "fail":
        warnings.append(tamper_warning([item.describe() for item in forged]))
        return []
    return forged


def _tampered(forged: list[Forged], changes: tuple[str, ...] | None, started: float) -> Verification:
    described = tuple(item.describe() for item in forged)
    error = tamper_warning(list(described))
    report = AssertionReport(format="exit-code", assertions=(), binary=True, source="tamper check", error=error)
    return Verification(
        report,
        0.0,
        None,
        False,
        "",
        time.monotonic() - started,
        changes,
        tampered=True,
        forged=described,
    )


async def _prepare_tests(task: Task, sandbox: Sandbox, user: str | None, guard: LoadGuard) -> None:
    """``/logs/verifier``, ``/tests`` and the verifier's home made fresh, and the task's tests (with
    the assertion kit) written to ``/tests``: from the host where the backend reaches the files
    (``capabilities.host_files``), else by traced commands of the image's system paths and the backend's
    upload. ``SandboxBroken`` when the agent left that impossible."""
    files = dict((relative, host) for host, relative in task.test_files())
    script = (task.test_script, files.pop(task.test_script).read_bytes(), 0o755)  # executable, whatever its mode
    kit = (".termgym/assert.sh", assertion_kit(), 0o755)
    host = host_files(sandbox) if user is None else None
    if host is not None:  # no process runs in the sandbox: its files are reached from here
        blobs = [(relative, path.read_bytes(), path.stat().st_mode) for relative, path in files.items()]
        await _on_host(host.fresh_dirs, FRESH_DIRS, "could not reset /tests and /logs/verifier")
        await _on_host(host.write_files, "/tests", [*blobs, kit, script], "could not write /tests")
        return
    opened = "open" if user is not None or not runs_as_root(sandbox.default_user) else ""
    await _harness_step(
        guard,
        "the reset of /tests",
        ["/bin/sh", "-c", _RESET, "sh", opened],
        "could not reset /tests and /logs/verifier",
    )
    archive = tar_of_files([(host, relative) for relative, host in files.items()], [kit, script])
    await sandbox.upload_tar(archive, "/tests")


# What a harness step run as root loads from the sandbox's files: its programs (``/bin/sh``, ``rm``,
# ``chmod``, ``head``, ``wc``), their loader and libraries, the loader's preload list and cache.
ROOT_LOADS = (
    *("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/bin", "/usr/sbin", "/usr/local/lib"),
    *("/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32", "/etc/ld.so.preload", "/etc/ld.so.cache"),
    *("/etc/ld.so.conf", "/etc/ld.so.conf.d"),
)


async def harness_user(sandbox: Sandbox, listing: Awaitable[dict[str, str] | None]) -> tuple[str | None, str]:
    """Who runs the harness's own steps, and a warning: the sandbox's root (``ROOT``), as Harbor
    runs them, whatever the image's ``USER``. Where that USER is not root, only once ``listing``
    (the agent's changes) shows it changed none of ``ROOT_LOADS``: an agent that did (an image that
    lets its USER write them) would run as root in those steps, so they run as that USER instead,
    as Docker's exec does by default, and the warning says why."""
    if runs_as_root(sandbox.default_user):
        return ROOT, ""
    changes = await listing
    if changes is None:
        return None, f"the harness's steps ran as USER {sandbox.default_user}: its changes could not be listed"
    loaded = sorted(path for path, kind in changes.items() if kind in ("A", "C") and under(path, ROOT_LOADS))
    if not loaded:
        return ROOT, ""
    more = f" and {len(loaded) - 1} more" if len(loaded) > 1 else ""
    return None, (
        f"the harness's steps ran as USER {sandbox.default_user}, not as root: it changed {loaded[0]}{more}, "
        "which they load"
    )


async def _on_host(operation: Callable[..., None], *args: object) -> None:
    """A harness step on the sandbox's files from the host; ``SandboxBroken`` saying ``what``
    (the last argument) when it fails."""
    *arguments, what = args
    try:
        await asyncio.to_thread(operation, *arguments)
    except OSError as exc:
        raise SandboxBroken(f"{what}: {exc.strerror or exc}") from exc


async def _harness_step(guard: LoadGuard, step: str, argv: list[str], what: str) -> None:
    result = await guard.run(step, guard.harness_user, argv, timeout=60, cwd="/", env={"PATH": HARNESS_PATH})
    if result.exit_code != 0:
        lines = [line for line in result.text.strip().splitlines() if line.strip()]
        raise SandboxBroken(f"{what}: {lines[-1][:200] if lines else f'exit {result.exit_code}'}")


async def read_report_files(sandbox: Sandbox, guard: LoadGuard) -> dict[str, bytes]:
    """The report files at the top of ``/logs/verifier`` (regular files a report format reads);
    each cut at MAX_REPORT_BYTES + 1 bytes so that an oversized report is seen as oversized, never
    read whole. Raises ``TooManyReports`` beyond ``MAX_REPORT_FILES``, ``SandboxBroken`` when they
    cannot be read. Read from the host where the backend can, else by a step ``guard`` traces."""
    cap = MAX_REPORT_BYTES + 1
    host = host_files(sandbox)
    if host is not None:  # no process runs in the sandbox: nothing can change them while read
        return await asyncio.to_thread(_read_reports_on_host, host, cap)
    limit = MAX_REPORT_FILES * (cap + 512)
    result = await guard.run(
        "the reading of the reports",
        guard.harness_user,
        ["/bin/sh", "-c", _READ_REPORTS, "sh", str(cap), str(MAX_REPORT_FILES)],
        timeout=60,
        cwd="/",
        env={"PATH": HARNESS_PATH},
        output_limit=limit,
    )
    if result.exit_code == 4:
        pairs = (item.partition("=") for item in result.text.split())  # "ctrf=40 junit=2"
        raise TooManyReports({name: int(n) for name, _, n in pairs if n.isdigit()})
    if result.exit_code != 0 or result.dropped_bytes:
        raise SandboxBroken(f"could not read the verifier's reports (exit {result.exit_code})")
    files = parse_report_stream(result.output)
    return {name: data for name, data in files.items() if report_format_of(name) is not None}


def _read_reports_on_host(host: HostFiles, cap: int) -> dict[str, bytes]:
    names = host.list_files("/logs/verifier", lambda name: report_format_of(name) is not None)
    if not names:
        return {}
    if len(names) > MAX_REPORT_FILES:
        raise TooManyReports(dict(Counter(str(report_format_of(name)) for name in names)))
    try:
        return host.read_files("/logs/verifier", names, cap)
    except OSError as exc:
        raise SandboxBroken(f"could not read the verifier's reports ({exc.strerror or exc})") from exc


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
