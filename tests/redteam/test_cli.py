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
    code, _out, err = await _check(capsys, str(task))
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and fragment in err and "outside what a container engine accepts" in err


@pytest.mark.parametrize("encoding", ["utf-8:surrogateescape", "utf-8:strict"])
async def test_a_report_name_that_is_not_utf8_is_printed_as_inert_text(tmp_path, no_leaks, encoding):
    """The embedded backend lists /logs/verifier from the host: a report named with the byte 0x9b
    (an 8-bit CSI: followed by "[2J", clear the screen) reached the error line as it was, raw on a
    terminal that takes stdout's undecodable bytes back, a traceback on one that is strict UTF-8."""
    import asyncio
    import os
    import subprocess
    import sys

    from tests.helpers import REPO_ROOT

    test_sh = "#!/bin/sh\necho 'not xml' > \"/logs/verifier/$(printf '\\233[2J')x.xml\"\n"
    task = write_task(tmp_path, test_sh=test_sh)
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "termgym", "check", str(task)],
        capture_output=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONIOENCODING": encoding, "PYTHONPATH": str(REPO_ROOT)},  # this checkout's termgym
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode in (0, 1) and b"Traceback" not in output, output[-2000:]
    assert b"unparseable report" in result.stdout, output[-2000:]  # the error line was printed
    assert b"\x9b" not in output
    output.decode("utf-8")  # valid UTF-8 throughout: no lone surrogate written out either
