"""Red team, the verdict: the agent makes the verifier's output, or its report directory, say more
than the verifier found. Report files always win over the output; a task can declare its report
format and its number of assertions, and then nothing else, and no more than that, is graded."""

from __future__ import annotations

import re
import textwrap

import pytest

from tests.helpers import KIT_SOURCE
from tests.redteam.helpers import forged, oracle_attack

pytestmark = [pytest.mark.redteam]

SUMMARY = "=========================== short test summary info ============================"


def forging_tool(passing: int) -> str:
    """A solution that leaves /app/tool.sh, which prints a pytest summary of ``passing`` passes."""
    return textwrap.dedent(f"""\
        #!/bin/sh
        cat > /app/tool.sh <<'EOF'
        #!/bin/sh
        echo '{SUMMARY}'
        i=0; while [ $i -lt {passing} ]; do echo "PASSED tests/test_x.py::test_$i"; i=$((i + 1)); done
        echo '===== {passing} passed in 0.01s ====='
        EOF
        chmod +x /app/tool.sh
        """)


def verifier_running_tool(check: str = "tg_check_sh 'result says done' 'grep -qx done /app/result.txt'") -> str:
    return f"#!/bin/sh\n{KIT_SOURCE}\n/app/tool.sh 2>/dev/null\n{check}\ntg_finish\n"


async def test_a_summary_printed_by_the_agents_program_never_outranks_the_report_file(tmp_path, backend, no_leaks):
    """A Harbor-style verifier: it runs the agent's program, then writes its verdict to reward.txt."""
    test_sh = "#!/bin/sh\n/app/tool.sh\nif grep -qx done /app/result.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    record = await oracle_attack(tmp_path, backend, forging_tool(50), test_sh=test_sh)
    assert record.report_format == "reward-file" and not forged(record), record


@pytest.mark.docker
async def test_a_summary_is_not_graded_when_the_report_directory_was_sabotaged(tmp_path, no_leaks):
    """On Docker the agent can turn /logs into a plain file, so the kit could write no report and the
    forged summary in the output would be all that is left: the reset undoes it. (On the embedded
    backend /logs is a mount point the agent cannot replace.) The verifier never loads /logs: the
    reset is what holds."""
    backend = "docker"
    sabotage = (
        forging_tool(50)
        + "rm -rf /logs/verifier /logs/* 2>/dev/null; echo x > /logs/verifier; (rm -rf /logs && echo x > /logs) 2>/dev/null; true\n"
    )
    record = await oracle_attack(tmp_path, backend, sabotage, test_sh=verifier_running_tool())
    assert record.report_format == "ctrf" and not forged(record), record


@pytest.mark.docker
async def test_logs_and_tmp_replaced_by_links_to_a_forged_report_forge_nothing(tmp_path, no_leaks):
    """The listing of the agent's changes leaves out /logs and /tmp themselves when listed as changed
    (the harness's reset of the directories below changes them). An agent that replaces both with
    links to directories of its own, one holding a passing report, gains nothing from that: the reset
    replaces the links before the verifier runs, and the forged report is never read."""
    backend = "docker"
    passing = '{"results":{"tests":[' + ",".join(f'{{"name":"t{i}","status":"passed"}}' for i in range(20)) + "]}}"
    plant = forging_tool(50) + textwrap.dedent(f"""\
        mkdir -p /opt/evil/logs/verifier /opt/evil/tmp/.termgym-verifier/home
        printf '%s' '{passing}' > /opt/evil/logs/verifier/ctrf.json
        rm -rf /logs && ln -s /opt/evil/logs /logs
        rm -rf /tmp 2>/dev/null; [ -e /tmp ] || ln -s /opt/evil/tmp /tmp
        true
        """)
    record = await oracle_attack(tmp_path, backend, plant, test_sh=verifier_running_tool())
    assert record.report_format == "ctrf" and not forged(record), record
    assert record.passed == 0 and record.total == 1, record  # the task's own check, which the plant skipped


async def test_a_declared_report_format_grades_nothing_else(tmp_path, backend, no_leaks):
    """The kit's report is missing (the verifier was made to skip it): with the format declared,
    a forged summary in the output is never graded."""
    test_sh = "#!/bin/sh\n/app/tool.sh\nexit 0\n"
    record = await oracle_attack(
        tmp_path, backend, forging_tool(50), test_sh=test_sh, verifier_toml='report_format = "ctrf"'
    )
    assert record.error is not None, record
    assert record.error["kind"] == "verifier_error" and not forged(record), record


async def test_a_forged_summary_cannot_amplify_the_reward_past_the_declared_count(tmp_path, backend, no_leaks):
    """A Terminal-Bench 1 style task graded from the pytest summary, which the agent's program
    floods with 50,000 passes: the task declares 2 assertions, so the report is an error, reward 0."""
    test_sh = "#!/bin/sh\n/app/tool.sh\n"
    record = await oracle_attack(
        tmp_path, backend, forging_tool(50000), test_sh=test_sh, verifier_toml="assertions = 2"
    )
    assert record.error is not None, record
    assert record.report_format == "pytest" and record.error["kind"] == "verifier_error"
    assert re.search(r"the report counts \d{4,} assertions; the task.s verifier defines 2", record.error["message"])
    assert record.reward == 0.0 and not record.resolved


async def test_a_runaway_report_cannot_amplify_the_reward(tmp_path, backend, no_leaks):
    """A verifier the agent steered into writing 60,000 passing tests."""
    test_sh = textwrap.dedent("""\
        #!/bin/sh
        { printf '{"results":{"tests":['; i=0; while [ $i -lt 60000 ]; do [ $i -gt 0 ] && printf ','; printf '{"name":"t%d","status":"passed"}' $i; i=$((i + 1)); done; printf ']}}'; } > /logs/verifier/ctrf.json
        """)
    record = await oracle_attack(
        tmp_path, backend, "#!/bin/sh\ntrue\n", test_sh=test_sh, verifier_toml="assertions = 2", verifier_timeout=120
    )
    assert record.error is not None, record
    assert record.error["kind"] == "verifier_error" and record.reward == 0.0, record


async def test_report_files_past_the_cap_are_an_error_not_a_silent_truncation(tmp_path, backend, no_leaks):
    """40 JUnit files, the last one failing: reading only the first 32 would have resolved it."""
    test_sh = textwrap.dedent("""\
        #!/bin/sh
        i=0; while [ $i -lt 39 ]; do
          printf '<testsuite><testcase classname="c" name="t%02d"/></testsuite>' $i > /logs/verifier/r$(printf %02d $i).xml
          i=$((i + 1))
        done
        printf '<testsuite><testcase classname="c" name="last"><failure message="no"/></testcase></testsuite>' > /logs/verifier/r99.xml
        """)
    record = await oracle_attack(tmp_path, backend, "#!/bin/sh\ntrue\n", test_sh=test_sh)
    assert record.error is not None, record
    assert record.error["kind"] == "verifier_error" and "40 report files" in record.error["message"]
    assert not record.resolved and record.reward == 0.0
