"""The Docker backend's warm pool: the pure parts (settings, recipes, bounds, owners) on tables, the
pool's logic against a fake engine, then the real engine: isolation between trials, invalidation,
concurrency, bounds, and clean-up at close, by gc and after a SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from termgym.agents import ScriptedAgent
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.episode.spec import default_sandbox_factory
from termgym.errors import ConfigError
from termgym.images.build import BASE_IMAGE
from termgym.sandboxes.base import Resources, SandboxSpec
from termgym.sandboxes.docker import DockerSandbox
from termgym.sandboxes.docker.pool import Ready, Recipe, WarmPool, make_recipe, settings_from_env
from termgym.sandboxes.host_processes import start_time
from termgym.sandboxes.warm_pool import (
    DEFAULT_TOTAL,
    POOL_LABEL,
    PoolSettings,
    owner_gone,
    owner_label,
    refill_count,
    this_owner,
)
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import REPO_ROOT, require_docker, write_task

IMAGE = "sha256:" + "a" * 64


def recipe(**changes: object) -> Recipe:
    values: dict = dict(
        image_id=IMAGE,
        command=["sleep", "infinity"],
        labels={"termgym": "1", "termgym.run": "r"},
        working_dir="/app",
        environment={"A": "1"},
        network_mode="none",
        cpus=1.0,
        memory_mb=2048,
        storage_mb=10240,
        pids_limit=512,
    )
    return make_recipe(**{**values, **changes})


# -- pure parts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, PoolSettings(0, DEFAULT_TOTAL)),
        ({"TERMGYM_DOCKER_POOL": "4"}, PoolSettings(4, DEFAULT_TOTAL)),
        ({"TERMGYM_DOCKER_POOL": " 4 ", "TERMGYM_DOCKER_POOL_TOTAL": "6"}, PoolSettings(4, 6)),
        ({"TERMGYM_DOCKER_POOL": "", "TERMGYM_DOCKER_POOL_TOTAL": "0"}, PoolSettings(0, 0)),
        ({"TERMGYM_DOCKER_POOL": "2", "TERMGYM_DOCKER_POOL_FILLERS": "5"}, PoolSettings(2, DEFAULT_TOTAL, 5)),
        ({"TERMGYM_DOCKER_POOL": "2", "TERMGYM_DOCKER_POOL_REFILL": " take "}, PoolSettings(2, DEFAULT_TOTAL)),
        (
            {"TERMGYM_DOCKER_POOL": "2", "TERMGYM_DOCKER_POOL_REFILL": "prewarm"},
            PoolSettings(2, DEFAULT_TOTAL, refill_on_take=False),
        ),
    ],
)
def test_settings_come_from_the_environment(environ, expected):
    assert settings_from_env(environ) == expected


@pytest.mark.parametrize(
    "environ",
    [
        {"TERMGYM_DOCKER_POOL": "many"},
        {"TERMGYM_DOCKER_POOL": "-1"},
        {"TERMGYM_DOCKER_POOL_TOTAL": "2.5"},
        {"TERMGYM_DOCKER_POOL_FILLERS": "0"},
        {"TERMGYM_DOCKER_POOL_REFILL": "always"},
    ],
)
def test_settings_that_are_not_counts_are_one_line_errors(environ):
    with pytest.raises(ConfigError) as caught:
        settings_from_env(environ)
    assert "\n" not in str(caught.value) and next(iter(environ)) in str(caught.value)


@pytest.mark.parametrize(
    ("settings", "enabled"), [(PoolSettings(0, 8), False), (PoolSettings(2, 0), False), (PoolSettings(1, 1), True)]
)
def test_the_pool_is_on_only_with_both_bounds_above_zero(settings, enabled):
    assert settings.enabled is enabled


@pytest.mark.parametrize(
    ("settings", "held", "held_total", "wanted", "expected"),
    [
        (PoolSettings(4, 10), 0, 0, None, 4),  # empty: fill to the per-recipe bound
        (PoolSettings(4, 10), 3, 3, None, 1),
        (PoolSettings(4, 10), 4, 4, None, 0),  # full
        (PoolSettings(4, 10), 0, 8, None, 2),  # the total binds first
        (PoolSettings(4, 10), 0, 10, None, 0),
        (PoolSettings(4, 10), 1, 12, None, 0),  # over the total (settings lowered): never negative
        (PoolSettings(4, 10), 0, 0, 2, 2),  # a prewarm asking for fewer
        (PoolSettings(4, 10), 0, 0, 9, 4),  # or for more than the bound
        (PoolSettings(4, 10), 3, 3, 2, 0),
    ],
)
def test_refill_count_never_passes_either_bound(settings, held, held_total, wanted, expected):
    assert refill_count(settings, held, held_total, wanted) == expected


def test_equal_specs_make_equal_recipes_whatever_the_order_of_labels_and_environment():
    a = recipe(labels={"x": "1", "y": "2"}, environment={"P": "1", "Q": "2"})
    b = recipe(labels={"y": "2", "x": "1"}, environment={"Q": "2", "P": "1"})
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize(
    "change",
    [
        {"image_id": "sha256:" + "b" * 64},  # the same tag rebuilt
        {"cpus": 0.5},
        {"memory_mb": 1024},
        {"storage_mb": 512},
        {"network_mode": "bridge"},
        {"environment": {"A": "2"}},
        {"environment": {}},
        {"labels": {"termgym": "1", "termgym.run": "other-run"}},
        {"working_dir": "/"},
        {"command": ["sleep", "1"]},
        {"pids_limit": 64},
    ],
)
def test_any_difference_in_what_makes_a_container_is_another_recipe(change):
    assert recipe(**change) != recipe()


def test_a_recipe_needs_an_image_id_not_a_tag():
    with pytest.raises(ValueError, match="image's id"):
        recipe(image_id="debian:bookworm-slim")


def test_owners_are_gone_only_when_this_host_says_so():
    host = "node-a"
    alive = {10: 555}
    start_of = alive.get
    assert not owner_gone(owner_label(host, 10, 555), host, start_of)  # still running
    assert owner_gone(owner_label(host, 10, 554), host, start_of)  # the pid was reused
    assert owner_gone(owner_label(host, 11, 555), host, start_of)  # no such process
    assert not owner_gone(owner_label("node-b", 11, 555), host, start_of)  # another host's: cannot tell
    assert not owner_gone("garbage", host, start_of)
    assert not owner_gone(f"{host}/x/1", host, start_of)


def test_this_process_is_its_own_live_owner():
    owner = this_owner()
    assert owner == owner_label(socket.gethostname(), os.getpid(), start_time(os.getpid()))
    assert not owner_gone(owner, socket.gethostname(), start_time)


# -- the pool's logic, against a fake engine ---------------------------------------------------------


class FakeEngine:
    """Containers as ids; creation takes a moment; records what the pool held at every creation."""

    def __init__(self, fail: bool = False) -> None:
        self.ids = itertools.count()
        self.running: set[str] = set()
        self.removed: list[str] = []
        self.made: list[str] = []
        self.fail = fail
        self.recipes: dict[str, Recipe] = {}

    async def create_started(self, recipe: Recipe, labels: Mapping[str, str]) -> Ready:
        assert labels == {POOL_LABEL: "test-owner"}
        await asyncio.sleep(0.001)
        if self.fail:
            raise RuntimeError("the engine said no")
        container = f"c{next(self.ids)}"
        self.made.append(container)
        self.running.add(container)
        self.recipes[container] = recipe
        return Ready(container, "1")

    async def is_running(self, container: str) -> bool:
        await asyncio.sleep(0)
        return container in self.running

    def discard(self, container: str) -> None:
        self.running.discard(container)
        self.removed.append(container)

    async def drain(self) -> None:
        await asyncio.sleep(0)


def fake_pool(per: int, total: int, engine: FakeEngine | None = None) -> tuple[WarmPool, FakeEngine]:
    engine = engine or FakeEngine()
    pool = WarmPool(engine, PoolSettings(per, total), owner="test-owner")
    return pool, engine


async def test_a_take_before_anything_is_ready_returns_none_and_starts_the_refill():
    pool, engine = fake_pool(3, 10)
    assert await pool.take(recipe()) is None
    assert pool.held(recipe()) == 3
    await pool.prewarm([recipe()])
    assert len(pool.idle(recipe())) == 3 and len(engine.made) == 3


async def test_with_refill_by_prewarm_only_a_take_refills_nothing_and_the_prewarm_fills():
    engine = FakeEngine()
    pool = WarmPool(engine, PoolSettings(3, 10, refill_on_take=False), owner="test-owner")
    assert await pool.take(recipe()) is None and pool.held() == 0  # found empty: still nothing made
    assert await pool.prewarm([recipe()]) == 3
    taken = [await pool.take(recipe()) for _ in range(3)]
    assert all(taken) and pool.held() == 0 and len(engine.made) == 3  # three taken, none refilled
    assert await pool.take(recipe()) is None
    assert await pool.prewarm([recipe()], 2) == 2 and len(engine.made) == 5


async def test_concurrent_takes_get_distinct_containers_and_the_bounds_hold_throughout():
    pool, engine = fake_pool(4, 6)
    a, b = recipe(), recipe(memory_mb=512)
    held_max: dict[Recipe | None, int] = {}
    real_create = engine.create_started

    async def watched(r: Recipe, labels: Mapping[str, str]) -> Ready:
        for key in (a, b, None):
            held_max[key] = max(held_max.get(key, 0), pool.held(key))
        return await real_create(r, labels)

    engine.create_started = watched  # type: ignore[method-assign]
    await pool.prewarm([a, b])
    taken = await asyncio.gather(*(pool.take(r) for r in [a, b] * 20))
    for _ in range(5):  # takes with refills under way
        taken += await asyncio.gather(*(pool.take(r) for r in [a, b] * 5))
        await asyncio.sleep(0.005)
    got = [t.container for t in taken if t is not None]
    assert len(got) == len(set(got)) > 6, "a container was handed out twice, or the pool never refilled"
    assert all(engine.recipes[t.container] == r for t, r in zip(taken, [a, b] * 70) if t is not None)
    assert held_max[a] <= 4 and held_max[b] <= 4 and held_max[None] <= 6 and pool.peak <= 6
    assert not set(got) & set(pool.idle()), "a taken container is still in the pool"


async def test_no_more_than_the_fillers_create_at_once():
    engine = FakeEngine()
    pool = WarmPool(engine, PoolSettings(6, 6, fillers=2), owner="test-owner")
    at_once, most = 0, 0
    real_create = engine.create_started

    async def counted(r: Recipe, labels: Mapping[str, str]) -> Ready:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        try:
            return await real_create(r, labels)
        finally:
            at_once -= 1

    engine.create_started = counted  # type: ignore[method-assign]
    assert await pool.prewarm([recipe()]) == 6
    assert most == 2


async def test_a_container_that_stopped_is_discarded_and_the_next_one_taken():
    pool, engine = fake_pool(3, 3)
    await pool.prewarm([recipe()])
    first, second, third = pool.idle(recipe())
    engine.running -= {first, second}  # killed from outside while idle
    ready = await pool.take(recipe())
    assert ready is not None and ready.container == third
    assert engine.removed == [first, second]


async def test_a_take_cancelled_while_checking_discards_the_container_it_held():
    pool, engine = fake_pool(1, 1)
    await pool.prewarm([recipe()])
    (only,) = pool.idle(recipe())
    task = asyncio.ensure_future(pool.take(recipe()))
    await asyncio.sleep(0)  # inside is_running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert only in engine.removed and only not in pool.idle()


async def test_failed_creations_leave_the_pool_short_without_raising():
    pool, _engine = fake_pool(2, 2, FakeEngine(fail=True))
    assert await pool.prewarm([recipe()]) == 0
    assert pool.held() == 0 and await pool.take(recipe()) is None


async def test_close_waits_for_creations_under_way_and_removes_everything_idle():
    pool, engine = fake_pool(3, 6)
    await pool.prewarm([recipe()])
    taken = await pool.take(recipe())  # refill under way
    assert taken is not None and pool.held() == 3
    await pool.close()
    assert set(engine.removed) == set(engine.made) - {taken.container}, "an idle or late container survived close"
    assert await pool.take(recipe()) is None and pool.want(recipe()) == [] and pool.held() == 0


async def test_a_disabled_pool_creates_nothing():
    pool, engine = fake_pool(0, 8)
    assert await pool.prewarm([recipe()]) == 0 and await pool.take(recipe()) is None
    assert engine.made == []


# -- the real engine ---------------------------------------------------------------------------------


@pytest.fixture
async def pooled(monkeypatch, sandbox_dir):
    """The Docker backend with a pool of 2 per recipe, 3 in all; closed at the end, and then no
    container of this process's pool is left."""
    require_docker()
    from termgym.sandboxes import docker

    await docker.close_shared()  # a pool from an earlier test's settings
    monkeypatch.setenv("TERMGYM_DOCKER_POOL", "2")
    monkeypatch.setenv("TERMGYM_DOCKER_POOL_TOTAL", "3")
    yield docker
    await docker.close_shared()
    left = docker.docker_client().api.containers(all=True, filters={"label": f"{POOL_LABEL}={this_owner()}"})
    assert not left, f"pooled containers left after close: {[c['Id'][:12] for c in left]}"


