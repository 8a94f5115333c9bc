"""The system-call tracer every backend that can runs the verifier under: its command line.

``strace`` follows every process the command starts and reports each program executed and each
file opened, successful calls only, every string and every decoded descriptor path hex-escaped
(``-xx -y``: a file name can neither forge nor hide a line), with the filter in the kernel
(``--seccomp-bpf``: a traced process whose tracer is killed gets ``ENOSYS`` from every traced call,
so it cannot go on opening files unseen). The command's stderr joins its stdout, so the tracer's
own stderr carries the trace alone; a backend keeps that stream apart and bounded
(``TRACE_LIMIT``). ``termgym.episode.loads`` reads it. Pure: argv lists.
"""

from __future__ import annotations

from collections.abc import Sequence

TRACED_CALLS = "execve,execveat,open,openat,openat2,creat"
TRACE_OPTIONS = (
    "-f",
    "-qq",
    "--seccomp-bpf",
    "-xx",
    "-y",
    "-s",
    "4096",
    "-e",
    f"trace={TRACED_CALLS}",
    "-e",
    "status=successful",
    "-e",
    "signal=none",
)
STDERR_TO_STDOUT = ("/bin/sh", "-c", 'exec "$@" 2>&1', "sh")
TRACE_LIMIT = 64 << 20  # bytes of trace kept; a longer trace is incomplete, which fails closed


def traced_argv(tracer: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` run under the tracer whose command line (up to its options) is ``tracer``."""
    return [*tracer, *TRACE_OPTIONS, "--", *STDERR_TO_STDOUT, *argv]
