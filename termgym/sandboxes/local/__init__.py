"""The embedded backend: a bubblewrap sandbox on this machine, no daemon: the task's image or the host's system.

What it covers:
- **An unprivileged sandbox.** Root inside is never root outside: when termgym runs as root, the
  sandbox's root is a dedicated unprivileged host uid (one of ``SANDBOX_UID_COUNT`` from
  ``SANDBOX_UID_BASE``, ``TERMGYM_SANDBOX_UID_BASE`` overrides); otherwise it is the user running
  termgym. The host's ``/usr`` and ``/etc`` are read-only binds that cannot be remounted (they are
  locked to the user namespace that made them), host files only root may read stay unreadable,
  ``/proc/sys`` is read-only, the root directory is read-only, and no nested user namespace can be
  made. Commands entered later get Docker's default capabilities in the sandbox's namespaces, not
  all of them, and every host program termgym runs is found by absolute path in root-owned system
  directories (``termgym.sandboxes.tools``). The same holds when termgym does not run as root.
- **Limits.** Memory (no swap), processes (``PIDS_LIMIT``) and CPU through cgroups
  (``termgym.sandboxes.limits``, v2 or v1); storage as a file system of the task's size holding
  every writable directory (``termgym.sandboxes.local.storage``; root only), else a per-file size limit.
  That file system and the overlay over a prepared environment or an image are mounted in the
  sandbox's own mount namespace, where its keepers start (``namespace``), never in the host's: the
  host's mount table, which every keeper started later copies, does not grow with the sandboxes alive.
  A limit that cannot be enforced here is a warning in the record, and so is a limit reached.
- **Private writable directories** for ``/app``, ``/tmp``, ``/root``, ``/home``, ``/opt``, ``/var``,
  ``/logs``, ``/tests``, ``/solution`` and every other top-level path the task's Dockerfile uses;
  fresh PID, network, IPC and UTS namespaces (a private loopback only; where the task asks for
  network, user-mode network through ``pasta`` that reaches nothing of the host's, ``network``), a 64 MB
  ``/dev/shm``. The sandbox is one long-lived namespace "keeper" process started with
  ``--die-with-parent``: when the termgym process dies, for whatever reason, the kernel kills every
  process in the sandbox. Every command enters the keeper's namespaces: as root, the guard itself
  does it (``setns`` of each, the keeper's root, Docker's capabilities, the exact environment), one
  program instead of ``nsenter``, ``setpriv`` and ``env``; without root, through those tools.
- **A guard in front of every process** (``commands.within_limits``): the keeper and every command
  start with descriptors 0, 1 and 2 only, whatever event loop spawned them (uvloop's ignores
  ``close_fds``), with no_new_privs, and refused the kernel's keyring calls by a seccomp filter
  (``syscall_filter``), so no sandbox reaches the session keyring termgym runs under.

The package: ``host`` (probes, where sandboxes live), ``commands`` (the keeper's and every
command's command lines), ``keeper`` (the keeper and its spare), ``home`` (the sandbox's directory
and storage), ``sandbox`` (``LocalSandbox``), ``kept`` and ``leftovers`` (``--keep``, ``termgym gc``
and ``attach``), and what only this backend uses: ``env_cache`` (prepared environments),
``prepare`` (the Dockerfile subset), ``storage``, ``mounts``, ``namespace``, ``host_files``, ``host_trees`` and
``syscall_filter`` (the seccomp program).

**Keeping a sandbox** (``--keep``, ``keep``) restarts its keeper without ``--die-with-parent``, in
a session of its own and no child of this process, so the sandbox outlives termgym; the agent's
processes end then (the files stay). ``kept.json`` in its host directory says how to enter it again
(``attach``: the keeper's pid and start time, against pid reuse, its cgroups, storage, environment);
``termgym gc`` removes kept sandboxes too, as it does those killed runs left.

Killing the agent's processes restarts the keeper: the kernel kills every process of a PID
namespace when its first process dies, so nothing survives, whatever it forked or however it
detached (with cgroups, their process list confirms it). The files stay, since they live outside.

What it does not cover: a seccomp filter beyond the keyring calls (the sandbox can make any other
system call its capabilities allow, so a kernel bug is an escape; use ``--backend docker``); an
image's ``USER``, ``ENTRYPOINT`` and ``CMD``. Over the host's
system, host files others may read (``/etc/passwd``, the host's programs) are visible, owned by
``nobody`` as the sandbox sees them.

**Task images** (``images``): the task's ``docker_image`` or ``FROM``, copied by skopeo and
unpacked by umoci once per digest, is the sandbox's whole root under an overlay whose upper layer
is the sandbox's storage; the keeper and what every command runs by (``timeout``; without root
``nsenter``, ``setpriv`` and ``env``) and the tracer run from the host's kit (``termgym.sandboxes.host_kit``), bound
read-only, never from that root; without root the overlay lives in a user and mount namespace of
the user's own (``holder``). ``termgym/base:bookworm`` (which the default aliases name for
Debian bookworm) is the host's ``/usr`` and ``/etc`` read-only with the writable roots above.
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
