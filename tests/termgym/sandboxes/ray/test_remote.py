"""The remote sandbox's contract without a cluster: ``RemoteSandbox`` forwarding to a ``SandboxHost``
in this process through an adapter that has the actor handle's shape (``handle.method.remote(...)``
awaitable), so every call crosses the same boundary as over Ray, only without the network. Plus the
pure parts: the files' content hash, the node pool's liveness, the placement."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from termgym.agents import OracleAgent
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.errors import SandboxError, SandboxGone
from termgym.sandboxes.base import Command, ProcessChannel, SandboxSpec
from termgym.sandboxes.placement import current_node, placed_on
from termgym.sandboxes.ray import relay
from termgym.sandboxes.ray.calls import Run
from termgym.sandboxes.ray.host import SandboxHost
from termgym.sandboxes.ray.node import ClusterNode, forget_packed, pack_files
from termgym.sandboxes.ray.relay import Batches, OutputRelay
from termgym.sandboxes.ray.remote import RemoteChannel, RemoteSandbox
from termgym.scheduling.pool import Node, NodePool
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import sandbox_processes


class _Method:
    def __init__(self, actor: InProcessActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self.actor.calls.append(self.name)
        return asyncio.ensure_future(getattr(self.actor.host, self.name)(*args, **kwargs))


class InProcessActor:
    """An actor handle's shape over a ``SandboxHost`` in this process; ``calls`` names each call made."""

    def __init__(self, host: SandboxHost) -> None:
        self.host = host
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


@pytest.fixture
async def node(sandbox_dir: Path, no_leaks):
    """A node whose actor lives in this process; it leaves (as at a run's end) before the leak check."""
    host = SandboxHost("a1b2c3d4e5f6a7b8", "local", str(sandbox_dir))
    yield ClusterNode("a1b2c3d4e5f6a7b8", "127.0.0.1", 2.0, 2, "local", actor=InProcessActor(host))
    await host.leave()


def remote_factory(node: ClusterNode):
    from termgym.episode.spec import options_sandbox_spec

    return lambda task, options: RemoteSandbox(options_sandbox_spec(task, options), node)


async def test_a_whole_trial_runs_through_the_remote_contract_and_records_its_node(task_dir, node):
    record = await run_trial(load_task(task_dir), OracleAgent(), EnvOptions(), sandbox_factory=remote_factory(node))
    assert record.error is None and record.resolved and record.passed == 2, record
    assert record.node == node.name == "ray-127.0.0.1-a1b2c3d4"
    host: SandboxHost = node.actor.host
    assert host.sandboxes == {} and host.channels == {}  # stopped, its shell's channel closed
    assert not list(host.state.glob("tg-*"))


async def test_files_go_once_per_content_hash_and_the_node_builds_from_its_copy(task_dir, node):
    task = load_task(task_dir)
    factory = remote_factory(node)
    for _ in range(2):
        record = await run_trial(task, OracleAgent(), EnvOptions(), sandbox_factory=factory)
        assert record.resolved
    host: SandboxHost = node.actor.host
    (digest,) = node._shipped
    assert (host.files / digest / "context").is_dir() and (host.files / digest / "Dockerfile").is_file()


async def test_a_node_that_is_gone_is_sandbox_gone_and_marked_down(task_dir, node):
    sandbox = RemoteSandbox(SandboxSpec(name="x", context_dir=None, dockerfile=None), node)
    with pytest.raises(SandboxGone, match="was not started"):
        await sandbox.exec(["true"], timeout=5)
    host: SandboxHost = node.actor.host
    with pytest.raises(SandboxGone, match="no sandbox"):
        await host.call("nope", Run(Command(["true"], 5)))
    await sandbox.stop()  # idempotent, never started


# -- the output relay ---------------------------------------------------------------------------------


def remote_env(task_dir: Path, node: ClusterNode) -> AsyncTerminalEnv:
    return AsyncTerminalEnv(load_task(task_dir), EnvOptions(), sandbox_factory=remote_factory(node))


async def test_a_step_is_one_call_on_the_node_and_brings_its_whole_output(task_dir, node):
    actor: InProcessActor = node.actor
    env = remote_env(task_dir, node)
    async with env:
        await env.reset()
        for index in range(3):
            actor.calls.clear()
            observation, *_ = await env.step(f"echo out{index}; echo err{index} >&2; cd /tmp")
            assert f"out{index}" in observation and f"err{index}" in observation
            assert actor.calls == ["exchange"], actor.calls  # the poll stays outstanding, untouched


async def test_output_that_outlasts_the_hold_comes_by_the_poll_in_order(task_dir, node, monkeypatch):
    monkeypatch.setattr(relay, "HOLD_SEC", 0.05)
    env = remote_env(task_dir, node)
    async with env:
        await env.reset()
        observation, *_ = await env.step("echo first; sleep 0.3; echo second; sleep 0.2; echo third")
        lines = [line for line in observation.splitlines() if line in ("first", "second", "third")]
        assert lines == ["first", "second", "third"], observation
        again, *_ = await env.step("echo next")  # the shell's frames are intact after it
        assert "next" in again


