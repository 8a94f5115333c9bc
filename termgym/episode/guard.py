"""The tamper check: every step that runs in the sandbox after the agent's end is traced, and a
load of a file the agent wrote outside its work is the trial's failure (``termgym.episode.loads``).

``LoadGuard`` is made once per verification with the sandbox's changes (``capabilities.agent_changes``,
or None where the backend cannot list them: then nothing can be checked, as on Daytona). Its
``run`` is every in-sandbox step's way in: traced where the backend can (``capabilities.exec_traced``),
else run plainly, and then every change outside the agent's paths counts as loaded (the worst is
assumed, with a warning). Once the changes are known, a step runs untraced when none of them could
be found loaded (the agent added or changed nothing outside its paths, or nothing is checked): a
trace could only be matched against those changes, so it would cost time and decide nothing.
``drop_caches`` removes the byte-code caches the agent's programs wrote before anything runs;
``findings`` adds what the kernel loaded for the executed files (their ``#!`` interpreters and ELF
loaders, read from the sandbox) and what runs untraced (``Sandbox.untraced_loads``), and returns
the forged loads, each file once.

Guaranteed: a trace that was cut, or a step that ran untraced, never lets a change through; the
caches are dropped (not ignored), so a forged ``.pyc`` whose header matches its source is gone.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Iterable, Mapping, Sequence

from termgym.episode.loads import (
    Forged,
    Load,
    forged_loads,
    is_cache,
    is_pure_data,
    kernel_interpreter,
    on_the_way,
    parse_trace,
    under,
    walked,
)
from termgym.errors import SandboxBroken
from termgym.output import DEFAULT_OUTPUT_LIMIT
from termgym.sandboxes.base import ROOT, Command, ExecResult, Sandbox
from termgym.sandboxes.capabilities import exec_traced
from termgym.sandboxes.changes import SYSTEM_PREFIXES
from termgym.tasks import Task

HARNESS_PATHS = ("/logs/verifier", "/tests", "/tmp/.termgym-verifier")  # made fresh by the harness
# The harness's own steps find their tools in the system's directories, not /usr/local, where an
# honest agent installs its own.
HARNESS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
HEAD_BYTES = 4096  # enough of an executed file to read its #! line or its ELF loader
LINK_ARCHIVE_BYTES = 64 << 10  # an archive of one link is a few hundred bytes; a directory may be more
MAX_EXECUTABLE_BYTES = 256 << 20  # an executed file larger than this is read in part by the engine's archive
MAX_RESOLVE_ROUNDS = 6  # links, #! lines and loaders followed from an executed file
# What the kernel loads for a file the agent never changed is the image's: known per image digest.
_PRISTINE: dict[tuple[str, str], str | None] = {}
MAX_PRISTINE = 100_000


def agent_paths(task: Task, workdir: str) -> tuple[str, ...]:
    """Where the verifier runs the agent's work on purpose: the image's working directory (unless it
    is ``/`` or a system directory itself) and what the task declares (``[verifier].agent_paths``)."""
    work = "/" + workdir.strip("/")
    paths = [] if work == "/" or work in SYSTEM_PREFIXES else [work]
    return (*paths, *task.agent_paths)


# The directories above the harness's own: its reset of those below changes them (listed "C" when
# the listing, which runs beside the reset, saw only the deletion below; "A" when the image had none
# and it saw the reset's first directory only). A directory is never loaded, and one the agent
# replaced by a link or a file is replaced again by that reset.
_HARNESS_PARENTS = frozenset(
    "/".join(path.split("/")[:depth]) for path in HARNESS_PATHS for depth in range(2, path.count("/") + 1)
)


def outside_work(changes: Mapping[str, str], paths: Sequence[str]) -> dict[str, str]:
    """The changes the agent made outside ``paths`` and the harness's own directories (and the
    change the harness's reset makes to the directories above them)."""
    return {
        path: kind
        for path, kind in changes.items()
        if not under(path, (*HARNESS_PATHS, *paths)) and not (kind in ("A", "C") and path in _HARNESS_PARENTS)
    }


