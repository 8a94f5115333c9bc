"""The file ``termgym gateway --out DIR`` writes a session's calls to: ``DIR/<name>.json``, its name
made from the session id (pure functions, no I/O).

Guaranteed by ``session_file_name``:

* **Injective.** Two different session ids never get the same name, whatever they hold (``/``,
  ``_``, ``%``, ``..``, unicode, case, length), also on a file system that ignores case.
* **Inside the directory.** A name is one path component: never empty, ``.`` or ``..``, never
  holding ``/`` or NUL, at most ``MAX_NAME`` bytes.
* **Readable.** An id of lowercase ASCII letters, digits, ``-``, ``_`` and ``.`` (not first) is its
  own name: ``run-0001`` is ``run-0001.json``. Any other character is percent-encoded as its UTF-8
  bytes (``run/0001`` is ``run%2F0001.json``, ``Run`` is ``%52un.json``), so ``session_id_of``
  reads the id back. An id whose encoding is too long keeps its first ``LONG_PREFIX`` encoded
  characters, then ``~`` and the SHA-256 of the id (a ``~`` is encoded everywhere else, so such a
  name is never another id's short name, and two long ids share one only by a SHA-256 collision);
  the file's ``session`` field holds the id in full, as in every file.

Why: names made by replacing characters (``run/0001`` and ``run_0001`` both ``run_0001.json``) or
cut to a length sent two sessions into one file, the later one replacing the other's calls.
"""

from __future__ import annotations

import hashlib
import string
from urllib.parse import unquote

SUFFIX = ".json"
MAX_NAME = 200  # bytes, under NAME_MAX (255) of common file systems
LONG_PREFIX = 120  # encoded characters of a long id kept before its hash
_KEPT = frozenset(string.ascii_lowercase + string.digits + "-_.")


def session_file_name(session_id: str) -> str:
    """The name of ``session_id``'s file under ``--out`` (module docstring); ``ValueError`` for an
    empty id (the gateway opens none)."""
    if not session_id:
        raise ValueError("a gateway session id is never empty")
    encoded = "".join(char if char in _KEPT else _escape(char) for char in session_id)
    if encoded.startswith("."):  # no hidden file, never "." or ".."
        encoded = "%2E" + encoded[1:]
    if len(encoded) + len(SUFFIX) <= MAX_NAME:
        return encoded + SUFFIX
    cut = LONG_PREFIX
    while "%" in encoded[cut - 2 : cut]:  # never half an escape
        cut -= 1
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{encoded[:cut]}~{digest}{SUFFIX}"


def session_id_of(name: str) -> str | None:
    """The session id a file name of ``session_file_name`` stands for; None for a long id's name
    (its hash cannot be read back: read the file's ``session`` field) or a name it never makes."""
    if not name.endswith(SUFFIX) or "~" in name or name == SUFFIX:
        return None
    session_id = unquote(name[: -len(SUFFIX)], encoding="utf-8", errors="surrogatepass")
    return session_id if session_file_name(session_id) == name else None


def _escape(char: str) -> str:
    return "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