def test_batches_come_out_in_order_whatever_order_they_arrive():
    batches = Batches()
    batches.add((2, b"c", False))
    batches.add((1, b"b", False))
    assert not batches and batches.take(10) == b""  # 0 has not come: nothing is handed on
    batches.add(None)  # an exchange that got nothing
    batches.add((0, b"a", False))
    batches.add((3, b"", True))
    assert batches.take(2) == b"ab" and batches.take(10) == b"c" and batches.eof


async def test_the_node_reads_no_more_than_its_bound_while_the_driver_does_not(node, monkeypatch):
    monkeypatch.setattr(relay, "BUFFER_BYTES", 8192)
    monkeypatch.setattr(relay, "BATCH_BYTES", 4096)
    host: SandboxHost = node.actor.host
    sandbox = RemoteSandbox(SandboxSpec(name="relay", context_dir=None, dockerfile=None), node)
    async with sandbox:
        channel = await sandbox.open_process(["/bin/sh", "-c", "head -c 200000 /dev/zero"], env={}, cwd="/")
        assert isinstance(channel, RemoteChannel)
        await asyncio.sleep(0.5)  # the process would have printed everything by now
        (node_side,) = host.channels.values()
        assert len(node_side._buffer) <= 8192 + 4096  # held at the bound, the rest still in the pipe
        received = bytearray()
        while data := await channel.read(1 << 16):
            received += data
        assert bytes(received) == b"\0" * 200000
        await channel.close()


async def test_closing_ends_a_waiting_poll_and_a_fault_reaches_the_reader(node):
    host: SandboxHost = node.actor.host
    sandbox = RemoteSandbox(SandboxSpec(name="relay", context_dir=None, dockerfile=None), node)
    async with sandbox:
        channel = await sandbox.open_process(["/bin/sleep", "30"], env={}, cwd="/")
        assert isinstance(channel, RemoteChannel)
        (channel_id,) = host.channels
        poll = asyncio.ensure_future(host.read(channel_id))
        await asyncio.sleep(0.05)
        await host.close(channel_id)
        _, data, eof = await asyncio.wait_for(poll, 5)
        assert (data, eof) == (b"", True)
        await channel.close()

    broken = OutputRelay(_FailingChannel())
    with pytest.raises(SandboxError, match="the pipe broke"):
        await asyncio.wait_for(broken.read(), 5)
    with pytest.raises(SandboxError, match="the pipe broke"):  # and to every later taker
        await asyncio.wait_for(broken.exchange(b"x", b"END"), 5)
    await broken.close()


class _FailingChannel(ProcessChannel):
    """A channel whose reading fails at once: the fault the relay must hand on, not swallow."""

    async def write(self, data: bytes) -> None:
        return None

    async def read(self, max_bytes: int) -> bytes:
        raise SandboxError("the pipe broke")

    async def wait(self) -> int | None:
        return None

    async def close(self) -> None:
        return None


def test_the_content_hash_ignores_times_and_follows_the_bytes(tmp_path):
    context = tmp_path / "env"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    (context / "data.txt").write_text("one")
    spec = SandboxSpec(name="t", context_dir=context, dockerfile=context / "Dockerfile")
    first = pack_files(spec)
    assert first is not None
    import os

    os.utime(context / "data.txt", (1, 1))
    other = SandboxSpec(name="t", context_dir=Path(str(context) + "/"), dockerfile=context / "Dockerfile")
    assert pack_files(other)[0] == first[0]  # type: ignore[index]
    (context / "data.txt").write_text("two")
    changed = SandboxSpec(name="t", context_dir=context, dockerfile=context / "Dockerfile", image="x")
    forget_packed()
    assert pack_files(changed)[0] != first[0]  # type: ignore[index]
    assert pack_files(SandboxSpec(name="t", context_dir=None, dockerfile=None, image="debian")) is None


async def test_the_node_pool_skips_nodes_that_are_down_and_takes_them_back_when_up():
    up = {"a": True, "b": False}
    pool = NodePool([Node("a", 1), Node("b", 2)], is_up=lambda name: up[name], poll=0.05)
    first = await pool.acquire()
    assert first.name == "a"
    waiting = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0.1)
    assert not waiting.done()  # a is full and b is down
    up["b"] = True
    second = await asyncio.wait_for(waiting, 2)
    assert second.name == "b"  # the pool noticed b up without any release
    pool.release(first)
    pool.release(second)
    assert pool.busy == [0, 0]


async def test_the_placement_is_the_schedulers_node_within_the_block():
    assert current_node.get() is None
    with placed_on("ray-x"):
        assert current_node.get() == "ray-x"
        assert await asyncio.ensure_future(_read()) == "ray-x"  # tasks started inside see it
    assert current_node.get() is None


async def _read() -> str | None:
    return current_node.get()


def test_no_sandbox_process_is_left_by_this_module():
    assert not [line for line in sandbox_processes() if "a1b2c3d4" in line]
