"""When the tamper check traces (termgym.episode.guard): every step until the agent's changes are
known; after that only while one of them could be found loaded; and a traced verifier ends as an
untraced one does. Real trials on the embedded backend (and on Docker where said)."""

from __future__ import annotations

from pathlib import Path

import pytest

from termgym.agents.basic import ScriptedAgent
from termgym.episode import guard
from termgym.episode.guard import outside_work
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import KIT_SOURCE, write_task


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands the tamper check ran under the sandbox's tracer, in order."""
    calls: list[list[str]] = []
    original = guard.exec_traced

    async def spy(sandbox, command):
        calls.append(list(command.argv))
        return await original(sandbox, command)

    monkeypatch.setattr(guard, "exec_traced", spy)
    return calls


@pytest.mark.parametrize(
    ("command", "traces"),
    [
        ("echo done > /app/result.txt", False),  # the agent's work only: nothing to find loaded
        ("echo done > /app/result.txt; mkdir -p /app/lib && echo x > /app/lib/tool.py", False),
        ("echo done > /app/result.txt; printf '#!/bin/sh\\n' > /tmp/helper.sh", True),  # an added file outside
        ("echo done > /app/result.txt; mkdir -p /root/.config && echo x > /root/.config/tool.ini", True),
    ],
)
async def test_the_verifier_is_traced_only_while_a_change_outside_the_work_could_be_loaded(
    tmp_path: Path, traced: list[list[str]], command: str, traces: bool
) -> None:
    task = load_task(write_task(tmp_path))
    record = await run_trial(task, ScriptedAgent((command,)), EnvOptions())
    assert record.error is None
    assert record.resolved
    assert (["/tests/test.sh"] in traced) is traces


async def test_a_forged_tool_outside_the_work_is_still_found_when_traces_are_skipped_elsewhere(
    tmp_path: Path, traced: list[list[str]]
) -> None:
    """The same task whose verifier runs a helper from /tmp: planted there by the agent, it is
    found loaded (the step was traced because the change was there to be found)."""
    test_sh = "#!/bin/sh\n[ -x /tmp/helper.sh ] && /tmp/helper.sh\ngrep -q done /app/result.txt\n"
    task = load_task(write_task(tmp_path, test_sh=test_sh))
    plant = "echo done > /app/result.txt; printf '#!/bin/sh\\nexit 0\\n' > /tmp/helper.sh; chmod +x /tmp/helper.sh"
    record = await run_trial(task, ScriptedAgent((plant,)), EnvOptions())
    assert ["/tests/test.sh"] in traced
    assert record.error is not None and record.error["kind"] == "tampered"
    assert "/tmp/helper.sh" in record.error["message"]


SERVERS_LEFT_RUNNING = f"""#!/bin/sh
{KIT_SOURCE}
sleep 600 &
setsid sh -c 'sleep 601' >/dev/null 2>&1 &
tg_check "result says done" grep -qx done /app/result.txt
tg_finish
"""


async def test_a_traced_verifier_ends_with_its_script_not_with_what_the_script_left_running(
    tmp_path: Path, traced: list[list[str]], backend: str, no_leaks
) -> None:
    """An honest helper in /tmp has the verifier traced. The servers its test script leaves running
    (one holding its output, one in a session of its own) end with the script, as they do untraced:
    before, the tracer waited for them, and the honest trial was a ``verifier_timeout``."""
    task = load_task(write_task(tmp_path, test_sh=SERVERS_LEFT_RUNNING, verifier_timeout=30))
    command = "echo done > /app/result.txt; printf '#!/bin/sh\\n' > /tmp/helper.sh"
    record = await run_trial(task, ScriptedAgent((command,)), EnvOptions(backend=backend))
    assert ["/tests/test.sh"] in traced
    assert record.error is None and record.resolved, record


@pytest.mark.parametrize("traces", [False, True])
async def test_a_test_script_ended_by_a_signal_is_a_verifier_error_traced_or_not(
    tmp_path: Path, traced: list[list[str]], backend: str, traces: bool, no_leaks
) -> None:
    """Status 128 + N for signal N, as a shell and Docker's exec give it, on both backends and
    whether the verifier was traced or not (the embedded backend said -9 untraced, and nothing
    then told it from an ordinary failure)."""
    task = load_task(write_task(tmp_path, test_sh="#!/bin/sh\necho started\nkill -9 $$\n"))
    command = "echo done > /app/result.txt" + ("; echo x > /tmp/note.txt" if traces else "")
    record = await run_trial(task, ScriptedAgent((command,)), EnvOptions(backend=backend))
    assert (["/tests/test.sh"] in traced) is traces
    assert record.error == {"kind": "verifier_error", "message": "test script exited 137"}, record


def test_the_harness_resetting_its_directories_is_not_the_agents_change():
    """The listing runs beside the harness's reset of /logs/verifier and /tmp/.termgym-verifier: a
    listing that caught the reset half-way lists /logs or /tmp as changed, which is the harness's
    doing (seen failing an honest trial whose verifier ran untraced); over an image without /logs
    it lists /logs as added (seen failing every honest trial of ``bench/verification.py``'s
    variant without a tracer, on the embedded backend). What the agent put beside the harness's
    directories still counts."""
    changes = {"/logs": "C", "/logs/verifier": "D", "/tmp": "C", "/logs/evil.py": "A", "/tmp/tool.sh": "A"}
    assert outside_work(changes, ("/app",)) == {"/logs/evil.py": "A", "/tmp/tool.sh": "A"}
    assert outside_work({"/logs": "A", "/tmp": "A", "/logs/evil.py": "A"}, ("/app",)) == {"/logs/evil.py": "A"}
    assert outside_work({"/logs": "D", "/usr": "C"}, ()) == {"/logs": "D", "/usr": "C"}  # only a change of them
