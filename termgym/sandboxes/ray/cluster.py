"""A Ray cluster as where sandboxes run: its alive nodes, one ``SandboxHost`` actor pinned to each, and
a sandbox factory that places each trial's sandbox on a node.

``connect(address, backend)`` joins the cluster (``ray://HOST:PORT``, ``HOST:PORT``, or ``ray``: the
``RAY_ADDRESS`` variable, else a cluster started on this machine with ``ray start``; within a bounded
wait, ``termgym.sandboxes.ray.join``) and returns the
process's one ``Cluster`` for that backend. Its nodes are the cluster's alive nodes, each with a
sandbox capacity: the node's CPUs divided by ``cpus_per_sandbox`` (at least 1), or ``node_cap``.
A sandbox goes to the node the scheduler placed its trial on (``termgym.sandboxes.placement``),
else to the least loaded node that is up. A node is down once a call to it failed because it is
gone, or when Ray no longer reports it alive; it is up again when Ray reports it alive and its
actor answers (``watch``, every ``WATCH_SECONDS``).

Files: a task's environment files (its build context, Dockerfile and compose file) travel to a node
once per content hash (``ClusterNode.ship``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from termgym.aio import cancel_and_wait
from termgym.errors import ConfigError, SandboxGone
from termgym.sandboxes.base import BackendHooks, SandboxSpec
from termgym.sandboxes.placement import current_node
from termgym.sandboxes.ray.exposure import FIREWALLED_VARIABLE
from termgym.sandboxes.ray.host import SandboxHost
from termgym.sandboxes.ray.join import join
from termgym.sandboxes.ray.node import ClusterNode, forget_packed, remote
from termgym.sandboxes.ray.remote import RemoteSandbox

WATCH_SECONDS = 2.0  # how often the cluster's liveness is read
CLUSTER_BACKENDS = ("local", "docker")


class Cluster:
    """The cluster's nodes for one backend, and the factory of ``RemoteSandbox``es on them."""

    def __init__(self, backend: str, *, cpus_per_sandbox: float = 1.0, node_cap: int | None = None) -> None:
        if backend not in CLUSTER_BACKENDS:
            raise ConfigError(f"--cluster runs the {' or '.join(CLUSTER_BACKENDS)} backend on its nodes, not {backend}")
        if cpus_per_sandbox <= 0 or (node_cap is not None and node_cap < 1):
            raise ConfigError("--cpus-per-sandbox must be positive and --node-cap at least 1")
        self.backend, self.cpus_per_sandbox, self.node_cap = backend, cpus_per_sandbox, node_cap
        self.nodes: dict[str, ClusterNode] = {}
        self.alive: set[str] = set()  # the node ids Ray reported alive at the last refresh
        self._watch: asyncio.Task[None] | None = None
        self.refresh()

    def refresh(self) -> list[ClusterNode]:
        """Read the alive nodes from Ray (``alive``): a new node gets an actor; a node Ray no longer
        reports alive is down. The nodes, in a stable order."""
        import ray

        alive = {node["NodeID"]: node for node in ray.nodes() if node.get("Alive")}
        self.alive = set(alive)
        for node_id, node in self.nodes.items():
            if node_id not in alive:
                node.down = True
        for node_id, info in alive.items():
            if node_id not in self.nodes:
                cpus = float((info.get("Resources") or {}).get("CPU", 1.0))
                cap = self.node_cap or max(1, int(cpus // self.cpus_per_sandbox))
                node = ClusterNode(node_id, str(info.get("NodeManagerAddress", "?")), cpus, cap, self.backend)
                node.actor = _host_actor(node_id, self.backend)
                self.nodes[node_id] = node
        return self.list()

    async def watch(self) -> None:
        """Every ``WATCH_SECONDS``: nodes Ray no longer reports alive go down; a node that is down
        but alive (its actor crashed and Ray restarted it: the new one removed what the old one
        left) comes back up once its actor answers."""
        while True:
            try:
                await asyncio.to_thread(self.refresh)
                alive = self.alive
            except Exception:  # Ray's control plane did not answer: the nodes stay as they were
                alive = set()
            for node in self.list():
                if node.down and node.node_id in alive:
                    with contextlib.suppress(SandboxGone, TimeoutError):
                        await asyncio.wait_for(remote(node, node.actor.info.remote()), WATCH_SECONDS)
                        node.down = False
            await asyncio.sleep(WATCH_SECONDS)

    def list(self) -> list[ClusterNode]:
        return sorted(self.nodes.values(), key=lambda node: node.name)

    def up(self, name: str) -> bool:
        """Whether the node named ``name`` takes trials now."""
        return any(node.name == name and not node.down for node in self.nodes.values())

    def place(self) -> ClusterNode:
        """The node for the next sandbox: the scheduler's choice when it made one, else the least
        loaded node that is up; ``SandboxGone`` when that node is down or none is up."""
        wanted = current_node.get()
        nodes = [node for node in self.list() if not node.down]
        if wanted is not None:
            named = [node for node in self.nodes.values() if node.name == wanted]
            if named and not named[0].down:
                return named[0]
            if named:
                raise SandboxGone(f"node {wanted} is gone")
        if not nodes:
            raise SandboxGone("no node of the Ray cluster is alive")
        return min(nodes, key=lambda node: (node.busy / node.cap, node.name))

    def place_watched(self) -> ClusterNode:
        """``place``, the liveness watch started with the first sandbox."""
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self.watch(), name="ray cluster: node liveness")
        return self.place()

    async def gc(self) -> list[str]:
        """``termgym gc --cluster``: on every alive node, its actor stops its sandboxes and removes
        what earlier ones left. One line per node."""
        lines = []
        for node in self.refresh():
            if node.down:
                continue
            removed = await remote(node, node.actor.gc.remote())
            lines.append(f"{node.name}: removed {removed} leftover {self.backend} sandbox(es)")
        return lines


class ClusterSandbox(RemoteSandbox):
    """The registry's ``ray`` sandbox (``create_sandbox(backend, spec, cluster=address)``): one of
    ``backend`` on the node the cluster at ``address`` places it on (joined on first use,
    ``connect``), counted in its node's load from ``start`` to ``stop``."""

    _counted = False

    def __init__(self, spec: SandboxSpec, *, backend: str, address: str) -> None:
        super().__init__(spec, connect(address, backend).place_watched())

    async def start(self) -> None:
        self.node.busy += 1
        self._counted = True
        await super().start()

    async def stop(self) -> None:
        if self._counted:
            self._counted = False
            self.node.busy -= 1
        await super().stop()


def _host_actor(node_id: str, backend: str) -> Any:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor_class = ray.remote(SandboxHost)
    return actor_class.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        num_cpus=0,
        max_restarts=-1,
        max_concurrency=1000,
        enable_task_events=False,  # no per-call record for Ray's state API: about 0.05 ms a call here
    ).remote(
        node_id,
        backend,
        os.environ.get("TERMGYM_SANDBOX_DIR"),
        os.environ.get("TERMGYM_ENV_CACHE_DIR"),
        ports_firewalled=os.environ.get(FIREWALLED_VARIABLE) == "1",
    )


