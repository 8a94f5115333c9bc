"""What the verifier loaded, and which of it the agent wrote: the tamper check's evidence and verdict.

The verifier and every harness step that runs in the sandbox after the agent's end run under a
system-call tracer (``termgym.sandboxes.tracing``): every program executed and every file opened
for reading is a *load*. A load is *forged* when the agent wrote the file (added or changed it,
by the backend's list of the sandbox's changes) and the task did not say the verifier runs the
agent's work there: the work directory, the paths a task declares (``[verifier].agent_paths``),
or everything (``[verifier].allow_system_changes``). A file only opened is not a load when it reads
as data (``reads_as_data``): the user database, the package managers' state, a package's metadata
(the files those name are checked when loaded), a new file of no code or configuration kind (the
output a test reads, ``/tmp/out.txt``), a changed file of the image of a data kind (a page a server
serves); a changed file of the image of any other kind is the toolchain's, and always a load.

Programs the kernel loads itself are loads too: the interpreter a script's ``#!`` line names and
the dynamic loader an ELF program names (``kernel_interpreter``), read from the executed files.

What this module guarantees: the trace is parsed from ``strace -xx -y`` output, every string
hex-escaped, so a file name cannot forge or hide a line; a line that does not parse is ignored,
and one that is cut ends the trace (``Trace.complete`` False), which fails closed. Pure: no I/O.
"""

from __future__ import annotations

import posixpath
import re
import struct
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

CACHE_SUFFIXES = (".pyc", ".pyo")
# Files only ever read as data by the tools a verifier runs: they name other files (which are
# checked when loaded) or hold state, and run nothing.
_PURE_DATA_FILES = frozenset(
    {
        "/etc/passwd",
        "/etc/group",
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/subuid",
        "/etc/subgid",
        "/etc/hostname",
        "/etc/hosts",
        "/etc/resolv.conf",
        "/etc/mtab",
        "/etc/machine-id",
        "/etc/localtime",
        "/etc/timezone",
        "/etc/ld.so.cache",
    }
)
_PURE_DATA_TREES = ("/var/lib/dpkg/", "/var/lib/apt/", "/var/cache/", "/var/log/", "/var/lib/ucf/")
_METADATA_DIRS = (".dist-info", ".egg-info")
# The files a Python distribution's metadata directory holds that are read, never run.
_METADATA_FILES = frozenset(
    {
        "METADATA",
        "PKG-INFO",
        "RECORD",
        "INSTALLER",
        "REQUESTED",
        "WHEEL",
        "top_level.txt",
        "entry_points.txt",
        "direct_url.json",
        "SOURCES.txt",
        "dependency_links.txt",
        "requires.txt",
        "not-zip-safe",
    }
)


# What a new file the agent added is, by its name, when a traced step only opened it: code or the
# configuration of a tool (the kinds a pristine toolchain looks up by name and runs, or follows), or
# else data the tests read (an output such as /tmp/out.txt). Executed, any file is code.
_CODE_SUFFIXES = frozenset(
    ".py .pyc .pyo .pyd .pyz .pyw .pth .so .dylib .a .o .pl .pm .pmc .pod .rb .gemspec .js .mjs .cjs .node"
    " .ts .lua .luac .tcl .tk .php .jar .class .war .zip .egg .whl .wasm .sh .bash .zsh .ksh .csh .fish"
    " .el .elc .r .R .jl .awk .sed .vim .ini .cfg .conf .toml .rc .env".split()
)
_CODE_NAMES = frozenset(
    {"pyvenv.cfg", "ld.so.preload", "ld.so.conf", "package.json", "Makefile", "makefile", "GNUmakefile"}
    | {"environment", "profile", "login.defs", "inputrc", "activate", "direnv"}
)
# What a changed file of the image is, by its name, when a traced step only opened it: data the tests
# read (a page a server serves, a table, a text). Any other file of the image is the toolchain's own
# (its code, its configuration, a script sourced by name such as bin/activate).
_DATA_SUFFIXES = frozenset(
    ".txt .csv .tsv .log .md .rst .html .htm .css .json .jsonl .xml .svg .png .jpg .jpeg .gif .webp .ico"
    " .pdf .dat .data .db .sqlite .sqlite3 .parquet .npy .npz .h5 .out .err .bak .orig .tmp .lock .pid".split()
)


@dataclass(frozen=True)
class Load:
    """One file the traced command loaded: ``how`` is ``executed`` or ``opened``; ``pid`` the process
    that did; ``path`` absolute (``relative`` True when the call named a relative path whose
    process's working directory the trace never showed: then ``path`` is that relative path)."""

    path: str
    how: str
    pid: int
    relative: bool = False
    # the directories a lookup of the path as the call named it passed through, and that path itself
    # (a link the agent put on the way is a change there, not at the path the kernel reached)
    via: tuple[str, ...] = ()


@dataclass(frozen=True)
class Trace:
    loads: tuple[Load, ...]
    complete: bool  # False when the trace was cut (over TRACE_LIMIT or mid-line)


