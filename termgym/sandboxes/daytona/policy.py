"""Pure decisions of the Daytona backend: retries, backoff, snapshot names, resources, commands.

Nothing here does I/O or imports the SDK, so tables of cases test it. ``daytona.py`` maps SDK
exceptions to these functions' inputs by exception class and status code, never by names.
Guarantees:
- ``classify_failure`` puts every create failure in exactly one class: ``rate_limited`` (429),
  ``quota`` (HTTP 400 whose message says a limit was exceeded or reached), ``transient`` (500, 502,
  503, 504, or a transport fault without a status), ``fatal`` (everything else);
- ``retry_delay`` never waits less than the server's retry-after, never more than the policy's cap
  (or the retry-after when that is longer) times ``1 + jitter``, and gives up (None) after the
  policy's attempts for that class;
- ``snapshot_name`` depends only on the environment's content (Dockerfile, build context paths,
  bytes and executable bits, base image, resources), never on paths on this machine or times;
- ``encode_command`` turns any script into ``sh -c '...'`` around ASCII letters, digits and octal
  escapes, which survives a shell and the naive quote splitter of older Daytona daemons;
- ``environment_routes_requests`` is False only when the environment names no proxy for HTTP or
  websockets and has no netrc file: then aiohttp's ``trust_env`` cannot change any request."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from termgym.errors import ConfigError
from termgym.sandboxes.base import DEFAULT_PATH, Resources
from termgym.sandboxes.pacing import Window

FailureClass = Literal["rate_limited", "quota", "transient", "fatal"]

TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
# "Total CPU limit exceeded. Maximum allowed: 10." / "Sandbox resource limit reached (16), please
# try again later" / "quota exceeded": the API has no dedicated class for these (daytona#3304).
_QUOTA = re.compile(
    r"\b(limit|quota)s?\b.*\b(exceeded|reached)\b|\bexceed(s|ed)?\b.*\b(limit|quota)s?\b", re.IGNORECASE
)


def is_quota_message(message: str) -> bool:
    """Whether an HTTP 400 message says an organization limit or quota was exceeded or reached."""
    return bool(_QUOTA.search(message or ""))


def classify_failure(status: int | None, message: str, *, transport: bool = False) -> FailureClass:
    """The retry class of a failed API call: ``status`` is its HTTP status (None when no response
    came back), ``transport`` says the connection failed (refused, reset, dropped)."""
    if status == 429:
        return "rate_limited"
    if status == 400 and is_quota_message(message):
        return "quota"
    if status in TRANSIENT_STATUSES or (status is None and transport):
        return "transient"
    return "fatal"


def retry_after_seconds(headers: Mapping[str, Any] | None) -> float | None:
    """Seconds the server asks to wait: the largest of ``Retry-After`` and every
    ``Retry-After-<throttler>`` (Daytona names one per throttler), falling back to the
    ``X-RateLimit-Reset-<throttler>`` headers; header names compare case-insensitively. Values
    that are not non-negative numbers of seconds are ignored. None when nothing usable is there."""
    if not headers:
        return None
    retry: list[float] = []
    reset: list[float] = []
    for name, value in headers.items():
        key = str(name).lower()
        number = _seconds(value)
        if number is None:
            continue
        if key == "retry-after" or key.startswith("retry-after-"):
            retry.append(number)
        elif key.startswith("x-ratelimit-reset"):
            reset.append(number)
    found = retry or reset
    return max(found) if found else None


def _seconds(value: object) -> float | None:
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait, per failure class. Attempts count every try, the first too."""

    rate_limited_attempts: int = 60
    quota_attempts: int = 60
    transient_attempts: int = 5
    base_delay: float = 1.0  # seconds, doubled per attempt
    max_delay: float = 30.0
    quota_base_delay: float = 5.0  # quotas free up when other sandboxes end: wait longer
    quota_max_delay: float = 60.0
    jitter: float = 0.5  # up to this fraction added at random

    def __post_init__(self) -> None:
        if min(self.rate_limited_attempts, self.quota_attempts, self.transient_attempts) < 1:
            raise ConfigError("retry attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < self.base_delay or self.jitter < 0:
            raise ConfigError("retry delays must satisfy 0 <= base_delay <= max_delay and jitter >= 0")


def backoff_delay(
    attempt: int, *, base: float, cap: float, retry_after: float | None, jitter: float, draw: float
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 for the first): exponential
    ``base * 2**(attempt-1)`` capped at ``cap``, never below ``retry_after``, then stretched by
    ``1 + jitter * draw`` (``draw`` in [0, 1), the caller's random number) so that clients told to
    wait the same time do not all come back at once."""
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"draw must be in [0, 1), got {draw}")
    exponential = min(cap, base * 2 ** min(attempt - 1, 60))
    return max(exponential, retry_after or 0.0) * (1.0 + jitter * draw)


def retry_delay(
    policy: RetryPolicy, kind: FailureClass, attempt: int, retry_after: float | None, draw: float
) -> float | None:
    """Seconds to wait before trying again after attempt ``attempt`` failed with ``kind``; None to
    give up (a fatal failure, or the attempts for that class are spent)."""
    if kind == "fatal":
        return None
    limit = {"rate_limited": policy.rate_limited_attempts, "quota": policy.quota_attempts}.get(
        kind, policy.transient_attempts
    )
    if attempt >= limit:
        return None
    if kind == "quota":
        return backoff_delay(
            attempt,
            base=policy.quota_base_delay,
            cap=policy.quota_max_delay,
            retry_after=retry_after,
            jitter=policy.jitter,
            draw=draw,
        )
    return backoff_delay(
        attempt, base=policy.base_delay, cap=policy.max_delay, retry_after=retry_after, jitter=policy.jitter, draw=draw
    )


def paced_windows(per_second: int, per_minute: int, guard: float) -> tuple[Window, ...]:
    """The pacer's windows for a provider quota of ``per_second`` and ``per_minute`` creates: both
    limits, each window lengthened by ``guard`` seconds, and grants spread evenly
    (``(1 + guard) / per_second`` apart) instead of in bursts.

    Why: a grant is not the moment the request reaches the API. Requests of one burst leave one
    after the other, so the last of a burst reaches the API later than the first of the next one;
    a few milliseconds of such difference put two bursts into one window of the provider's count.
    Spreading removes the in-burst queueing, and the guard absorbs what jitter is left (up to
    ``guard`` seconds). The throughput cost is ``1 / (1 + guard)`` (0.03 s: 3% of 6/s)."""
    if guard < 0:
        raise ConfigError(f"the pacing guard must be >= 0, got {guard}")
    return (Window(1, (1.0 + guard) / per_second), Window(per_second, 1.0 + guard), Window(per_minute, 60.0 + guard))


# -- snapshots and resources ---------------------------------------------------------------------


@dataclass(frozen=True)
class ContextEntry:
    """One file of a build context: its path relative to the context, its bytes, executable or not."""

    path: str
    content: bytes
    executable: bool = False


def environment_hash(
    dockerfile: bytes | None, context: Iterable[ContextEntry], image: str | None, resources: tuple[int, int, int]
) -> str:
    """A hex digest of everything a snapshot is built from; the order of ``context`` is irrelevant."""
    digest = hashlib.sha256()

    def part(label: str, data: bytes) -> None:
        digest.update(label.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)

    part("dockerfile", dockerfile if dockerfile is not None else b"<none>")
    part("image", (image or "").encode())
    part("resources", ",".join(map(str, resources)).encode())
    for entry in sorted(context, key=lambda e: e.path):
        part("file", entry.path.encode("utf-8", errors="surrogateescape"))
        part("mode", b"x" if entry.executable else b"-")
        part("content", entry.content)
    return digest.hexdigest()


def snapshot_name(env_hash: str) -> str:
    """The snapshot name for an environment hash: ``termgym-`` and its first 12 hex digits."""
    if not re.fullmatch(r"[0-9a-f]{12,}", env_hash):
        raise ValueError(f"not a hex digest: {env_hash!r}")
    return f"termgym-{env_hash[:12]}"


def daytona_resources(resources: Resources) -> tuple[int, int, int]:
    """``(cpu, memory GiB, disk GiB)`` for Daytona, which takes whole numbers: each rounded up,
    at least 1."""
    return (
        max(1, math.ceil(resources.cpus)),
        max(1, math.ceil(resources.memory_mb / 1024)),
        max(1, math.ceil(resources.storage_mb / 1024)),
    )


# -- commands --------------------------------------------------------------------------------------


def sh_quote(word: str) -> str:
    """``word`` as one single-quoted POSIX shell word."""
    return "'" + word.replace("'", "'\\''") + "'"


# What ``encode_command`` writes for each byte: ASCII letters and digits as they are, the rest octal.
_ESCAPES = tuple(chr(b) if chr(b).isascii() and chr(b).isalnum() else f"\\{b:03o}" for b in range(256))


def encode_command(script: str) -> str:
    """A command line that runs ``script`` with ``sh``: every byte but ASCII letters and digits is
    an octal escape that ``printf`` decodes, so nothing in it needs quoting. ``script`` must not
    contain NUL (no shell script can)."""
    data = script.encode("utf-8", errors="surrogateescape")
    if b"\0" in data:
        raise ValueError("a shell script cannot contain NUL bytes")
    body = "".join([_ESCAPES[b] for b in data])
    return f'/bin/sh -c \'eval "$(printf "{body}")"\''


PROXY_SCHEMES = ("http", "https", "ws", "wss")  # the schemes aiohttp reads a proxy for (trust_env)


def environment_routes_requests(proxies: Mapping[str, str], netrc_file: bool) -> bool:
    """Whether ``trust_env`` can change a request: ``proxies`` (``urllib.request.getproxies()``)
    names a proxy for one of ``PROXY_SCHEMES``, or a netrc file (credentials for hosts and
    proxies) exists."""
    return netrc_file or any(proxies.get(scheme) for scheme in PROXY_SCHEMES)


def command_line(argv: Sequence[str], env: Mapping[str, str], cwd: str, *, timeout: float | None = None) -> str:
    """A shell line that runs ``argv`` in ``cwd`` with exactly the environment ``env``; with
    ``timeout``, under ``timeout -k 1``, which kills the command's whole process group at the
    deadline. ``timeout`` and ``env`` are found on the system directories (``DEFAULT_PATH``),
    never on the sandbox's own ``PATH``, where the agent could have planted its own."""
    if not argv:
        raise ValueError("argv must name a program")
    for key in env:
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"invalid environment variable name {key!r}")
    limit = f"timeout -k 1 {max(timeout, 0.001):.3f} " if timeout is not None else ""
    words = [sh_quote(f"{key}={value}") for key, value in env.items()] + [sh_quote(word) for word in argv]
    return f"PATH={DEFAULT_PATH} && cd -- {sh_quote(cwd)} && exec {limit}env -i {' '.join(words)}"


def exec_script(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str, timeout: float, output_limit: int, stdin_path: str | None
) -> str:
    """The script ``exec`` runs: ``argv`` as ``command_line`` gives it, with its timeout, output to
    a private file, then printed as the byte count on one line followed by the first
    ``output_limit // 2`` and the last ``output_limit - output_limit // 2`` bytes (all of it when
    it fits); exits with the command's status."""
    if output_limit < 2:
        raise ValueError(f"output limit must be at least 2 bytes, got {output_limit}")
    head, tail = output_limit // 2, output_limit - output_limit // 2
    stdin = sh_quote(stdin_path) if stdin_path else "/dev/null"
    cleanup = f'rm -f "$tg_o" {sh_quote(stdin_path)}' if stdin_path else 'rm -f "$tg_o"'
    return "\n".join(
        [
            f"PATH={DEFAULT_PATH}",  # mktemp, wc, head, tail: the system's, never a shim the agent planted
            "tg_o=$(mktemp /tmp/.termgym-out.XXXXXX) || exit 125",
            f'( {command_line(argv, env, cwd, timeout=timeout)} ) < {stdin} > "$tg_o" 2>&1',
            "tg_s=$?",
            'tg_n=$(wc -c < "$tg_o")',
            "printf '%s\\n' $tg_n",
            f'if [ "$tg_n" -le {output_limit} ]; then cat "$tg_o"; '
            f'else head -c {head} "$tg_o"; tail -c {tail} "$tg_o"; fi',
            cleanup,
            'exit "$tg_s"',
        ]
    )


def parse_exec_output(text: str, output_limit: int) -> tuple[bytes, int]:
    """``(kept output, bytes dropped)`` from what ``exec_script`` printed. Output that does not
    start with a byte count (the script itself failed) is kept as it is, capped like any other."""
    first, newline, rest = text.partition("\n")
    data = rest.encode("utf-8", errors="surrogateescape")
    if not newline or not first.strip().isdigit():
        whole = text.encode("utf-8", errors="surrogateescape")
        if len(whole) <= output_limit:
            return whole, 0
        head = output_limit // 2
        return whole[:head] + whole[len(whole) - (output_limit - head) :], len(whole) - output_limit
    total = int(first.strip())
    return data, max(0, total - output_limit) if total > output_limit else 0


# Kills every process that was not there when the sandbox started (``$1``: those pids, space
# separated) except this script and its ancestors (the daemon's own chain), stopping them first so
# that nothing can fork in between; repeats until none is left.
KILL_SCRIPT = r"""
keep=" $1 "
p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ] 2>/dev/null; do
  keep="$keep$p "
  p=$(sed 's/^.*) [A-Za-z] \([0-9]*\).*/\1/' /proc/$p/stat 2>/dev/null)
done
for round in 1 2 3 4 5; do
  victims=
  for d in /proc/[0-9]*; do
    q=${d#/proc/}
    case "$keep" in *" $q "*) continue ;; esac
    victims="$victims $q"
  done
  [ -z "$victims" ] && exit 0
  kill -STOP $victims 2>/dev/null
  kill -KILL $victims 2>/dev/null
  sleep 0.05
done
exit 0
"""
