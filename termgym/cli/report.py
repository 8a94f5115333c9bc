"""``termgym report RUN_DIR [--out FILE]``: one self-contained HTML file of a run
(``termgym.cli.run_report``); prints the path written."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from termgym.cli import common
from termgym.cli.common import UsageError
from termgym.cli.run_report import RECORDS_FILE, write_report


async def cmd_report(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    if not (run_dir / RECORDS_FILE).is_file():
        raise UsageError(f"{run_dir}: not a run directory (no {RECORDS_FILE}; termgym run --out writes one)")
    out: Path = args.out or run_dir / "report.html"
    if out.is_dir():
        raise UsageError(f"--out {out}: is a directory (give the HTML file's path)")
    written = await asyncio.to_thread(write_report, run_dir, out)
    common.out.print(str(written), markup=False, highlight=False, soft_wrap=True)
    return 0
