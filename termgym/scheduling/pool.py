"""Where a scheduler's trials run and what they run: rollout nodes with caps, and the task pool.

``NodePool`` hands out node slots (the least loaded node with room; first come, first served when
every node is full) and never lets a node run more than its cap. ``TaskPool`` draws every task once
per epoch, in a fresh random order each epoch (or in the given order), and ``peek`` says what the
next draw will be without drawing it.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from termgym.errors import ConfigError
from termgym.tasks import Task


@dataclass(frozen=True)
class Node:
    """A rollout node: where trials run, at most ``cap`` at once."""

    name: str
    cap: int

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise ConfigError(f"node {self.name}: the cap must be at least 1, got {self.cap}")


def make_nodes(caps: Sequence[int]) -> tuple[Node, ...]:
    """Nodes ``node-0``, ``node-1``... with the given caps."""
    if not caps:
        raise ConfigError("at least one node is needed")
    return tuple(Node(f"node-{i}", cap) for i, cap in enumerate(caps))


def cluster_nodes(
    address: str, backend: str, *, cpus_per_sandbox: float = 1.0, node_cap: int | None = None
) -> tuple[tuple[Node, ...], Callable[[str], bool]]:
    """The alive nodes of the Ray cluster at ``address`` as the scheduler's nodes (each with its own
    cap: its CPUs / ``cpus_per_sandbox``, or ``node_cap``), and whether a node takes trials now;
    joins the cluster (``termgym.sandboxes.ray.cluster.connect``)."""
    from termgym.sandboxes.ray.cluster import connect

    cluster = connect(address, backend, cpus_per_sandbox=cpus_per_sandbox, node_cap=node_cap)
    return tuple(Node(node.name, node.cap) for node in cluster.list() if not node.down), cluster.up


def pick_node(busy: Sequence[int], caps: Sequence[int]) -> int | None:
    """The node with room whose load (busy / cap) is lowest, the first on ties; None when all are full."""
    open_nodes = [i for i in range(len(caps)) if busy[i] < caps[i]]
    return min(open_nodes, key=lambda i: (busy[i] / caps[i], i)) if open_nodes else None


class NodePool:
    """Hands out node slots; when every node is full, trials wait first come, first served. With
    ``is_up`` (a Ray cluster's liveness), a node that is down takes no trial until it is up again;
    waiters are then re-examined every ``poll`` seconds as well as on each release."""

    def __init__(self, nodes: Sequence[Node], *, is_up: Callable[[str], bool] | None = None, poll: float = 1.0) -> None:
        self.nodes = tuple(nodes)
        self.busy = [0] * len(self.nodes)
        self.peak = [0] * len(self.nodes)  # the most ever running at once on each node
        self._index = {node.name: i for i, node in enumerate(self.nodes)}
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._is_up, self._poll = is_up, poll
        self._poller: asyncio.Task[None] | None = None

    async def acquire(self) -> Node:
        if not self._waiters:
            index = self._pick()
            if index is not None:
                self._take(index)
                return self.nodes[index]
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._is_up is not None and (self._poller is None or self._poller.done()):
            self._poller = asyncio.create_task(self._watch(), name="node pool: nodes back up")
        try:
            return self.nodes[await waiter]
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # a slot was handed over as we left: pass it on
                self.release(self.nodes[waiter.result()])
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self, node: Node) -> None:
        self.busy[self._index[node.name]] -= 1
        self._dispatch()

    def _pick(self) -> int | None:
        """The node for the next trial (``pick_node`` over the nodes that are up), or None."""
        caps = [node.cap if self._is_up is None or self._is_up(node.name) else 0 for node in self.nodes]
        return pick_node(self.busy, caps)

    def _dispatch(self) -> None:
        """Hand free slots to the waiters, in their order."""
        while self._waiters:
            index = self._pick()
            if index is None:
                return
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._take(index)
                waiter.set_result(index)

    async def _watch(self) -> None:
        while self._waiters:
            await asyncio.sleep(self._poll)
            self._dispatch()

    def _take(self, index: int) -> None:
        self.busy[index] += 1
        self.peak[index] = max(self.peak[index], self.busy[index])


class TaskPool:
    """Draws tasks to launch: every task once per epoch, in a fresh random order each epoch
    (``shuffle=False``: in the given order, so ``termgym run`` runs exactly what it was given)."""

    def __init__(self, tasks: Sequence[Task], *, shuffle: bool = True, seed: int = 0) -> None:
        if not tasks:
            raise ConfigError("the task pool is empty")
        self.tasks = list(tasks)
        self.shuffle = shuffle
        self._rng = random.Random(seed)
        self._order: list[Task] = []
        self._next = 0
        self.epochs = 0

    def peek(self, n: int) -> list[Task]:
        """What ``draw(n)`` would return now, without drawing it (a subclass's ``draw`` and its
        counters included: every attribute is as it was)."""
        attributes, rng = dict(self.__dict__), self._rng.getstate()
        try:
            return self.draw(n)
        finally:
            self.__dict__.update(attributes)
            self._rng.setstate(rng)

    def draw(self, n: int) -> list[Task]:
        drawn = []
        for _ in range(n):
            if self._next == len(self._order):
                self._order = list(self.tasks)
                if self.shuffle:
                    self._rng.shuffle(self._order)
                self._next, self.epochs = 0, self.epochs + 1
            drawn.append(self._order[self._next])
            self._next += 1
        return drawn
