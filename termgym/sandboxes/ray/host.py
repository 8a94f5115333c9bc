"""The node's side of a Ray cluster: one ``SandboxHost`` actor per node owns that node's sandboxes.

The actor runs the sandbox contract (``termgym.sandboxes.base.Sandbox``) of its backend (``local``
or ``docker``) for the driver's ``RemoteSandbox``es, by sandbox id, and the process channels they
open, by channel id. Commands and files stay on the node; the agent loop, the scheduler and
verification's orchestration stay on the driver.

A sandbox gets no network on a node where a Ray process listens on an address other than loopback
(``termgym.sandboxes.ray.exposure``: a container on the Docker bridge could reach Ray's
unauthenticated API and run code on the node; an embedded sandbox's user-mode network reaches none
of its own node's addresses, but the other nodes' Ray listens off loopback too), unless
``TERMGYM_RAY_PORTS_FIREWALLED=1`` (on the driver or the node) says sandboxes are firewalled from
Ray's ports; the refusal is one warning line in the trial's record (``BRIDGE_WARNING``).

Each actor keeps its sandboxes apart from other actors on the same host (several Ray nodes on one
machine, as the tests run them): the embedded backend's state directory is one per node
(``<root>/node-<id>``), and Docker containers carry the label ``termgym.node=<id>``. Its start
removes what an earlier actor of its node left (a driver killed, an actor restarted): that node's
``gc``. A task's environment files come from the driver once per content hash and are cached on the
node (``ray-files`` beside its prepared-environment cache), so that cache works per node.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from termgym.errors import SandboxGone
from termgym.sandboxes.base import Sandbox, SandboxSpec
from termgym.sandboxes.ray.calls import Call, T
from termgym.sandboxes.ray.exposure import FIREWALLED_VARIABLE, exposed_ray_listeners
from termgym.sandboxes.ray.relay import Batch, OutputRelay

NODE_LABEL = "termgym.node"
FILES_DIR = "ray-files"  # under the node's prepared-environment cache: the task files shipped to it, by hash
BRIDGE_WARNING = (
    "no network for this sandbox: Ray on node {node} listens where a sandbox with network can reach it "
    "({listeners}), and Ray's API runs code for whoever reaches it; bind Ray to a private address and drop "
    "sandboxes' traffic to Ray's ports, then set {variable}=1 (docs/guides/cluster.md)"
)


class SandboxHost:
    """The sandboxes of one node (wrapped as a Ray actor by ``termgym.sandboxes.ray.cluster``)."""

    def __init__(
        self,
        node_id: str,
        backend: str,
        root: str | None = None,
        cache: str | None = None,
        *,
        ports_firewalled: bool = False,
    ) -> None:
        from termgym.sandboxes.local.env_cache import cache_root
        from termgym.sandboxes.local.host import sandbox_root_dir

        self.node_id, self.backend = node_id, backend
        # the driver's word, or the node's own, that the Docker bridge cannot reach Ray's ports
        self.ports_firewalled = ports_firewalled or os.environ.get(FIREWALLED_VARIABLE) == "1"
        self.exposed: list[str] | None = None  # Ray's listeners off loopback, read at the first need
        base = Path(root) if root else sandbox_root_dir()
        # the driver's cache, else the host's (shared by the nodes on one host; it is safe to share)
        os.environ["TERMGYM_ENV_CACHE_DIR"] = cache or os.environ.get("TERMGYM_ENV_CACHE_DIR") or str(base / "cache")
        self.state = base / f"node-{node_id[:12]}"
        os.environ["TERMGYM_SANDBOX_DIR"] = str(self.state)  # this actor's process only
        self.files = cache_root() / FILES_DIR
        self.sandboxes: dict[str, Sandbox] = {}
        self.channels: dict[str, OutputRelay] = {}
        self.collected = self._collect()

    # -- the node ---------------------------------------------------------------------------------

    def _collect(self) -> int:
        """Remove what earlier actors of this node left, and what nodes Ray no longer reports alive
        left on this host: their sandbox directories (with their processes and cgroups) or their
        labelled containers; then their directories, when empty. How many sandboxes went."""
        dead = _dead_nodes(self.node_id)
        if self.backend == "docker":
            from termgym.sandboxes.docker.containers import collect_garbage, node_labels

            labels = [self.node_id, *(node for node in node_labels() if dead(node))]
            return sum(collect_garbage(label=f"{NODE_LABEL}={node}")[0] for node in labels)
        from termgym.sandboxes.local.leftovers import collect_garbage as collect_local

        removed = 0
        for directory in [self.state, *self.state.parent.glob("node-*")]:
            if directory != self.state and not dead(directory.name.removeprefix("node-")):
                continue
            if directory.is_dir():
                removed += collect_local(directory)
            with contextlib.suppress(OSError):
                directory.rmdir()
        return removed

    async def info(self) -> dict[str, Any]:
        """Who this actor is: its node, backend, state directory, live sandboxes and what its start removed."""
        return {
            "node_id": self.node_id,
            "backend": self.backend,
            "state": str(self.state),
            "sandboxes": len(self.sandboxes),
            "collected": self.collected,
            "pid": os.getpid(),
        }

    async def gc(self) -> int:
        """``termgym gc --cluster`` on this node: stop this actor's sandboxes, then remove leftovers
        (with what its start removed: how many in all)."""
        for sandbox_id in list(self.sandboxes):
            await self.stop(sandbox_id)
        removed, self.collected = self.collected + self._collect(), 0
        return removed

    async def leave(self) -> None:
        """The driver is leaving: stop this actor's sandboxes and remove its directory when empty."""
        for sandbox_id in list(self.sandboxes):
            await self.stop(sandbox_id)
        with contextlib.suppress(OSError):
            self.state.rmdir()

    def network_refusal(self) -> str | None:
        """Why a sandbox of this node gets no network (one line), or None when it may have it: on a
        node whose Ray listens off loopback (where the cluster's other nodes listen too), not
        firewalled."""
        if self.ports_firewalled:
            return None
        if self.exposed is None:
            self.exposed = exposed_ray_listeners()
        if not self.exposed:
            return None
        listeners = ", ".join(self.exposed[:3]) + (
            f" and {len(self.exposed) - 3} more" if len(self.exposed) > 3 else ""
        )
        return BRIDGE_WARNING.format(node=self.node_id[:12], listeners=listeners, variable=FIREWALLED_VARIABLE)

    async def has_files(self, digest: str) -> bool:
        return (self.files / digest / ".complete").exists()

    async def put_files(self, digest: str, archive: bytes) -> None:
        """Unpack a task's environment files (a tar the driver made) under their content hash."""
        target = self.files / digest
        if (target / ".complete").exists():
            return
        staging = target.with_name(f".{digest}.{uuid.uuid4().hex[:8]}")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(staging, filter="data")
        (staging / ".complete").touch()
        try:
            staging.rename(target)
        except OSError:  # another call put them first
            import shutil

            shutil.rmtree(staging, ignore_errors=True)

    # -- sandboxes --------------------------------------------------------------------------------

    async def start(self, spec: SandboxSpec, digest: str | None) -> tuple[str, dict[str, Any]]:
        """Create and start a sandbox for ``spec`` (its files' paths rewritten to the node's copy
        under ``digest``); its id and what the driver mirrors (env, workdir, warnings, image)."""
        from termgym.sandboxes import create_sandbox

        self.state.mkdir(parents=True, exist_ok=True)
        spec = self._local_spec(spec, digest)
        refusal = self.network_refusal() if spec.network else None
        if refusal is not None:
            spec = replace(spec, network=False)
        sandbox = create_sandbox(self.backend, spec)
        sandbox_id = uuid.uuid4().hex
        self.sandboxes[sandbox_id] = sandbox
        try:
            await sandbox.start()
        except BaseException:
            self.sandboxes.pop(sandbox_id, None)
            await sandbox.stop()
            raise
        if refusal is not None:
            sandbox.warnings.append(refusal)
        return sandbox_id, self._mirror(sandbox)

    def _local_spec(self, spec: SandboxSpec, digest: str | None) -> SandboxSpec:
        labels = {**spec.labels, NODE_LABEL: self.node_id}
        if digest is None:
            return replace(spec, labels=labels)
        files = self.files / digest

        def here(name: str) -> Path | None:
            path = files / name
            return path if path.exists() else None

        return replace(
            spec,
            labels=labels,
            context_dir=here("context"),
            dockerfile=here("Dockerfile"),
            compose_file=here("compose.yaml"),
        )

    @staticmethod
    def _mirror(sandbox: Sandbox) -> dict[str, Any]:
        return {
            "env": dict(sandbox.env),
            "workdir": sandbox.workdir,
            "warnings": list(sandbox.warnings),
            "image": dict(sandbox.image),
            "untraced_loads": list(sandbox.untraced_loads),
            "default_user": sandbox.default_user,
        }

    def _sandbox(self, sandbox_id: str) -> Sandbox:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise SandboxGone(f"no sandbox {sandbox_id[:12]} on node {self.node_id[:12]} (its actor restarted?)")
        return sandbox

    async def stop(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        for channel_id in [c for c in self.channels if c.startswith(sandbox_id)]:
            await self.channels.pop(channel_id).close()
        if sandbox is not None:
            await sandbox.stop()

    async def call(self, sandbox_id: str, call: Call[T]) -> T:
        """One operation of the contract on a sandbox of this node (``termgym.sandboxes.ray.calls``)."""
        return await call.apply(self._sandbox(sandbox_id), self)

    # -- process channels -------------------------------------------------------------------------

    async def open_process(
        self, sandbox_id: str, user: str | None, argv: Sequence[str], env: Mapping[str, str], cwd: str
    ) -> str:
        channel = await self._sandbox(sandbox_id).open_process(argv, env=env, cwd=cwd, user=user)
        channel_id = f"{sandbox_id}:{uuid.uuid4().hex[:12]}"
        self.channels[channel_id] = OutputRelay(channel)
        return channel_id

    def _channel(self, channel_id: str) -> OutputRelay:
        relay = self.channels.get(channel_id)
        if relay is None:
            raise SandboxGone(f"no process channel {channel_id} on node {self.node_id[:12]}")
        return relay

    async def write(self, channel_id: str, data: bytes) -> None:
        await self._channel(channel_id).channel.write(data)

    async def read(self, channel_id: str) -> Batch:
        return await self._channel(channel_id).read()

    async def exchange(self, channel_id: str, data: bytes, end: bytes) -> Batch | None:
        return await self._channel(channel_id).exchange(data, end)

    async def wait(self, channel_id: str) -> int | None:
        return await self._channel(channel_id).channel.wait()

    async def close(self, channel_id: str) -> None:
        relay = self.channels.pop(channel_id, None)
        if relay is not None:
            await relay.close()


def _dead_nodes(own: str) -> Callable[[str], bool]:
    """Whether a node id (or its first 12 characters, as directory names hold it) is one Ray no
    longer reports alive; outside a Ray worker (the in-process tests) every other node counts as alive."""
    try:
        import ray

        alive = [node["NodeID"] for node in ray.nodes() if node.get("Alive")] if ray.is_initialized() else None
    except Exception:
        alive = None
    if alive is None:
        return lambda node: False
    return lambda node: not node.startswith(own[: len(node)]) and not any(a.startswith(node) for a in alive)
