"""The embedded backend: a bubblewrap sandbox on this machine, no daemon: the task's image or the host's system.

Root inside is never root outside (an unprivileged host uid, Docker's default capabilities, a guard
in front of every process); memory, processes and CPU are held by cgroups and storage by a sized
file system, or the record says which limit could not be; the kernel ends every process of the
sandbox when its keeper or termgym dies, and the kill step leaves none. An image's ``ENTRYPOINT``
(or its Dockerfile's) runs as on Docker, and so does its ``USER`` when termgym runs as root (``users``);
it does not filter system calls beyond the keyring calls.
docs/guides/backends.md says how, and what each module of the package does.
"""

from __future__ import annotations

from termgym.sandboxes.base import BackendHooks
from termgym.sandboxes.local import pool
from termgym.sandboxes.local.host import sandbox_root_dir
from termgym.sandboxes.local.leftovers import attach, close_shared, collect_garbage, preflight, remove_leftovers
from termgym.sandboxes.local.sandbox import LocalSandbox, pooled_sandbox

HOOKS = BackendHooks(
    preflight=preflight,
    remove_leftovers=remove_leftovers,
    close_shared=close_shared,
    attach=attach,
    prewarm=lambda specs, count: pool.prewarm(specs, pooled_sandbox, count),
    warm_pool_on=pool.warm_pool_on,
)

__all__ = ["HOOKS", "LocalSandbox", "collect_garbage", "sandbox_root_dir"]
