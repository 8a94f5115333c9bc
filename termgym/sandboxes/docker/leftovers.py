"""The registry's hooks of the Docker backend (``HOOKS``): ``preflight``, ``termgym gc``
(``remove_leftovers``), ``termgym shell --attach`` (``attach``: enter a container ``--keep`` left
running), the warm pool's ``prewarm``, and ``close_shared``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from termgym.errors import ConfigError
from termgym.sandboxes.base import BackendHooks, Resources, SandboxSpec
from termgym.sandboxes.docker.containers import (
    KEPT_PREFIX,
    close_warm_pool,
    collect_garbage,
    kept_names,
    sweep_orphans_once,
    wait_for_removals,
    warm_pool,
    warm_pool_on,
)
from termgym.sandboxes.docker.engine import docker_client, in_thread, keeper_among, mapped_error, processes
from termgym.sandboxes.docker.sandbox import DockerSandbox


async def prewarm(specs: Sequence[SandboxSpec], count: int | None = None) -> int:
    """Fill the warm pool for ``specs`` (their images built or pulled now), up to ``count`` each
    (default the per-image bound), and wait until those containers are started; how many are
    ready for them. 0 when the pool is off."""
    pool = warm_pool()
    if pool is None:
        return 0
    client = await in_thread(docker_client)
    await sweep_orphans_once(client)
    recipes = [(await DockerSandbox(spec)._recipe(client))[1] for spec in specs]
    return await pool.prewarm(recipes, count)


async def attach(sandbox_id: str) -> DockerSandbox:
    """The kept container ``sandbox_id`` (its name or id), started: running, labelled ``termgym=1``
    and named by ``keep``; its environment and working directory are the container's own, and
    ``stop`` removes it. ``ConfigError`` in one line when there is no such kept container."""
    import docker.errors

    missing = ConfigError(f"no kept sandbox {sandbox_id} (termgym gc removed it, or it was never kept)")
    client = await in_thread(docker_client)
    try:
        info = await in_thread(client.api.inspect_container, sandbox_id)
        top = await in_thread(processes, client, info["Id"]) if (info.get("State") or {}).get("Running") else None
    except docker.errors.NotFound:
        raise missing from None
    except docker.errors.APIError as exc:
        if exc.status_code in (400, 404, 409):
            raise missing from None
        raise mapped_error(exc, f"could not inspect {sandbox_id}") from exc
    config, host = info.get("Config") or {}, info.get("HostConfig") or {}
    labels = config.get("Labels") or {}
    if top is None or labels.get("termgym") != "1" or not str(info.get("Name", "")).lstrip("/").startswith(KEPT_PREFIX):
        raise missing
    sandbox = DockerSandbox(
        SandboxSpec(
            name=labels.get("termgym.task", sandbox_id),
            context_dir=None,
            dockerfile=None,
            image=config.get("Image"),
            resources=_resources_of(host),
            labels={k: v for k, v in labels.items() if k not in ("termgym", "termgym.task")},
        )
    )
    sandbox._container = info["Id"]
    sandbox._started_at = time.time()
    sandbox._keeper = keeper_among(top)
    sandbox.env = dict(pair.split("=", 1) for pair in config.get("Env") or [] if "=" in pair)
    sandbox.workdir = config.get("WorkingDir") or "/"
    sandbox.image = {"ref": str(config.get("Image") or ""), "digest": str(info.get("Image") or "")}
    return sandbox


def _resources_of(host_config: dict) -> Resources:
    """The CPU, memory and per-file size limits a container was created with (``start``)."""
    fsize = [u for u in host_config.get("Ulimits") or [] if u.get("Name") == "fsize"]
    defaults = Resources()
    return Resources(
        cpus=(host_config.get("NanoCpus") or 0) / 1e9 or defaults.cpus,
        memory_mb=(host_config.get("Memory") or 0) >> 20 or defaults.memory_mb,
        storage_mb=(fsize[0].get("Hard") or 0) >> 20 if fsize else defaults.storage_mb,
    )


def preflight() -> None:
    """``BackendUnavailable`` unless the Docker engine answers."""
    docker_client()


async def remove_leftovers(images: bool = False) -> str:
    """``termgym gc``: remove labelled containers, kept ones (``--keep``) included and named (and
    cached task images with ``images``); one line."""
    kept = await asyncio.to_thread(kept_names)
    containers, removed = await asyncio.to_thread(collect_garbage, images)
    named = f" ({len(kept)} kept: {', '.join(kept)})" if kept else ""
    return f"removed {containers} leftover docker container(s){named} and {removed} cached task image(s)"


async def close_shared() -> None:
    """Close the warm pool (its idle containers removed, ``WarmPool.close``) and wait for the
    removals ``stop`` started: once it returns, nothing this process created is left."""
    await close_warm_pool()
    await asyncio.to_thread(wait_for_removals)


HOOKS = BackendHooks(
    preflight=preflight,
    remove_leftovers=remove_leftovers,
    close_shared=close_shared,
    attach=attach,
    prewarm=prewarm,
    warm_pool_on=warm_pool_on,
)
