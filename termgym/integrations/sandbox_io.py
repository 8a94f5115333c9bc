"""Commands and files in a termgym sandbox as an outside framework's sandbox API wants them: an
argv's stdout and stderr apart, its exit status, bounded output, standard input, and files written
and read as the task's agent user, on every backend.

termgym's ``Sandbox.exec`` interleaves stdout and stderr and not every backend takes stdin (Docker's
exec does not), so a command runs under a small ``/bin/sh`` wrapper: each stream goes through
``head -c`` (at most the cap plus one byte is kept, the rest is drained, so a command that writes
too much is neither killed nor stalled) into private files under ``/tmp`` (made with umask 077; the
command keeps its own umask), and comes back base64-encoded with the command's status; the files
are removed, by the wrapper or, after a timeout, by termgym. The wrapper's own tools are found on
the system directories only; the command itself is looked up on its own ``PATH``, with its
environment as given. Standard input and a written file's contents travel as a staged file
(``upload_tar``, which every backend implements natively), removed afterwards.

Guarantees: ``run`` never raises for the command's own failure (that is data in ``Output``);
``SandboxError`` propagates for the sandbox's own faults; a timeout is ``Output.timed_out``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import posixpath
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

from termgym.sandboxes.base import DEFAULT_PATH, Sandbox, base64_length, last_line
from termgym.sandboxes.files import tar_of_files

STAGE_ROOT = "/tmp"
FILE_TIMEOUT = 600.0  # seconds for a file written or read
_SEPARATOR = b"--\n"  # between the two streams: never inside base64 text

_RUN = f"""n=$1; input=$2; d=$3; shift 3
p=$PATH; PATH={DEFAULT_PATH}; m=$(umask); umask 077
{{ {{ (umask "$m"; PATH=$p; exec "$@") <"$input" 2>&1 1>&3 3>&-; echo $? >"$d.rc"; }} | \
{{ head -c "$n" >"$d.e"; cat >/dev/null; }}; }} 3>&1 | {{ head -c "$n" >"$d.o"; cat >/dev/null; }}
read rc <"$d.rc"; echo "${{rc:-126}}"
[ -s "$d.o" ] && base64 "$d.o"; echo --; [ -s "$d.e" ] && base64 "$d.e"
rm -f "$d.o" "$d.e" "$d.rc"
"""

_WRITE = f"""PATH={DEFAULT_PATH}
[ -d "$1" ] && {{ echo "$1: Is a directory" >&2; exit 21; }}
mkdir -p -- "$(dirname -- "$1")" && cat -- "$2" >"$1"
"""

_READ = f"""PATH={DEFAULT_PATH}
[ -e "$1" ] || {{ echo "$1: No such file or directory"; exit 2; }}
[ -d "$1" ] && {{ echo "$1: Is a directory"; exit 21; }}
[ -r "$1" ] || {{ echo "$1: Permission denied"; exit 13; }}
head -c "$2" -- "$1" | base64
"""


@dataclass(frozen=True)
class Output:
    """A command's outcome: ``returncode`` None when it timed out; each stream cut at the cap,
    ``over_limit`` when either had more."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    over_limit: bool = False
    timed_out: bool = False


class WrapperFailed(RuntimeError):
    """The wrapper could not run the command (no writable ``/tmp``, no ``/bin/sh``): one line."""


def resolve(path: str, workdir: str) -> str:
    """An absolute path in the sandbox: ``path`` itself, or relative to ``workdir``."""
    return path if posixpath.isabs(path) else posixpath.normpath(posixpath.join(workdir, path))


def parse_run(output: bytes, cap: int) -> Output:
    """The wrapper's report: status line, base64 stdout, the separator, base64 stderr."""
    status, _, streams = output.partition(b"\n")
    stdout_text, found, stderr_text = streams.partition(_SEPARATOR)
    try:
        returncode = int(status.strip())
        stdout = base64.b64decode(b"".join(stdout_text.split()), validate=True)
        stderr = base64.b64decode(b"".join(stderr_text.split()), validate=True)
    except (ValueError, binascii.Error):
        found = b""
    if not found:
        raise WrapperFailed(f"the command's wrapper failed: {last_line(output.decode(errors='replace'))}")
    over = len(stdout) > cap or len(stderr) > cap
    return Output(returncode, stdout[:cap], stderr[:cap], over_limit=over)


