"""``termgym report RUN_DIR``: one self-contained HTML file of a run."""

from __future__ import annotations

import argparse

from termgym.cli.common import UsageError


async def cmd_report(args: argparse.Namespace) -> int:
    raise UsageError("termgym report is not built yet")
