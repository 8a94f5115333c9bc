"""An image's ``USER`` in an embedded sandbox: resolved as Docker's runtime resolves it (runc's
``GetExecUser``) against the root's ``/etc/passwd`` and ``/etc/group``, read once before the agent's
first command (a later change of those files changes nobody's uid).

``name``, ``uid``, ``name:group`` or ``uid:gid``; a name the passwd file lacks is an error, a uid it
lacks runs as that uid with group 0; the group is the user's own unless one is named (a group name
the group file lacks is an error); the supplementary groups are those of the group file that list
the user's name. Ids are those the sandbox's user namespace maps (``USERS``). Pure: ``resolve_user``.
"""

from __future__ import annotations

from termgym.errors import ConfigError
from termgym.sandboxes.local.commands import RunAs
from termgym.sandboxes.local.subids import MAPPED_IDS

USERS = MAPPED_IDS + 1  # ids a sandbox's user namespace maps: 0 (its root) to 65535, as Docker's userns-remap
ROOT_USERS = ("", "root", "0", "0:0", "root:root", "root:0", "0:root")  # the sandbox's root: nothing to change
# Prints both files, each line as it is, with the shell's builtins only (an image may lack cat).
READ_SCRIPT = (
    'for f in /etc/passwd /etc/group; do echo "== $f"; [ -r "$f" ] || continue; '
    'while IFS= read -r l || [ -n "$l" ]; do printf "%s\\n" "$l"; done < "$f"; done'
)


def split_files(text: str) -> tuple[str, str]:
    """``READ_SCRIPT``'s output as (passwd, group)."""
    files: dict[str, list[str]] = {"/etc/passwd": [], "/etc/group": []}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = files.get(line[3:])
        elif current is not None:
            current.append(line)
    return "\n".join(files["/etc/passwd"]), "\n".join(files["/etc/group"])


def _entries(text: str, fields: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        parts = line.split(":")
        if line.strip() and not line.startswith("#") and len(parts) >= fields:
            rows.append(parts)
    return rows


def _id(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) < USERS else None


def resolve_user(spec: str, passwd: str, group: str) -> RunAs:
    """``spec`` (a ``USER``) as the ids it runs as, from the texts of ``/etc/passwd`` and ``/etc/group``;
    ``ConfigError`` (one line, in Docker's words; the trial's ``invalid_task``) for a name neither file
    has, or an id past ``USERS``."""
    user, _, group_spec = spec.partition(":")
    found = next((row for row in _entries(passwd, 4) if user in (row[0], row[2])), None)
    if found is not None and _id(found[2]) is not None and _id(found[3]) is not None:
        uid, gid, name = int(found[2]), int(found[3]), found[0]
    elif user.isdigit():
        uid, gid, name = int(user), 0, None
    else:
        raise ConfigError(f"unable to find user {user}: no matching entries in passwd file")
    groups = _entries(group, 3)
    if group_spec:
        named = next((row for row in groups if group_spec in (row[0], row[2])), None)
        if named is not None and _id(named[2]) is not None:
            gid = int(named[2])
        elif group_spec.isdigit():
            gid = int(group_spec)
        else:
            raise ConfigError(f"unable to find group {group_spec}: no matching entries in group file")
    if _id(str(uid)) is None or _id(str(gid)) is None:
        raise ConfigError(f"user {spec} is uid {uid}, gid {gid}: the embedded backend maps ids below {USERS} only")
    members = {int(row[2]) for row in groups if len(row) > 3 and name in row[3].split(",") and _id(row[2]) is not None}
    return RunAs(uid, gid, tuple(sorted(members)) if name is not None else ())