async def run(
    sandbox: Sandbox,
    user: str | None,
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: str,
    env: Mapping[str, str],
    cap: int,
    stdin: bytes | None = None,
) -> Output:
    """``argv`` as ``user`` (None: the sandbox's default) in ``cwd`` with exactly ``env``."""
    scratch = f"{STAGE_ROOT}/.termgym-exec-{uuid.uuid4().hex}"
    async with _staged(sandbox, stdin) as input_path:
        result = await sandbox.exec(
            ["/bin/sh", "-c", _RUN, "sh", str(cap + 1), input_path, scratch, *argv],
            timeout=timeout,
            env=env,
            cwd=cwd,
            output_limit=2 * base64_length(cap + 1, line=76) + 64,
            user=user,
        )
    if result.timed_out:  # the wrapper was killed with the command: its files are left to remove
        await _remove(sandbox, *(f"{scratch}.{suffix}" for suffix in ("o", "e", "rc")))
        return Output(None, b"", b"", timed_out=True)
    if result.exit_code != 0:
        raise WrapperFailed(f"the command's wrapper failed (exit {result.exit_code}): {last_line(result.text)}")
    return parse_run(result.output, cap)


async def write_file(sandbox: Sandbox, user: str | None, path: str, contents: bytes, *, env: Mapping[str, str]) -> str:
    """Write ``contents`` to the absolute ``path`` as ``user``, parents made; '' on success, else
    the failure's text (the caller maps it: a directory, a permission)."""
    async with _staged(sandbox, contents) as staged:
        result = await sandbox.exec(
            ["/bin/sh", "-c", _WRITE, "sh", path, staged], timeout=FILE_TIMEOUT, env=env, cwd="/", user=user
        )
    if result.timed_out:
        raise TimeoutError(f"writing {path} timed out")
    return "" if result.exit_code == 0 else result.text.strip() or f"exit {result.exit_code}"


async def read_file(
    sandbox: Sandbox, user: str | None, path: str, *, cap: int, env: Mapping[str, str]
) -> tuple[bytes | None, int, str]:
    """The file's first ``cap + 1`` bytes read as ``user`` (None when it could not be read), the
    status (2: missing, 21: a directory, 13 or another: unreadable) and the failure's text."""
    result = await sandbox.exec(
        ["/bin/sh", "-c", _READ, "sh", path, str(cap + 1)],
        timeout=FILE_TIMEOUT,
        env=env,
        cwd="/",
        output_limit=base64_length(cap + 1, line=76) + 64,
        user=user,
    )
    if result.timed_out:
        raise TimeoutError(f"reading {path} timed out")
    if result.exit_code != 0:
        return None, result.exit_code or 1, result.text.strip()
    try:
        return base64.b64decode(b"".join(result.output.split()), validate=True), 0, ""
    except (ValueError, binascii.Error):
        return None, 1, f"{path}: the contents came back garbled"


@contextlib.asynccontextmanager
async def _staged(sandbox: Sandbox, data: bytes | None) -> AsyncIterator[str]:
    """A path holding ``data`` in the sandbox (``/dev/null`` for None), readable by any user,
    removed on the way out."""
    if data is None:
        yield "/dev/null"
        return
    directory = f"{STAGE_ROOT}/.termgym-stage-{uuid.uuid4().hex}"
    await sandbox.upload_tar(tar_of_files([], [("data", data, 0o644)]), directory)
    try:
        yield f"{directory}/data"
    finally:
        await _remove(sandbox, directory)


async def _remove(sandbox: Sandbox, *paths: str) -> None:
    """Remove what termgym made under ``/tmp``, as root (the image's default user may not be)."""
    root = "0" if sandbox.supports_users else None
    await sandbox.exec(["/bin/rm", "-rf", "--", *paths], timeout=60.0, cwd="/", env={"PATH": DEFAULT_PATH}, user=root)