def spec_of(task_dir: Path, **changes: object) -> SandboxSpec:
    spec = default_sandbox_factory(load_task(task_dir), EnvOptions(backend="docker")).spec
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


@pytest.mark.docker
async def test_a_pooled_container_carries_nothing_of_the_trial_before(tmp_path, pooled):
    task_dir = write_task(tmp_path)
    task = load_task(task_dir)
    assert await pooled.prewarm([spec_of(task_dir)]) == 2
    used = []
    for _ in range(3):
        idle = set(pooled.warm_pool().idle())
        env = AsyncTerminalEnv(task, EnvOptions(backend="docker"))
        async with env:
            await env.reset()
            assert isinstance(env.sandbox, DockerSandbox)
            container = env.sandbox._container
            observation, *_ = await env.step("ls /app/leak /tmp/leak 2>&1; echo secret > /app/leak; touch /tmp/leak")
            assert "No such file" in observation and observation.count("No such file") == 2, observation
        assert container in idle, "the trial did not take a pooled container"
        used.append(container)
        pooled.wait_for_removals()
        assert not pooled.docker_client().api.containers(all=True, filters={"id": container}), "stop kept it"
        await pooled.warm_pool().settle()  # the refill, for the next trial
    assert len(set(used)) == 3


@dataclasses.dataclass(frozen=True)
class Recording(ScriptedAgent):
    """A scripted agent that notes the container its trial runs on before its commands."""

    containers: list[str] = dataclasses.field(default_factory=list)

    async def run(self, env, instruction, info):
        assert isinstance(env.sandbox, DockerSandbox) and env.sandbox._container is not None
        self.containers.append(env.sandbox._container)
        return await super().run(env, instruction, info)


