"""A Terminal-Bench 1 task end to end: task.yaml, run-tests.sh with TEST_DIR, pytest -rA summary."""

from __future__ import annotations

import textwrap

from termgym.agents import NullAgent, OracleAgent
from termgym.episode.options import EnvOptions
from termgym.images.build import BASE_IMAGE
from termgym.tasks import load_task

# run-tests.sh prints what `pytest -rA` prints (the sandbox has no pytest): the harness must find
from termgym.trial import run_trial

# run-tests.sh prints what `pytest -rA` prints (the sandbox has no pytest): the harness must find
# the tests through TEST_DIR and grade from the short test summary.
RUN_TESTS = textwrap.dedent("""\
    #!/bin/bash
    cd "$TEST_DIR"
    check() { if eval "$2"; then echo "PASSED test_outputs.py::$1"; else echo "FAILED test_outputs.py::$1 - assert failed"; fi; }
    echo "============================= test session starts =============================="
    echo "=========================== short test summary info ============================"
    check test_file_exists "test -f /app/hello.txt"
    check test_content "grep -qx hello /app/hello.txt"
    check test_expected_matches "cmp -s /app/hello.txt $TEST_DIR/expected.txt"
    echo "========================= 3 passed in 0.01s ========================="
    """)


ON_THE_HOST = {"ubuntu:24.04": BASE_IMAGE}


def write_tb1_task(root):
    task = root / "hello-tb1"
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text(
        "instruction: Write hello into /app/hello.txt\ndifficulty: easy\ncategory: basics\nmax_agent_timeout_sec: 30\n"
    )
    (task / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task / "docker-compose.yaml").write_text("services:\n  client:\n    build: .\n    command: sleep infinity\n")
    (task / "solution.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    (task / "run-tests.sh").write_text(RUN_TESTS)
    (task / "tests" / "expected.txt").write_text("hello\n")
    return task


async def test_tb1_task_runs_with_its_harness_contract(tmp_path, no_leaks):
    task = load_task(write_tb1_task(tmp_path))
    assert task.layout == "tb1" and task.agent_timeout_sec == 30 and task.verifier_timeout_sec == 60
    options = EnvOptions(image_aliases=ON_THE_HOST)  # offline: ubuntu:24.04 on the host's system
    oracle = await run_trial(task, OracleAgent(), options)
    assert oracle.error is None, oracle
    assert oracle.report_format == "pytest" and oracle.resolved and oracle.passed == 3
    assert oracle.reward == 3 / 20
    null = await run_trial(task, NullAgent(), options)
    assert null.report_format == "pytest" and null.passed == 0 and null.total == 3
