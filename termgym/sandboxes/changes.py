"""What the verifier's tools depend on, and what of it the agent could have changed.

Two pure answers:

- ``system_changes``: from what the engine says a container changed against its image
  (``Sandbox.changed_system_paths`` on Docker), the changed paths a verifier's tools depend on:
  system directories, files planted at ``/``, and the paths a run watches on top of those (the
  search-path directories a task's ``[verifier].env`` trusts, an image's entrypoint).
  ``termgym.episode.tamper`` says what a run makes of them.
- ``trusted_search_paths``: an environment with every search-path entry the agent could have written
  taken out (``PATH``, ``PYTHONPATH``, ``LD_LIBRARY_PATH``, ``LD_PRELOAD`` and the like), so that the
  verifier never looks a program or a module up where the agent left one. An entry is kept only
  when it lies under a system directory: read-only on the embedded backend, watched by the tamper
  check on Docker. ``watched_paths`` names what a trusted environment (a task's own
  ``[verifier].env``) looks things up in outside the system directories, for the tamper check.

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


def watched_paths(env: Mapping[str, str]) -> tuple[str, ...]:
    """The absolute paths outside system directories that the search variables of ``env`` make a
    program look things up in, each once, sorted; for a ``PATH`` entry ``X/bin`` (or ``X/sbin``)
    its prefix ``X`` too, whose libraries a program from ``X/bin`` loads."""
    found: set[str] = set()
    for name, value in env.items():
        if name not in SEARCH_VARIABLES or name in OPTION_VARIABLES:
            continue  # an option variable's paths are its author's to trust
        for entry in _entries(name, value):
            if not entry.startswith("/") or is_system_path(entry):
                continue
            normal = "/" + "/".join(part for part in entry.split("/") if part not in ("", "."))
            found.add(normal)
            head, _, tail = normal.rpartition("/")
            if name == "PATH" and tail in ("bin", "sbin") and head and not is_system_path(head):
                found.add(head)
    return tuple(sorted(found))


# The system directories a verifier's programs are looked up in (DEFAULT_PATH's), and the
# alternatives directory their links commonly pass through: where a link out of the system
# directories would make a trusted name run a program the agent can write.
LINKED_DIRECTORIES = (
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/etc/alternatives",
)


def link_exits(links: Mapping[str, str], *, hops: int = 40) -> tuple[str, ...]:
    """Where links in the system directories lead out of them: for each ``{link: its target as
    read}`` (a relative target is taken from the link's directory), the chain is followed through
    the other links given while it stays in system directories, and the first path outside them
    is an exit. The exits, each once, sorted: a program found by a trusted name there is the
    agent's to write, so the tamper check watches them."""
    exits: set[str] = set()
    for link in links:
        path = link
        for _ in range(hops):
            target = links[path]
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            if not is_system_path(path):
                exits.add(path)
                break
            if path not in links:
                break
    return tuple(sorted(exits))


def entrypoint_files(entrypoint: Iterable[str], workdir: str) -> tuple[str, ...]:
    """The files an image's entrypoint names (every word with a ``/`` that is not an option,
    relative ones taken from the image's working directory), which every restart runs again."""
    found: list[str] = []
    for word in entrypoint:
        if "/" in word and not word.startswith("-"):
            found.append(posixpath.normpath(posixpath.join(workdir or "/", word)))
    return tuple(dict.fromkeys(found))


def system_changes(changes: Iterable[tuple[str, str]], watched: Iterable[str] = ()) -> list[str]:
    """The changed paths that matter to a verifier, sorted, from the engine's ``(path, kind)`` list
    (kind ``A`` added, ``C`` changed, ``D`` deleted): every path under a system prefix or a
    ``watched`` path (``watched_paths``, an entrypoint), every top-level path added or deleted (a
    file planted at ``/``), without the engine's own paths and without directories listed only
    because something under them changed."""
    listed = {(path.rstrip("/") or "/"): kind for path, kind in changes}
    parents = {path.rsplit("/", 1)[0] or "/" for path in listed}
    prefixes = (*SYSTEM_PREFIXES, *(path.rstrip("/") for path in watched if path.startswith("/")))
    picked: list[str] = []
    for path, kind in listed.items():
        if path in ENGINE_PATHS or path in parents or path == "/":
            continue
        guarded = any(path == prefix or path.startswith(prefix + "/") for prefix in prefixes)
        top_level = path.count("/") == 1 and kind in ("A", "D")
        if guarded or top_level:
            picked.append(path)
    return sorted(picked)