@pytest.mark.docker
@pytest.mark.parametrize("ending", ["failed", "cancelled"])
async def test_a_failed_or_cancelled_trial_never_returns_its_container(tmp_path, pooled, ending):
    """A used container is removed whatever ends its trial: one the agent broke (``kill -9 -1``,
    a failed trial), one cancelled in the middle of a command; neither goes back to the pool."""
    task = load_task(write_task(tmp_path))
    await pooled.prewarm([spec_of(tmp_path / "demo")], 1)
    (ready,) = pooled.warm_pool().idle()
    agent = Recording(("echo used > /app/used", "kill -9 -1" if ending == "failed" else "sleep 60"))
    trial = asyncio.ensure_future(run_trial(task, agent, EnvOptions(backend="docker")))
    if ending == "failed":
        record = await trial
        assert record.error is not None and record.error["kind"] == "broken_by_agent", record.error
    else:
        while not agent.containers:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # inside the sleep
        trial.cancel()
        with pytest.raises(asyncio.CancelledError):
            await trial
    assert agent.containers == [ready], "the trial did not take the pooled container"
    pooled.wait_for_removals()
    await pooled.warm_pool().settle()
    assert ready not in pooled.warm_pool().idle()
    assert not pooled.docker_client().api.containers(all=True, filters={"id": ready}), "the used container was kept"


