"""Red team, the embedded backend: the kernel's keyrings of the host, as an agent in a sandbox
reaches for them.

termgym runs under a session keyring wherever its login made one (pam_keyinit, ``su -l``,
``runuser``, a systemd service), and every process inherits it, through ``bwrap`` and ``nsenter``
into every namespace. Each test here puts the process that starts the sandboxes under a new session
keyring of its own (``under_new_session_keyring``) holding a secret, as such a login would, and
attacks it with keyutils' ``keyctl`` (the host's ``/usr``, which the sandbox sees). Before the
seccomp filter (``termgym.sandboxes.local.syscall_filter``) the agent printed the secret, added
keys to the host's keyring, and a key one trial added was there in the next.
"""

from __future__ import annotations

import asyncio
import ctypes
import secrets
import shutil
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from termgym.sandboxes.local.syscall_filter import this_machine
from tests.redteam.test_host import run_in_sandbox

pytestmark = [pytest.mark.redteam]
T = TypeVar("T")

KEYCTL_GET_KEYRING_ID, KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_UNLINK, KEYCTL_READ = 0, 1, 9, 11
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -3, -4
ADD_KEY, _, KEYCTL = this_machine().abis[0].refused
_libc = ctypes.CDLL(None, use_errno=True)


def _syscall(number: int, *args: int | bytes) -> int:
    values = [ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    result = _libc.syscall(ctypes.c_long(number), *values)
    if result == -1:
        raise OSError(ctypes.get_errno(), f"system call {number} failed")
    return result


def add_key(description: str, payload: bytes, keyring: int) -> int:
    return _syscall(ADD_KEY, b"user", description.encode(), payload, len(payload), keyring)


def keyring_id(keyring: int) -> int:
    return _syscall(KEYCTL, KEYCTL_GET_KEYRING_ID, keyring, 0)


def keys_in(keyring: int) -> list[int]:
    """The serials a keyring links, as the host sees them."""
    buffer = ctypes.create_string_buffer(4096)
    size = _syscall(KEYCTL, KEYCTL_READ, keyring, ctypes.addressof(buffer), len(buffer))
    return list(struct.unpack(f"={size // 4}i", buffer.raw[:size]))


def under_new_session_keyring(work: Callable[[], T]) -> T:
    """``work()`` in a thread that joined a new anonymous session keyring (credentials, keyrings
    among them, are a thread's own): what it starts inherits that keyring, as everything termgym
    starts under a login's inherits the login's. Nothing else of this process sees it."""
    join = lambda: _syscall(KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, 0)  # noqa: E731
    with ThreadPoolExecutor(1, initializer=join) as thread:
        return thread.submit(work).result()


@pytest.fixture(autouse=True)
def keyutils() -> None:
    if shutil.which("keyctl") is None:  # without it every attack below fails for the wrong reason
        pytest.fail("keyutils is missing (scripts/bootstrap.sh installs it): apt-get install keyutils")


def test_the_hosts_keys_cannot_be_read(task_dir: Path, no_leaks) -> None:
    secret = secrets.token_hex(16)

    def attack() -> tuple[list[str], list[int]]:
        in_session = add_key("termgym-canary", secret.encode(), KEY_SPEC_SESSION_KEYRING)
        in_user = add_key("termgym-canary-user", secret.encode(), KEY_SPEC_USER_KEYRING)
        try:
            observations = asyncio.run(
                run_in_sandbox(
                    task_dir,
                    f"keyctl print {in_session}; keyctl print {in_user}",
                    "keyctl show @s; keyctl pipe %user:termgym-canary; keyctl pipe %user:termgym-canary-user",
                    "keyctl request user termgym-canary | xargs keyctl print",
                )
            )
        finally:
            _syscall(KEYCTL, KEYCTL_UNLINK, in_user, KEY_SPEC_USER_KEYRING)  # the user keyring outlives the test
        return observations, keys_in(KEY_SPEC_SESSION_KEYRING)

    observations, session = under_new_session_keyring(attack)
    assert len(session) == 1  # the secret was in reach all along, and still is
    assert not any(secret in o for o in observations), observations
    assert "Operation not permitted" in observations[0], observations  # refused, as Docker refuses it


def test_no_key_can_be_added_to_the_hosts_keyrings(task_dir: Path, no_leaks) -> None:
    def attack() -> tuple[list[int], list[int], list[str]]:
        add_key("termgym-canary", b"host", KEY_SPEC_SESSION_KEYRING)
        before = keys_in(KEY_SPEC_SESSION_KEYRING)
        session = keyring_id(KEY_SPEC_SESSION_KEYRING)
        observations = asyncio.run(
            run_in_sandbox(
                task_dir,
                f"keyctl add user planted x @s; keyctl add user planted x {session}; keyctl newring nest @s",
                f"keyctl padd user planted {session} </dev/null; keyctl link @u {session}",
            )
        )
        return before, keys_in(KEY_SPEC_SESSION_KEYRING), observations

    before, after, observations = under_new_session_keyring(attack)
    assert after == before, observations


def test_a_key_one_sandbox_adds_is_not_in_the_next(task_dir: Path, no_leaks) -> None:
    marker = f"carried-{secrets.token_hex(6)}"

    def attack() -> list[str]:
        asyncio.run(
            run_in_sandbox(
                task_dir,
                f"keyctl add user {marker} x @s; keyctl add user {marker} x @u",
                f"keyctl newring {marker} @s; keyctl setperm %keyring:{marker} 0x3f3f3f3f",
            )
        )
        return asyncio.run(
            run_in_sandbox(
                task_dir,
                "keyctl show @s; keyctl show @u; cat /proc/keys",
                f"keyctl search @s user {marker}; keyctl request user {marker}",
            )
        )

    observations = under_new_session_keyring(attack)
    assert not any(marker in o for o in observations), observations
