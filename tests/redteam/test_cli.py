"""Red team, the command line: what a task, a sandbox or a verifier writes is printed as text, with
nothing a terminal acts on, and a task no engine could run is refused in one line, never retried."""

from __future__ import annotations

import pytest

from termgym.cli import main
from tests.helpers import write_task

pytestmark = [pytest.mark.redteam]

HOSTILE_CTRF = r'{"results":{"tests":[{"name":"x[/bold] \u001b]52;c;cHduZWQ=\u0007\u001b[2J","status":"passed"}]}}'


async def _check(capsys, *argv: str) -> tuple[int, str, str]:
    import asyncio

    code = await asyncio.to_thread(main, ["check", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_markup_and_terminal_controls_from_the_verifier_are_printed_as_inert_text(tmp_path, capsys, no_leaks):
    task = write_task(tmp_path, test_sh=f"#!/bin/sh\nprintf '%s' '{HOSTILE_CTRF}' > /logs/verifier/ctrf.json\n")
    code, out, err = await _check(capsys, str(task))
    assert code == 0 and "Traceback" not in err
    assert "x[/bold]" in out
    assert "\x1b" not in out + err and "\x07" not in out + err


@pytest.mark.parametrize(
    ("line", "fragment"), [("cpus = 1e12", "[environment].cpus"), ("memory_mb = 1", "[environment].memory_mb")]
)
async def test_resource_values_no_engine_accepts_are_an_invalid_task(tmp_path, capsys, line, fragment):
    task = write_task(tmp_path, environment_toml=line)
    code, out, err = await _check(capsys, str(task))
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and fragment in err and "outside what a container engine accepts" in err