@dataclass(frozen=True)
class Forged:
    """A load of a file the agent wrote: ``kind`` ``A`` (added) or ``C`` (changed)."""

    path: str
    kind: str
    how: str
    pid: int
    step: str  # the harness step that loaded it ("the verifier", "the reset of /tests"...)

    def describe(self) -> str:
        what = "added" if self.kind == "A" else "changed"
        return f"{self.path} ({what} by the agent; {self.how} by {self.step}, process {self.pid})"


_HEX = r'"((?:\\x[0-9a-f]{2})*)"'
_DECODED = r"<((?:\\x[0-9a-f]{2})*)>"
_LINE = re.compile(r"^(?:\[pid +(\d+)\] |(\d+) +)?(\w+)\((.*)$")
_EXEC_PATH = re.compile(r"^" + _HEX)
_EXECAT = re.compile(r"^(?:AT_FDCWD|-?\d+)" + _DECODED + r", " + _HEX)
_OPEN_ARGS = re.compile(r"^(?:(?:AT_FDCWD|-?\d+)" + _DECODED + r", )?" + _HEX)
_OPEN_RESULT = re.compile(r"\) += \d+" + _DECODED + r"$")
_AT_FDCWD = re.compile(r"AT_FDCWD" + _DECODED)
_FLAGS = re.compile(r", (O_[A-Z_|]+|0)(?:, |\))")


def _unhex(text: str) -> str:
    return bytes.fromhex(text.replace("\\x", "")).decode("utf-8", errors="surrogateescape")


def parse_trace(data: bytes, *, cut: bool = False) -> Trace:
    """The loads in ``strace`` output made with ``TRACE_OPTIONS``, in order. ``cut``: the capture
    dropped bytes (the trace is incomplete whatever it holds)."""
    text = data.decode("ascii", errors="replace")
    lines = text.split("\n")
    complete = not cut and (text == "" or text.endswith("\n"))
    if not text.endswith("\n"):
        lines = lines[:-1]  # a line without its end is not trusted
    cwd: dict[int, str] = {}
    pending: list[tuple[int, str, str]] = []  # relative executions: (pid, path, how)
    loads: list[Load] = []
    for line in lines:
        match = _LINE.match(line)
        if match is None:
            continue
        pid = int(match.group(1) or match.group(2) or 0)
        call, rest = match.group(3), match.group(4)
        seen_cwd = _AT_FDCWD.search(rest)
        if seen_cwd:
            cwd[pid] = _unhex(seen_cwd.group(1))
        if call == "execve":
            found = _EXEC_PATH.match(rest)
            if found:
                path = _unhex(found.group(1))
                if path.startswith("/"):
                    loads.append(Load(posixpath.normpath(path), "executed", pid, via=walked(path)))
                else:
                    pending.append((pid, path, "executed"))
        elif call == "execveat":
            found = _EXECAT.match(rest)
            if found:
                base, path = _unhex(found.group(1)), _unhex(found.group(2))
                named = posixpath.join(base, path) if path else base
                loads.append(Load(posixpath.normpath(named), "executed", pid, via=walked(named)))
        elif call in ("open", "openat", "openat2", "creat"):
            result = _OPEN_RESULT.search(rest)
            if result is None or not _reads(call, rest):
                continue
            named = _OPEN_ARGS.match(rest)
            via: tuple[str, ...] = ()
            if named is not None:
                base, path = _unhex(named.group(1) or ""), _unhex(named.group(2))
                via = walked(path if path.startswith("/") else posixpath.join(base or cwd.get(pid, ""), path))
            loads.append(Load(_unhex(result.group(1)), "opened", pid, via=via))
    for pid, path, how in pending:
        if pid in cwd:
            named = posixpath.join(cwd[pid], path)
            loads.append(Load(posixpath.normpath(named), how, pid, via=walked(named)))
        else:
            loads.append(Load(posixpath.normpath(path), how, pid, relative=True))
    return Trace(tuple(loads), complete)


def walked(path: str) -> tuple[str, ...]:
    """The absolute paths a lookup of ``path`` passes through, as written (``..`` taken back only
    after the directory before it was passed), its last one included; () for a relative path."""
    if not path.startswith("/"):
        return ()
    parts: list[str] = []
    passed: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
        passed.append("/" + "/".join(parts))
    return tuple(dict.fromkeys(passed))


def _reads(call: str, rest: str) -> bool:
    """Whether the open reads a file's content: not a directory (a listing runs nothing), not
    ``O_PATH``, not write-only, not ``creat``."""
    if call == "creat":
        return False
    flags = _FLAGS.search(rest)
    names = set(flags.group(1).split("|")) if flags else set()
    return not names & {"O_DIRECTORY", "O_PATH", "O_WRONLY"}


def is_cache(path: str) -> bool:
    """A byte-code cache a program writes for itself (``__pycache__``, ``.pyc``): dropped before the
    verifier runs, never tampering (a forged one whose header matches its source would load)."""
    return path.endswith(CACHE_SUFFIXES) or "/__pycache__/" in path or path.endswith("/__pycache__")


