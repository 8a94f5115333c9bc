"""The one progress bar termgym's commands and the trainer show on stderr: a description, a bar,
done of total, and the time elapsed."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def progress_bar(console: Console, *, disable: bool = False) -> Progress:
    """A ``rich`` progress display on ``console`` (``disable``: draw nothing, e.g. off rank 0)."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console, disable=disable)