class LoadGuard:
    """One verification's tamper check (the module docstring says what it guarantees)."""

    def __init__(self, task: Task, sandbox: Sandbox) -> None:
        self._task = task
        self._sandbox = sandbox
        self._paths = agent_paths(task, sandbox.workdir)
        self.changes: dict[str, str] | None = None  # set by ``known``: outside the agent's paths
        self.harness_user: str | None = ROOT  # who runs the harness's own steps (``verification.harness_user``)
        self._listed = False  # ``known`` was told the changes (None among them: the backend cannot list them)
        self._loads: list[tuple[str, Load]] = []
        self._unobserved: list[str] = []  # steps that ran without a trace
        self._cut: list[str] = []  # steps whose trace was cut
        self._resolved: dict[str, str | None] = {}  # _next_loaded's answers, per path
        self._everywhere: dict[str, str] = {}  # the changes, the work directory's included
        digest = sandbox.image.get("digest", "")
        self._image = f"{sandbox.backend}:{digest}" if digest and sandbox.image.get("source") != "host" else ""

    def known(self, changes: Mapping[str, str] | None) -> None:
        """The sandbox's changes (``capabilities.agent_changes``), once listed."""
        self._everywhere = outside_work(changes or {}, ())
        self.changes = None if changes is None else outside_work(changes, self._paths)
        self._listed = True

    @property
    def checks(self) -> bool:
        return self.changes is not None and not self._task.allow_system_changes

    @property
    def traces(self) -> bool:
        """Whether a step is worth tracing: until the changes are known, always; then only while
        one of them (added or changed, outside the agent's paths) is there to be found loaded."""
        if not self._listed:
            return True
        return self.checks and any(kind in ("A", "C") for kind in (self.changes or {}).values())

    async def run(
        self,
        step: str,
        user: str | None,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str],
        cwd: str,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        """Run one step in the sandbox, traced where the backend can and a trace could find
        something (``traces``); its loads are kept."""
        command = Command(tuple(argv), timeout, env=env, cwd=cwd, output_limit=output_limit, user=user)
        if not self.traces:
            return await self._sandbox.run(command)
        result = await exec_traced(self._sandbox, command)
        trace = parse_trace(result.trace, cut=result.trace_dropped > 0) if result and result.trace is not None else None
        if result is None or trace is None or not any(load.how == "executed" for load in trace.loads):
            # no tracer here, or one that could not start (a traced command's first line is always
            # its own execution): the command runs plainly, and every change counts as loaded
            self._unobserved.append(step)
            return await self._sandbox.run(command)
        if not trace.complete and not result.timed_out:
            self._cut.append(step)
        self._loads += [(step, load) for load in trace.loads]
        return result

    async def drop_caches(self) -> None:
        """Remove the byte-code caches the agent's programs wrote or changed (``loads.is_cache``) and
        forget them as changes. ``SandboxBroken`` when they cannot be removed."""
        if self.changes is None:
            return
        caches = sorted(path for path, kind in self.changes.items() if kind in ("A", "C") and is_cache(path))
        for start in range(0, len(caches), 500):
            batch = caches[start : start + 500]
            result = await self.run(
                "the removal of byte-code caches",
                self.harness_user,
                ["/bin/rm", "-rf", "--", *batch],
                timeout=60,
                env={"PATH": HARNESS_PATH},
                cwd="/",
            )
            if result.exit_code != 0:
                raise SandboxBroken(f"could not remove the byte-code caches the agent wrote (exit {result.exit_code})")
        for path in caches:
            del self.changes[path]

    async def findings(self) -> list[Forged]:
        """The forged loads of every step run so far (see the module docstring); [] when nothing is
        checked (no list of changes, or ``allow_system_changes``)."""
        if not self.checks:
            return []
        assert self.changes is not None
        changes = {path: kind for path, kind in self.changes.items() if kind in ("A", "C")}
        # What runs untraced (a restart's entrypoint) is never the agent's work the verifier runs on
        # purpose, wherever it lies: the work directory is no exception there.
        untraced = [Load(path, "run", 0) for path in self._sandbox.untraced_loads]
        everywhere = {
            path: kind for path, kind in self._everywhere.items() if kind in ("A", "C") and not is_cache(path)
        }
        found = forged_loads(untraced, everywhere, agent_paths=(), step="the kill step's restart, untraced")
        for step in dict.fromkeys([*self._unobserved, *self._cut]):
            why = "ran without a trace" if step in self._unobserved else "had its trace cut"
            assumed = [Load(path, "assumed loaded", 0) for path in changes if not is_pure_data(path)]
            found += forged_loads(assumed, changes, agent_paths=self._paths, step=f"{step} (which {why})")
        for step in dict.fromkeys(step for step, _ in self._loads):
            loads = [load for s, load in self._loads if s == step]
            loads += await self._kernel_loads([load for load in loads if load.how == "executed"])
            links = [path for path in on_the_way(loads, changes) if await self._is_link(path)]
            found += forged_loads(loads, changes, agent_paths=self._paths, step=step, links=links)
        unique: dict[str, Forged] = {}
        for forged in found:
            unique.setdefault(forged.path, forged)
        return list(unique.values())

    async def _kernel_loads(self, executed: Iterable[Load]) -> list[Load]:
        """What the kernel loaded to run the executed files: where a link leads, the ``#!``
        interpreter, the ELF loader, followed for ``MAX_RESOLVE_ROUNDS``; read through the
        backend's archive of the sandbox's files (files it cannot reach, the embedded backend's
        read-only host directories, are left out: the agent cannot change them)."""
        seen: set[str] = set()
        found: list[Load] = []
        pending = {load.path: load.pid for load in executed if not load.relative}
        for _ in range(MAX_RESOLVE_ROUNDS):
            pending = {path: pid for path, pid in pending.items() if path not in seen}
            if not pending:
                break
            seen.update(pending)
            following: dict[str, int] = {}
            for path, pid in pending.items():
                target = await self._next_loaded(path)
                if target is not None:
                    found.append(Load(target, "executed", pid, via=walked(target)))
                    following[target] = pid
            pending = following
        return found

    async def _next_loaded(self, path: str) -> str | None:
        """Where a link at ``path`` leads, or what the kernel loads to run the file there."""
        if path in self._resolved:
            return self._resolved[path]
        pristine = self._image and not any(p in self._everywhere for p in walked(path))
        key = (self._image, path)
        if pristine and key in _PRISTINE:
            return _PRISTINE[key]
        self._resolved[path] = found = await self._read_next_loaded(path)
        if pristine and len(_PRISTINE) < MAX_PRISTINE:
            _PRISTINE[key] = found
        return found

    async def _is_link(self, path: str) -> bool:
        """Whether ``path`` in the sandbox is a link now (a tree too large to be one link is none)."""
        member, _ = await self._first_member(path, LINK_ARCHIVE_BYTES)
        return member is not None and member.issym()

    async def _read_next_loaded(self, path: str) -> str | None:
        member, head = await self._first_member(path, MAX_EXECUTABLE_BYTES)
        if member is not None and member.issym():
            return posixpath.normpath(posixpath.join(posixpath.dirname(path), member.linkname))
        interpreter = kernel_interpreter(head)
        return posixpath.normpath(interpreter) if interpreter and interpreter.startswith("/") else None

    async def _first_member(self, path: str, limit: int) -> tuple[tarfile.TarInfo | None, bytes]:
        """``path`` as the one member of the backend's archive of it, and the first ``HEAD_BYTES``
        of it where it is a regular file; ``(None, b"")`` where it is not there or not read within
        ``limit`` bytes."""
        try:
            archive = await self._sandbox.download_tar([path], limit=limit, timeout=60)
            with tarfile.open(fileobj=io.BytesIO(archive)) as members:
                member = members.next()
                extracted = members.extractfile(member) if member is not None and member.isfile() else None
                return member, extracted.read(HEAD_BYTES) if extracted is not None else b""
        except (SandboxBroken, tarfile.TarError):
            return None, b""

    def warnings(self) -> list[str]:
        """One line per step that ran untraced or had its trace cut."""
        lines = []
        if self._unobserved and self.checks:
            steps = ", ".join(dict.fromkeys(self._unobserved))
            lines.append(
                f"{steps} ran untraced on this backend: every change outside the work directory counts as loaded"
            )
        if self._cut:
            lines.append(f"the trace of {', '.join(dict.fromkeys(self._cut))} was cut: every change counts as loaded")
        return lines
