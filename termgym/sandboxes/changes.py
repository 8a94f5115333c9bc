"""What the agent changed in a sandbox, and which search-path entries it could have written.

Pure answers:

- ``manifest_changes`` and ``leaf_changes``: a backend's list of what changed since the
  environment was ready (two manifests of the writable roots on the embedded backend, the engine's
  diff on Docker) as ``{path: A|C|D}``, without the engine's own paths and without directories
  listed only because something under them changed (``capabilities.agent_changes``). The tamper check
  (``termgym.episode.guard``) holds the verifier's traced loads against it.
- ``trusted_search_paths``: an environment with every search-path entry the agent could have written
  taken out (``PATH``, ``PYTHONPATH``, ``LD_LIBRARY_PATH``, ``LD_PRELOAD`` and the like), so that the
  verifier never looks a program or a module up where the agent left one. An entry is kept only
  when it lies under a system directory; a task's own ``[verifier].env`` may put any back.
- ``entrypoint_files``: the files an image's entrypoint names, which every restart runs again.

Pure: no I/O.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping

SYSTEM_PREFIXES = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/boot")
# Paths the engine itself writes into every container: its init, and the files it bind-mounts.
ENGINE_PATHS = frozenset(
    {
        "/sbin/docker-init",
        "/usr/sbin/docker-init",
        "/etc/hostname",
        "/etc/hosts",
        "/etc/resolv.conf",
        "/etc/mtab",
        "/.dockerenv",
    }
)

# Variables holding a list of directories (or files) a program searches, by their separator.
LIST_VARIABLES = {
    **dict.fromkeys(
        ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "LD_AUDIT", "PERL5LIB", "PERLLIB", "NODE_PATH", "RUBYLIB"), ":"
    ),
    **dict.fromkeys(("GEM_PATH", "CLASSPATH", "GCONV_PATH", "R_LIBS", "R_LIBS_USER", "R_LIBS_SITE"), ":"),
    **dict.fromkeys(("JULIA_LOAD_PATH", "GUILE_LOAD_PATH", "TCLLIBPATH", "MANPATH"), ":"),
    "LUA_PATH": ";",
    "LUA_CPATH": ";",
    "LD_PRELOAD": ": ",  # either separates
}
# Variables naming one file or directory a program reads code from at start.
FILE_VARIABLES = ("PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "BASH_ENV", "ENV", "GEM_HOME", "ZDOTDIR")
# Variables holding command-line options, which can load code from anywhere, the working directory
# included (--require x, -javaagent:x.jar, -Mx): never taken from the image, only from [verifier].env.
OPTION_VARIABLES = ("NODE_OPTIONS", "PERL5OPT", "RUBYOPT", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS")
SEARCH_VARIABLES = (*LIST_VARIABLES, *FILE_VARIABLES, *OPTION_VARIABLES)


def is_system_path(path: str) -> bool:
    """Whether the absolute ``path`` lies in a system directory (``SYSTEM_PREFIXES``), with no
    ``..`` that could lead out of it."""
    if not path.startswith("/") or ".." in path.split("/"):
        return False
    normal = "/" + "/".join(part for part in path.split("/") if part not in ("", "."))
    return any(normal == prefix or normal.startswith(prefix + "/") for prefix in SYSTEM_PREFIXES)


def _entries(name: str, value: str) -> list[str]:
    """The paths ``value`` of the list or file variable ``name`` names, empty entries included as
    "" (an empty entry in ``PATH`` means the working directory); an option variable's whole value."""
    if name in LIST_VARIABLES:
        entries = re.split(f"[{re.escape(LIST_VARIABLES[name])}]", value)
        return [entry for entry in entries if entry] if name == "LD_PRELOAD" else entries  # blanks separate
    return [value]


def trusted_search_paths(env: Mapping[str, str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """``(env without the search-path entries outside system directories, [(variable, entry
    dropped)])``. A list variable keeps its system entries in order (and is removed when none is
    left); a file variable outside system directories, and any option variable, is removed whole.
    Empty and relative entries are dropped too: they name the working directory."""
    kept: dict[str, str] = {}
    dropped: list[tuple[str, str]] = []
    for name, value in env.items():
        entries = _entries(name, value) if name in SEARCH_VARIABLES else []
        if name not in SEARCH_VARIABLES or (name in FILE_VARIABLES and is_system_path(value)):
            kept[name] = value
        elif name in LIST_VARIABLES:
            good = [entry for entry in entries if is_system_path(entry)]
            dropped += [(name, entry) for entry in entries if not is_system_path(entry)]
            if good:
                kept[name] = LIST_VARIABLES[name][0].join(good)
        else:
            dropped.append((name, value))
    return kept, dropped


def entrypoint_files(entrypoint: Iterable[str], workdir: str) -> tuple[str, ...]:
    """The files an image's entrypoint names (every word with a ``/`` that is not an option,
    relative ones taken from the image's working directory), which every restart runs again."""
    found: list[str] = []
    for word in entrypoint:
        if "/" in word and not word.startswith("-"):
            found.append(posixpath.normpath(posixpath.join(workdir or "/", word)))
    return tuple(dict.fromkeys(found))


def manifest_changes(before: Mapping[str, tuple[int, ...]], now: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
    """``{path: A|C|D}`` between two manifests of the same trees (``{path: fingerprint}``)."""
    changes = {path: "A" for path in now.keys() - before.keys()}
    changes.update({path: "D" for path in before.keys() - now.keys()})
    changes.update({path: "C" for path in now.keys() & before.keys() if now[path] != before[path]})
    return changes


def leaf_changes(changes: Mapping[str, str]) -> dict[str, str]:
    """``changes`` without the engine's own paths and without the directories listed only because
    something under them was added or changed (a directory is kept where nothing under it is
    listed but deletions: new and empty, emptied, deleted, or replaced by a link), sorted by path."""
    listed = {(path.rstrip("/") or "/"): kind for path, kind in changes.items()}
    parents: set[str] = set()
    for path in (path for path, kind in listed.items() if kind != "D"):  # what is gone under a
        head = path.rsplit("/", 1)[0] or "/"  # directory replaced by a link leaves it listed
        while head not in parents and head != "/":
            parents.add(head)
            head = head.rsplit("/", 1)[0] or "/"
    return {
        path: listed[path]
        for path in sorted(listed)
        if path not in ENGINE_PATHS and path not in parents and path != "/"
    }