@pytest.mark.docker
async def test_an_image_rebuilt_under_its_tag_never_gets_an_old_container(tmp_path, pooled):
    client = pooled.docker_client()
    tag = f"termgym-test/pool-rebuilt:{uuid.uuid4().hex[:8]}"

    def build(version: str) -> str:
        context = tmp_path / f"ctx-{version}"
        context.mkdir()
        (context / "Dockerfile").write_text(
            f"FROM {BASE_IMAGE}\nLABEL termgym=1\nRUN echo {version} > /version\nWORKDIR /app\n"
        )
        image, _ = client.images.build(path=str(context), tag=tag, network_mode="none", rm=True, forcerm=True)
        return image.id

    first = second = ""
    try:
        first = build("one")
        task_dir = write_task(tmp_path, environment_toml=f'docker_image = "{tag}"')
        (task_dir / "environment" / "Dockerfile").unlink()
        spec = spec_of(task_dir)
        await pooled.prewarm([spec])
        old = set(pooled.warm_pool().idle())
        assert len(old) == 2 and {client.api.inspect_container(c)["Image"] for c in old} == {first}
        second = build("two")
        assert second != first
        sandbox = pooled.DockerSandbox(spec)
        async with sandbox:
            assert sandbox._container not in old
            assert client.api.inspect_container(sandbox._container)["Image"] == second
            assert (await sandbox.exec(["cat", "/version"], timeout=10)).text.strip() == "two"
        assert set(pooled.warm_pool().idle()) >= old, "the old image's containers should wait idle for close"
    finally:
        await pooled.close_shared()
        pooled.wait_for_removals()
        for image in {first, second} - {""}:
            with contextlib.suppress(Exception):
                client.api.remove_image(image, force=True)