_clusters: dict[tuple[str, str], Cluster] = {}


def connect(address: str, backend: str, *, cpus_per_sandbox: float = 1.0, node_cap: int | None = None) -> Cluster:
    """The process's ``Cluster`` for ``backend`` on the Ray cluster at ``address`` (joined on first
    use, ``termgym.sandboxes.ray.join``): ``BackendUnavailable`` in one line when Ray is not
    installed, ``ConfigError`` when no cluster answers there within the connect timeout."""
    key = (address, backend)
    if key not in _clusters:
        join(address)
        _clusters[key] = Cluster(backend, cpus_per_sandbox=cpus_per_sandbox, node_cap=node_cap)
    return _clusters[key]


async def close_clusters() -> None:
    """Leave the cluster: every node's actor ends (the sandboxes of the trials still running with it)."""
    if not _clusters:
        return
    import ray

    clusters = list(_clusters.values())
    _clusters.clear()
    forget_packed()
    for cluster in clusters:
        if cluster._watch is not None:
            await cancel_and_wait(cluster._watch)
        for node in cluster.list():
            if not node.down:
                with contextlib.suppress(SandboxGone):
                    await remote(node, node.actor.leave.remote())
    ray.shutdown()


HOOKS = BackendHooks(close_shared=close_clusters)  # close_backends (a run's end) leaves the cluster
