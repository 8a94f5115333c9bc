"""The sandbox an episode needs: its spec from the task and the run's options (labelled as
DESIGN.md says), the backend's factory, and a warm
pool's prewarming ahead of a batch of trials."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence

from termgym.episode.options import EnvOptions
from termgym.episode.overrides import apply_overrides, network_asked
from termgym.images.build import load_aliases
from termgym.sandboxes import create_sandbox, keeps_warm_pool, prewarm
from termgym.sandboxes.base import Sandbox, SandboxSpec
from termgym.tasks import Task

# Makes the (not yet started) sandbox of an episode: a backend's (``default_sandbox_factory``), a
# simulated one, or one that waits for a creation slot first (``termgym.scheduling.runners``).
SandboxFactory = Callable[[Task, EnvOptions], "Sandbox | Awaitable[Sandbox]"]


def sandbox_spec(
    task: Task,
    *,
    run_id: str,
    image_aliases: Mapping[str, str] | None = None,
    pull: str = "missing",
    prefer_build: bool = False,
) -> SandboxSpec:
    """The sandbox a task's environment needs, labelled as DESIGN.md says. ``image_aliases``
    defaults to the built-in ones plus the config file's (``termgym.images.build.load_aliases``)."""
    return SandboxSpec(
        name=task.name,
        context_dir=task.environment_dir,
        dockerfile=task.dockerfile,
        image=task.docker_image,
        resources=task.resources,
        network=network_asked(task)["agent"],  # the sandbox starts in the agent phase's network
        env=dict(task.environment_env),
        labels={"termgym": "1", "termgym.run": run_id or "adhoc"},
        build_timeout_sec=task.build_timeout_sec,
        compose_file=task.compose_file,
        image_aliases=dict(image_aliases) if image_aliases is not None else load_aliases(),
        pull=pull,
        prefer_build=prefer_build,
    )


def options_sandbox_spec(task: Task, options: EnvOptions) -> SandboxSpec:
    """``sandbox_spec`` of ``task`` as a trial run with ``options`` asks for it."""
    return sandbox_spec(
        task, run_id=options.run_id, image_aliases=options.image_aliases, pull=options.pull, prefer_build=options.build
    )


def default_sandbox_factory(task: Task, options: EnvOptions) -> Sandbox:
    """The sandbox ``options.backend`` makes for ``task``, labelled with the run id, with image
    aliases; with ``options.cluster``, on a node of that Ray cluster (``termgym.sandboxes.ray``)."""
    return create_sandbox(options.backend, options_sandbox_spec(task, options), cluster=options.cluster)


async def prewarm_sandboxes(tasks: Sequence[Task], options: EnvOptions) -> int:
    """Make the sandboxes of trials of ``tasks`` (one each; the run's overrides applied) under
    ``options`` ready ahead of them where the backend keeps a warm pool
    (``termgym.sandboxes.prewarm``: Docker with ``TERMGYM_DOCKER_POOL``); how many are ready. 0 for
    a backend without one. A sandbox made ready for a spec no trial asks for again is only removed
    when the pool closes: a pooled sandbox serves only a trial whose own spec is identical."""
    if not keeps_warm_pool(options.backend):
        return 0
    specs: dict[str, SandboxSpec] = {}
    counts: Counter[str] = Counter()
    for task in tasks:
        counts[task.name] += 1
        specs[task.name] = options_sandbox_spec(apply_overrides(task, options.overrides)[0], options)
    by_count: dict[int, list[SandboxSpec]] = {}
    for name, spec in specs.items():
        by_count.setdefault(counts[name], []).append(spec)
    return sum([await prewarm(options.backend, group, count) for count, group in by_count.items()])