@pytest.mark.docker
@pytest.mark.parametrize(
    "change",
    [
        {"resources": Resources(memory_mb=1024)},
        {"resources": Resources(cpus=0.5)},
        {"resources": Resources(storage_mb=512)},
        {"env": {"EXTRA": "1"}},
        {"labels": {"termgym": "1", "termgym.run": "another-run"}},
    ],
)
async def test_another_spec_never_gets_a_pooled_container(tmp_path, pooled, change):
    base = spec_of(write_task(tmp_path))
    await pooled.prewarm([base])
    idle = set(pooled.warm_pool().idle())
    assert len(idle) == 2
    other = dataclasses.replace(base, **change)  # type: ignore[arg-type]
    sandbox = pooled.DockerSandbox(other)
    async with sandbox:
        info = pooled.docker_client().api.inspect_container(sandbox._container)
        assert sandbox._container not in idle
        host, labels = info["HostConfig"], info["Config"]["Labels"]
        assert host["Memory"] == other.resources.memory_mb << 20
        assert host["NanoCpus"] == int(other.resources.cpus * 1e9)
        assert labels["termgym.run"] == other.labels["termgym.run"]
        assert ("EXTRA=1" in info["Config"]["Env"]) == ("EXTRA" in other.env)
    assert set(pooled.warm_pool().idle()) >= idle


@pytest.mark.docker
async def test_concurrent_starts_get_distinct_containers_within_the_bounds(tmp_path, pooled):
    spec = spec_of(write_task(tmp_path))
    await pooled.prewarm([spec])
    client, owner = pooled.docker_client(), this_owner()
    sandboxes = [pooled.DockerSandbox(spec) for _ in range(6)]
    await asyncio.gather(*(s.start() for s in sandboxes))
    try:
        ids = [s._container for s in sandboxes]
        assert len(set(ids)) == 6
        pool = pooled.warm_pool()
        assert pool.peak <= 3 and pool.held(None) <= 3
        listed = client.api.containers(all=True, filters={"label": f"{POOL_LABEL}={owner}"})
        assert len(listed) <= 6 + 3  # the trials' own, plus at most the total idle or being made
    finally:
        await asyncio.gather(*(s.stop() for s in sandboxes))


@pytest.mark.docker
async def test_the_total_bound_holds_over_images(tmp_path, pooled):
    a = spec_of(write_task(tmp_path / "a"))
    b = spec_of(write_task(tmp_path / "b"), resources=Resources(memory_mb=1024))
    assert await pooled.prewarm([a, b]) == 3  # 2 for the first, 1 left in the total for the second
    assert len(pooled.warm_pool().idle()) == 3


@pytest.mark.docker
async def test_a_pooled_container_stopped_while_idle_is_never_handed_out(tmp_path, pooled):
    spec = spec_of(write_task(tmp_path))
    await pooled.prewarm([spec], 1)
    (stopped,) = pooled.warm_pool().idle()
    client = pooled.docker_client()
    client.api.kill(stopped)
    sandbox = pooled.DockerSandbox(spec)
    async with sandbox:
        assert sandbox._container != stopped
        assert (await sandbox.exec(["true"], timeout=10)).exit_code == 0
    pooled.wait_for_removals()
    assert not client.api.containers(all=True, filters={"id": stopped}), "the stopped container was not removed"


@pytest.mark.docker
async def test_gc_removes_pooled_containers(tmp_path, pooled):
    await pooled.prewarm([spec_of(write_task(tmp_path))])
    client = pooled.docker_client()
    idle = pooled.warm_pool().idle()
    assert idle and all(client.api.inspect_container(c)["Config"]["Labels"]["termgym"] == "1" for c in idle)
    await pooled.remove_leftovers()
    assert not client.api.containers(all=True, filters={"label": POOL_LABEL})


