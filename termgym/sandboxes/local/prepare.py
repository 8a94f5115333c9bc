"""Prepare a sandbox: run the Dockerfile's steps after ``FROM`` on top of the task's image or the
host's system (``termgym.sandboxes.local.images`` decides which).

``WORKDIR`` creates the directory (together with the next ``RUN``, in the same command, or before the
next ``COPY``: one process less per trial), ``ENV`` and ``ARG`` set the environment that later steps and the
agent see, ``COPY``/``ADD`` copy from the build context (an ``ADD`` of a local tar archive unpacks
it, as Docker does), ``RUN`` runs inside the sandbox. Any failing step raises
``EnvironmentBuildError`` naming the Dockerfile line, with the step's output as the build log (over
the host's system, saying that ``--backend docker`` runs the image).
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path, PurePosixPath

from termgym.errors import EnvironmentBuildError
from termgym.images.dockerfile import CopyStep, EnvironmentPlan, RunStep, WorkdirStep
from termgym.sandboxes.base import Sandbox, SandboxSpec

NEEDS_DOCKER = (
    "over the host's system the embedded backend runs RUN steps with this machine's tools and a read-only /usr; "
    "use --backend docker for this task"
)


async def prepare_environment(sandbox: Sandbox, plan: EnvironmentPlan, spec: SandboxSpec) -> None:
    """Run ``plan`` in ``sandbox``; then set the sandbox's env and workdir to the image's."""
    deadline = time.monotonic() + spec.build_timeout_sec
    where = spec.dockerfile or "Dockerfile"
    pending: list[tuple[str, str]] = []  # (directory, where) of WORKDIR steps not made yet
    for step in plan.steps:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EnvironmentBuildError(f"{where}: environment preparation exceeded {spec.build_timeout_sec:g}s")
        if isinstance(step, WorkdirStep):
            pending.append((step.path, f"{where}:{step.line}: WORKDIR"))
        elif isinstance(step, CopyStep):
            await _make_dirs(sandbox, pending, remaining)
            await _copy(sandbox, step, spec, f"{where}:{step.line}")
        elif isinstance(step, RunStep):
            argv = ["/bin/sh", "-c", step.command] if isinstance(step.command, str) else list(step.command)
            what = f"{where}:{step.line}: RUN"
            if pending:  # made by the same command, then entered: the RUN's own cwd may be one of them
                dirs = [path for path, _ in pending]
                what = f"{', '.join(w for _, w in pending)} and {what}"
                argv = ["/bin/sh", "-c", _DIRS_THEN, "sh", str(len(dirs)), *dirs, step.workdir, *argv]
                pending = []
                await _run(sandbox, argv, dict(step.env), "/", remaining, what)
            else:
                await _run(sandbox, argv, dict(step.env), step.workdir, remaining, what)
    await _make_dirs(sandbox, pending, deadline - time.monotonic())
    sandbox.env.update(dict(plan.env))
    sandbox.env.update(dict(spec.env))
    sandbox.workdir = plan.workdir or "/"


# mkdir -p the first $1 arguments after it, cd into the next one, exec the rest.
_DIRS_THEN = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do mkdir -p -- "$1" || exit 1; shift; n=$((n - 1)); done; '
    'cd -- "$1" || exit 1; shift; exec "$@"'
)


async def _make_dirs(sandbox: Sandbox, pending: list[tuple[str, str]], timeout: float) -> None:
    """Make the pending WORKDIR directories (one command for all), and forget them."""
    if pending:
        await _run(
            sandbox, ["mkdir", "-p", *(path for path, _ in pending)], {}, "/", timeout, ", ".join(w for _, w in pending)
        )
        pending.clear()


async def _run(sandbox: Sandbox, argv: list[str], env: dict[str, str], cwd: str, timeout: float, what: str) -> None:
    result = await sandbox.exec(argv, env={**sandbox.env, **env}, cwd=cwd, timeout=timeout)
    if result.timed_out:
        raise EnvironmentBuildError(f"{what} timed out after {timeout:.0f}s", log=result.text)
    if result.exit_code != 0:
        last = result.text.strip().splitlines()[-1][:200] if result.text.strip() else "no output"
        hint = f"; {NEEDS_DOCKER}" if sandbox.image.get("source") == "host" else ""
        raise EnvironmentBuildError(f"{what} failed (exit {result.exit_code}: {last}){hint}", log=result.text)


async def _copy(sandbox: Sandbox, step: CopyStep, spec: SandboxSpec, where: str) -> None:
    context = spec.context_dir
    if context is None:
        raise EnvironmentBuildError(f"{where}: COPY without a build context")
    sources: list[Path] = []
    for pattern in step.sources:
        matches = sorted(context.glob(pattern)) if _is_glob(pattern) else [context / pattern]
        matches = [m for m in matches if m.exists() and _inside(m, context)]
        if not matches:
            raise EnvironmentBuildError(f"{where}: COPY source {pattern!r} not found in {context}")
        sources += matches
    dest = step.dest
    into_dir = dest.endswith("/") or len(sources) > 1 or sources[0].is_dir()
    if not into_dir:
        probe = await sandbox.exec(["test", "-d", dest], timeout=30, cwd="/")
        into_dir = probe.exit_code == 0
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for source in sources:
            target = PurePosixPath(dest) / source.name if into_dir and not source.is_dir() else PurePosixPath(dest)
            if source.is_dir():
                _add_tree(archive, source, PurePosixPath(dest))
            elif step.is_add and tarfile.is_tarfile(source):
                _add_unpacked(archive, source, PurePosixPath(dest))
            else:
                archive.add(str(source), arcname=str(target).lstrip("/"), filter=_as_root)
    try:
        await sandbox.upload_tar(buffer.getvalue(), "/")
    except Exception as exc:
        hint = f"; {NEEDS_DOCKER}" if sandbox.image.get("source") == "host" else ""
        raise EnvironmentBuildError(f"{where}: COPY to {dest} failed: {exc}{hint}") from exc


def _add_tree(archive: tarfile.TarFile, source: Path, dest: PurePosixPath) -> None:
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source).as_posix()
        archive.add(str(path), arcname=str(dest / relative).lstrip("/"), recursive=False, filter=_as_root)


def _add_unpacked(archive: tarfile.TarFile, source: Path, dest: PurePosixPath) -> None:
    with tarfile.open(source) as inner:
        for member in inner.getmembers():
            name = PurePosixPath(member.name)
            if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                continue  # never unpack outside dest, no links or devices from an archive
            member.name = str(dest / name).lstrip("/")
            fileobj = inner.extractfile(member) if member.isfile() else None
            archive.addfile(_as_root(member), fileobj)


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())
