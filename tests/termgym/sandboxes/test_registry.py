"""The backend registry (``termgym.sandboxes``): a backend written from CONTRIBUTING.md's recipe, a
module with only its ``Sandbox`` class, works through every registry call of a run (its optional
hooks absent), and a module's ``HOOKS`` are what the registry calls."""

from __future__ import annotations

import sys
import types

import pytest

from termgym import sandboxes
from termgym.errors import ConfigError
from termgym.sandboxes.base import BackendHooks, Sandbox, SandboxSpec


class MinimalSandbox(Sandbox):
    backend = "minimal"

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def run(self, command):
        raise NotImplementedError

    async def open_process(self, argv, *, env, cwd, user=None):
        raise NotImplementedError

    async def kill_agent_processes(self) -> None: ...


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch):
    """Register a backend ``minimal`` whose module holds the class and nothing else; yields the module."""
    module = types.ModuleType("minimal_backend")
    module.MinimalSandbox = MinimalSandbox  # pyright: ignore[reportAttributeAccessIssue]
    monkeypatch.setitem(sys.modules, "minimal_backend", module)
    monkeypatch.setitem(
        sandboxes.REGISTRY, "minimal", sandboxes.Backend("minimal", "minimal_backend", "MinimalSandbox")
    )
    return module


async def test_a_backend_with_no_hooks_works_through_every_call_of_a_run(registered):
    spec = SandboxSpec(name="t", context_dir=None, dockerfile=None)
    assert isinstance(sandboxes.create_sandbox("minimal", spec), MinimalSandbox)
    sandboxes.preflight("minimal")  # nothing to check
    assert not sandboxes.keeps_warm_pool("minimal")
    assert await sandboxes.prewarm("minimal", [spec]) == 0
    assert await sandboxes.remove_leftovers("minimal") == "the minimal backend leaves nothing to collect"
    with pytest.raises(ConfigError, match="cannot attach"):
        await sandboxes.attach_sandbox("minimal", "x")
    await sandboxes.close_backends()  # the end of every run: no hook, no crash


async def test_a_modules_hooks_are_what_the_registry_calls(registered):
    calls: list[str] = []

    async def close() -> None:
        calls.append("close")

    async def leftovers(images: bool) -> str:
        calls.append(f"gc images={images}")
        return "removed 3"

    registered.HOOKS = BackendHooks(
        preflight=lambda: calls.append("preflight"), remove_leftovers=leftovers, close_shared=close
    )
    sandboxes.preflight("minimal")
    assert await sandboxes.remove_leftovers("minimal", images=True) == "removed 3"
    await sandboxes.close_backends()
    assert calls == ["preflight", "gc images=True", "close"]


async def test_a_cluster_sandbox_is_the_ray_entrys_and_closes_with_every_backend(registered, monkeypatch):
    """``create_sandbox(..., cluster=)`` builds the registry's ``ray`` entry's class (a layer, not a
    ``--backend`` choice), and ``close_backends`` closes it through its ``HOOKS`` like any other."""
    assert sandboxes.REGISTRY["ray"].layer and "ray" not in sandboxes.BACKENDS
    made: list[tuple[str, str]] = []
    closed: list[str] = []

    class LayerSandbox(MinimalSandbox):
        def __init__(self, spec, *, backend: str, address: str) -> None:
            super().__init__(spec)
            made.append((backend, address))

    async def close() -> None:
        closed.append("cluster")

    layer = types.ModuleType("layer_backend")
    layer.LayerSandbox = LayerSandbox  # pyright: ignore[reportAttributeAccessIssue]
    layer.HOOKS = BackendHooks(close_shared=close)  # pyright: ignore[reportAttributeAccessIssue]
    monkeypatch.setitem(sys.modules, "layer_backend", layer)
    monkeypatch.setitem(
        sandboxes.REGISTRY, "ray", sandboxes.Backend("ray", "layer_backend", "LayerSandbox", layer=True)
    )
    spec = SandboxSpec(name="t", context_dir=None, dockerfile=None)
    assert isinstance(sandboxes.create_sandbox("minimal", spec, cluster="ray://head:10001"), LayerSandbox)
    assert isinstance(sandboxes.create_sandbox("minimal", spec), MinimalSandbox)
    assert made == [("minimal", "ray://head:10001")]
    await sandboxes.close_backends()
    assert closed == ["cluster"]