def is_pure_data(path: str) -> bool:
    """Whether ``path`` is a file the tools a verifier runs only read as data (``_PURE_DATA_*``)."""
    if path in _PURE_DATA_FILES or path.startswith(_PURE_DATA_TREES):
        return True
    parent, name = posixpath.split(path)
    return parent.endswith(_METADATA_DIRS) and (name in _METADATA_FILES or name.startswith(("LICENSE", "COPYING")))


def reads_as_data(path: str, kind: str) -> bool:
    """Whether a file the agent added (``A``) or changed (``C``) is only data to a step that opened it
    (never when executed): a known data file (``is_pure_data``); an added file of no code or
    configuration kind by its name (``_CODE_*``); a changed file of a data kind (``_DATA_SUFFIXES``)."""
    if is_pure_data(path):
        return True
    name = posixpath.basename(path)
    suffix = posixpath.splitext(name)[1]
    if kind == "A":
        code = suffix in _CODE_SUFFIXES or name in _CODE_NAMES or _is_rc(name) or ".so." in name
        return not code
    return suffix in _DATA_SUFFIXES


def _is_rc(name: str) -> bool:
    """A start-up file a program reads by name: ``.bashrc``, ``bash.bashrc``, ``.profile``, ``.npmrc``..."""
    return name.startswith(".") or name.endswith("rc") or name.endswith("profile")


def under(path: str, prefixes: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``prefixes`` or lies below one."""
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes if p)


def shebang_interpreter(head: bytes) -> str | None:
    """The interpreter a script's ``#!`` line names (the kernel runs it), else None."""
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip()
    word = line.split(maxsplit=1)[0] if line else b""
    return word.decode("utf-8", errors="surrogateescape") or None


def elf_interpreter(head: bytes) -> str | None:
    """The dynamic loader (``PT_INTERP``) an ELF file names, if it is in ``head``; else None."""
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    if wide:
        phoff, phentsize, phnum = (
            struct.unpack_from(order + "Q", head, 32)[0],
            *struct.unpack_from(order + "HH", head, 54),
        )
    else:
        phoff, phentsize, phnum = (
            struct.unpack_from(order + "I", head, 28)[0],
            *struct.unpack_from(order + "HH", head, 42),
        )
    for index in range(min(phnum, 64)):
        at = phoff + index * phentsize
        if at + (56 if wide else 32) > len(head):
            return None
        if struct.unpack_from(order + "I", head, at)[0] != 3:  # PT_INTERP
            continue
        if wide:
            offset, size = (
                struct.unpack_from(order + "Q", head, at + 8)[0],
                struct.unpack_from(order + "Q", head, at + 32)[0],
            )
        else:
            offset, size = (
                struct.unpack_from(order + "I", head, at + 4)[0],
                struct.unpack_from(order + "I", head, at + 16)[0],
            )
        raw = head[offset : offset + size]
        return raw.split(b"\0", 1)[0].decode("utf-8", errors="surrogateescape") if len(raw) == size else None
    return None


def kernel_interpreter(head: bytes) -> str | None:
    """What the kernel loads to run a file that starts with ``head``: its ``#!`` interpreter or its
    ELF dynamic loader; None for neither."""
    return shebang_interpreter(head) or elf_interpreter(head)


def forged_loads(
    loads: Iterable[Load],
    changes: Mapping[str, str],
    *,
    agent_paths: Sequence[str],
    step: str,
    links: Collection[str] = (),
) -> list[Forged]:
    """The loads of files the agent wrote (``changes``: path -> ``A``/``C``, caches already dropped)
    outside ``agent_paths`` (the work directory and what the task declares), each file once, in the
    order loaded. A file only opened that reads as data (``reads_as_data``) is not a load; an
    executed one always is. Checked: the path the kernel reached, the path as the call named it (a
    link the agent planted there), and the directories the lookup passed through that the agent
    made links (``on_the_way``). A relative path whose directory is unknown is matched against every
    changed path that ends with it."""
    found: dict[str, Forged] = {}
    for load in loads:
        paths = [load.path, *load.via[-1:]]
        paths += [path for path in on_the_way([load], changes) if path in links or changes[path] == "A"]
        if load.relative:
            tail = "/" + load.path.lstrip("./")
            paths = [path for path in changes if path.endswith(tail)]
        for path in paths:
            kind = changes.get(path)
            if kind not in ("A", "C") or under(path, agent_paths) or path in found:
                continue
            passed = path in load.via[:-1]  # a directory passed through: never data
            if load.how == "opened" and not passed and reads_as_data(path, kind):
                continue
            found[path] = Forged(path, kind, load.how, load.pid, step)
    return list(found.values())


def on_the_way(loads: Iterable[Load], changes: Mapping[str, str]) -> list[str]:
    """The changed paths that lookups passed through on their way to the file (each once): a
    directory only the agent's link (or a directory it emptied of new files, which the caller tells
    apart, ``forged_loads``'s ``links``) leaves listed without anything under it. An opened file
    reached where the call named it followed no link, so nothing on its way is counted."""
    found: dict[str, None] = {}
    for load in loads:
        followed = load.how != "opened" or (load.via and load.via[-1] != load.path)
        for path in load.via[:-1] if followed else ():
            if changes.get(path) in ("A", "C"):
                found[path] = None
    return list(found)
