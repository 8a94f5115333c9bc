"""The commands about tasks and the machine: ``audit``, ``list``, ``gc`` and ``images``."""

from __future__ import annotations

import argparse
import asyncio

from rich.table import Table

from termgym.cli import common
from termgym.cli.runs import collect_tasks
from termgym.output import plain_text as plain
from termgym.output import terminal_safe
from termgym.sandboxes import attach_sandbox, remove_leftovers
from termgym.tasks import discover_tasks

# -- audit -------------------------------------------------------------------------------------------


async def cmd_audit(args: argparse.Namespace) -> int:
    """Exit 0 when the audit ran, rejects or not (they are in the table); 1 with --strict and a reject."""
    from termgym.audit.runner import run_audit

    return await run_audit(args, collect_tasks(args.tasks), common.out)


# -- list and gc -------------------------------------------------------------------------------------


async def cmd_list(args: argparse.Namespace) -> int:
    from termgym.tasks.bundled import bundled_root

    table = Table(title="bundled tasks", title_justify="left")
    for column in ("task", "family", "agent timeout", "instruction"):
        table.add_column(column)
    for task in discover_tasks(bundled_root()):
        lines = terminal_safe(task.instruction).strip().splitlines()
        first_line = lines[0][:70] if lines else ""
        table.add_row(plain(task.name), plain(task.family), f"{task.agent_timeout_sec:g}s", plain(first_line))
    common.out.print(table)
    return 0


async def cmd_gc(args: argparse.Namespace) -> int:
    """Without ids: every leftover of ``args.backend``, kept sandboxes included (named). With ids:
    only those kept sandboxes, each entered and stopped (``ConfigError`` for one that is not kept)."""
    if args.cluster:
        if args.ids:
            raise common.UsageError(
                "gc --cluster removes every node's leftovers; kept sandboxes are removed on their node"
            )
        for line in await common.connect_cluster(args).gc():
            common.out.print(plain(line))
        return 0
    if not args.ids:
        common.out.print(await remove_leftovers(args.backend, images=args.images))
        return 0
    for sandbox_id in args.ids:
        sandbox = await attach_sandbox(args.backend, sandbox_id)
        await sandbox.stop()
        common.out.print(plain(f"removed kept {args.backend} sandbox {sandbox_id}"))
    return 0


async def cmd_images(args: argparse.Namespace) -> int:
    from termgym.images.build import BASE_IMAGE, bootstrap_base_image
    from termgym.sandboxes.docker import docker_client

    client = docker_client()
    common.err.print(f"building {BASE_IMAGE} with debootstrap (about 20 s) unless it exists", markup=False)
    built = await asyncio.to_thread(bootstrap_base_image, client, force=args.force)
    common.out.print(f"{BASE_IMAGE}: {'built' if built else 'already present'}")
    return 0
