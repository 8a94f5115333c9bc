"""The system-call tracer every backend that can runs the verifier under: its command line.

``strace`` follows every process the command starts and reports each program executed and each
file opened, successful calls only, every string and every decoded descriptor path hex-escaped
(``-xx -y``: a file name can neither forge nor hide a line), with the filter in the kernel
(``--seccomp-bpf``: a traced process whose tracer is killed gets ``ENOSYS`` from every traced call,
so it cannot go on opening files unseen). The command's stderr joins its stdout, so the tracer's
own stderr carries the trace alone; a backend keeps that stream apart and bounded
(``TRACE_LIMIT``). ``termgym.episode.loads`` reads it. Pure: argv lists.

The command ends the trace (``END_WITH_COMMAND``): once it exits, every other process the tracer
follows (what it left running: a server started with ``&``) is killed while still traced, so the
tracer ends, with the command's exit status, as an untraced run does, never after a process ran on
unseen. Without it ``strace -f`` waits for the last of them, to the step's timeout.
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
# Runs the command (stderr joined to stdout), then ends every process whose TracerPid is its own
# (found by /proc: every process the tracer follows, whoever became its parent), pass after pass
# until none is left, and exits as the command did. Each pass stops them all, then kills them all:
# killed one by one, a shell whose child died first went on to its next command before its own
# SIGKILL (seen under load: `(sleep 2; tool) &` ran `tool`). A zombie is stopped and killed too
# (its leader may be all that exited, not its threads), and seen again until the tracer reaped it.
# Builtins only (no fork: a forked shell would be followed too). Its own errors go to /dev/null,
# not into the trace; without /dev/null it kills nothing (the tracer then waits for them, as it
# did before), and still exits as the command did.
END_WITH_COMMAND = r"""
"$@" 2>&1
status=$?
read_status() {  # $1: a /proc/PID directory; sets pid and tracer from its status (empty if it is gone)
    pid= tracer=
    while read -r key value; do
        case $key in Pid:) pid=$value ;; TracerPid:) tracer=$value; break ;; esac
    done < "$1/status"
}
{
    read_status /proc/self
    self=$pid mine=$tracer
    case $mine in ""|0) killed= ;; *) killed=1 ;; esac
    while [ -n "$killed" ]; do
        killed=
        for entry in /proc/[0-9]*; do
            read_status "$entry"
            [ "$tracer" = "$mine" ] && [ "$pid" != "$self" ] && kill -STOP "$pid" && killed="$killed $pid"
        done
        [ -z "$killed" ] || kill -KILL $killed
    done
} 2>/dev/null
exit $status
"""
TRACED_WRAPPER = ("/bin/sh", "-c", END_WITH_COMMAND, "sh")
TRACE_LIMIT = 64 << 20  # bytes of trace kept; a longer trace is incomplete, which fails closed


def traced_argv(tracer: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` run under the tracer whose command line (up to its options) is ``tracer``, the trace
    ending with ``argv``'s own process (``END_WITH_COMMAND``)."""
    return [*tracer, *TRACE_OPTIONS, "--", *TRACED_WRAPPER, *argv]