FILL_AND_WAIT = textwrap.dedent(
    """
    import asyncio, sys
    from termgym.episode.options import EnvOptions
    from termgym.episode.spec import default_sandbox_factory
    from termgym.sandboxes import docker
    from termgym.tasks import load_task

    async def main():
        spec = default_sandbox_factory(load_task(sys.argv[1]), EnvOptions(backend="docker")).spec
        print(await docker.prewarm([spec]), docker.warm_pool().owner, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


@pytest.mark.docker
async def test_the_pool_of_a_sigkilled_process_is_removed_by_the_next_and_by_gc(tmp_path, pooled):
    task_dir = write_task(tmp_path)
    client = pooled.docker_client()

    def killed_pool() -> list[str]:
        """A process's full pool, then the process SIGKILLed; its containers' ids."""
        child = subprocess.Popen(
            [sys.executable, "-c", FILL_AND_WAIT, str(task_dir)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "TERMGYM_DOCKER_POOL": "2"},
        )
        try:
            assert child.stdout is not None
            count, owner = child.stdout.readline().split()
            assert count == "2"
            ids = [c["Id"] for c in client.api.containers(all=True, filters={"label": f"{POOL_LABEL}={owner}"})]
            assert len(ids) == 2
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
        assert len(client.api.containers(filters={"label": f"{POOL_LABEL}={owner}"})) == 2, "it left nothing to test"
        return ids

    ours = pooled.warm_pool()
    await pooled.prewarm([spec_of(task_dir)])
    mine = set(ours.idle())
    orphans = killed_pool()
    assert pooled.remove_orphans(client) == 2  # as the next run's first start does
    remaining = {c["Id"] for c in client.api.containers(all=True, filters={"label": POOL_LABEL})}
    assert not remaining & set(orphans) and mine <= remaining, "a live process's pool was touched"

    killed_pool()
    await pooled.remove_leftovers()  # termgym gc
    assert not client.api.containers(all=True, filters={"label": POOL_LABEL})


@pytest.mark.docker
async def test_the_sweep_removes_a_dead_owners_containers_but_not_kept_ones(tmp_path, pooled):
    client = pooled.docker_client()
    sandbox = pooled.DockerSandbox(spec_of(write_task(tmp_path)))
    _, made_from = await sandbox._recipe(client)
    dead = {POOL_LABEL: owner_label(socket.gethostname(), 4194304, 1)}  # above any pid_max: never ran
    orphan = pooled.create_started(client, made_from, dead).container
    kept = pooled.create_started(client, made_from, dead).container
    try:
        client.api.rename(kept, f"{pooled.KEPT_PREFIX}{kept[:12]}")
        assert pooled.remove_orphans(client) == 1
        assert not client.api.containers(all=True, filters={"id": orphan})
        assert client.api.containers(filters={"id": kept}), "a kept container was swept"
    finally:
        for container in (orphan, kept):
            with contextlib.suppress(Exception):
                client.api.remove_container(container, force=True)


async def test_prewarm_is_nothing_where_no_pool_is_kept(monkeypatch):
    from termgym.sandboxes import prewarm

    monkeypatch.delenv("TERMGYM_DOCKER_POOL", raising=False)
    spec = SandboxSpec("t", None, None)
    assert await prewarm("local", [spec]) == 0  # a backend without a pool
    assert await prewarm("docker", [spec]) == 0  # the pool off: the engine is not even asked


@pytest.mark.docker
async def test_the_scheduler_prewarms_the_next_step_and_its_trials_take_those_containers(tmp_path, pooled):
    from termgym.sandboxes.pacing import Pacer
    from termgym.scheduling.pool import TaskPool, make_nodes
    from termgym.scheduling.runners import TrialRunner
    from termgym.scheduling.scheduler import RolloutScheduler, SchedulerConfig

    tasks = [load_task(write_task(tmp_path, name=f"prewarmed-{i}")) for i in range(2)]
    pacer = Pacer()
    runner = TrialRunner(ScriptedAgent(("echo done > /app/result.txt",)), EnvOptions(backend="docker"), pacer)
    config = SchedulerConfig(batch_size=2, mode="wait", nodes=make_nodes([2]))
    scheduler = RolloutScheduler(runner, TaskPool(tasks, shuffle=False), config, pacer=pacer)
    first = await scheduler.step()
    assert scheduler._prewarming is not None and await scheduler._prewarming >= 2  # step 2 has two trials
    ready = set(pooled.warm_pool().idle())  # also what step 1's trials refilled (3 at most in all)
    assert 2 <= len(ready) <= 3
    second = await scheduler.step()
    await scheduler.close()
    pooled.wait_for_removals()
    assert all(k.record.error is None for k in [*first.kept, *second.kept])
    left = {c["Id"] for c in pooled.docker_client().api.containers(all=True, filters={"label": POOL_LABEL})}
    assert len(ready - left) == 2, "step 2's two trials did not both start on a ready container"
