"""Tests for termgym.tasks' Harbor features: both Terminal-Bench 2 schema generations, healthcheck,
users, per-phase network, ``[[steps]]``, unknown keys as warnings, and Terminal-Bench 1's
``T_BENCH_*`` compose variables. The directories under ``fixtures/tasks`` are realistic copies of
each format."""

from __future__ import annotations

from pathlib import Path

import pytest

from termgym.images.build import BASE_IMAGE
from termgym.tasks import (
    Healthcheck,
    Resources,
    TaskError,
    compose_variables,
    discover_tasks,
    fill_compose,
    load_task,
)
from tests.helpers import termgym
from tests.termgym.cli.test_cli import one_line_error
from tests.termgym.tasks.test_tasks import assert_task_error, harbor_task, tb1_task, write

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


# --- the two Terminal-Bench 2 schema generations, unchanged ---------------------------------


def test_tb2_version_1_0_loads_unchanged():
    task = load_task(FIXTURES / "tb2-v1.0-csv-stats")
    assert task.name == "tb2-v1.0-csv-stats" and task.layout == "harbor"
    assert task.family == "data-processing"
    assert task.instruction.startswith("The file /app/sales.csv has a header line")
    assert task.resources == Resources(cpus=1.0, memory_mb=2048, storage_mb=10240)
    assert (task.agent_timeout_sec, task.verifier_timeout_sec, task.build_timeout_sec) == (900.0, 900.0, 600.0)
    assert task.docker_image is None and task.dockerfile == task.path / "environment" / "Dockerfile"
    assert task.network is True and task.agent_network is None and task.verifier_network is None
    assert dict(task.metadata) == {
        "author_name": "Jane Doe",
        "author_email": "jane@example.com",
        "difficulty": "medium",
        "category": "data-processing",
        "tags": ["csv", "shell"],
        "expert_time_estimate_min": 20.0,
        "junior_time_estimate_min": 60.0,
    }
    assert task.solution_script == "solve.sh" and task.test_script == "test.sh"
    assert task.steps == () and task.healthcheck is None
    assert task.agent_user is None and task.verifier_user is None
    assert task.multi_step_reward_strategy == "mean"
    assert task.warnings == ()


def test_tb2_schema_1_1_loads_unchanged():
    task = load_task(FIXTURES / "tb2-v1.1-log-summary")
    assert task.name == "terminal-bench/log-summary"
    assert task.family == "text-processing"
    assert task.docker_image == "alexgshaw/log-summary:20251031"
    assert task.dockerfile == task.path / "environment" / "Dockerfile"
    assert task.resources == Resources(cpus=2.0, memory_mb=4096, storage_mb=10240)
    assert (task.agent_timeout_sec, task.verifier_timeout_sec) == (900.0, 600.0)
    assert dict(task.environment_env) == {} and dict(task.verifier_env) == {}
    assert task.network is True
    assert task.metadata["difficulty"] == "easy" and task.metadata["expert_time_estimate_min"] == 10
    assert [relative for _, relative in task.solution_files()] == ["solve.sh"]
    assert task.warnings == ()


def test_discover_the_fixtures():
    tasks = {task.name: task for task in discover_tasks(FIXTURES)}
    assert sorted(tasks) == ["tb1-word-count", "tb2-v1.0-csv-stats", "termgym/two-steps", "terminal-bench/log-summary"]
    assert all(task.warnings == () for task in tasks.values())


# --- multi-step tasks, healthcheck, users, per-phase network ---------------------------------


def test_multi_step_fixture():
    task = load_task(FIXTURES / "harbor-multi-step")
    steps_dir = task.path / "steps"
    assert [step.name for step in task.steps] == ["make-dir", "write-file"]
    make_dir, write_file = task.steps
    assert make_dir.instruction == "Create the directory /app/notes.\n"
    assert make_dir.tests_dir == steps_dir / "make-dir" / "tests"
    assert write_file.tests_dir == task.path / "tests"  # no test.sh of its own: the task's
    assert make_dir.solution_dir == steps_dir / "make-dir" / "solution" and make_dir.solution_script == "solve.sh"
    assert (make_dir.agent_timeout_sec, make_dir.verifier_timeout_sec) == (30.0, 60.0)
    assert (write_file.agent_timeout_sec, write_file.verifier_timeout_sec) == (120.0, 20.0)
    # the task's own fields are the first step's, so a single-step runtime runs step one
    assert task.instruction == make_dir.instruction and task.tests_dir == make_dir.tests_dir
    assert task.solution_dir == make_dir.solution_dir
    assert task.multi_step_reward_strategy == "final"
    assert task.healthcheck == Healthcheck(
        command="test -d /app", interval_sec=1.0, timeout_sec=5.0, start_period_sec=2.0, retries=4
    )
    assert task.agent_user == "agent" and task.verifier_user == "0"
    assert task.network is True and task.agent_network is False and task.verifier_network is True
    assert task.artifacts == ("/app/notes", "/app/report.txt")
    assert task.warnings == ()


def test_step_files_overlay_the_task_tests():
    task = load_task(FIXTURES / "harbor-multi-step")
    make_dir, write_file = task.steps
    files = task.step_test_files(make_dir)
    assert [relative for _, relative in files] == ["helpers.sh", "test.sh"]
    assert dict((relative, host) for host, relative in files) == {
        "helpers.sh": task.path / "tests" / "helpers.sh",
        "test.sh": task.path / "steps" / "make-dir" / "tests" / "test.sh",
    }
    assert [host for host, _ in task.step_test_files(write_file)] == [
        task.path / "tests" / "helpers.sh",
        task.path / "tests" / "test.sh",
    ]
    assert task.step_solution_files(write_file) == [
        (task.path / "steps" / "write-file" / "solution" / "solve.sh", "solve.sh")
    ]


def test_step_falls_back_to_the_task_solution(tmp_path):
    task_dir = harbor_task(tmp_path, toml='[[steps]]\nname = "one"\n')
    write(task_dir / "steps" / "one" / "instruction.md", "Step one.\n")
    (step,) = load_task(task_dir).steps
    assert step.solution_dir == task_dir / "solution" and step.solution_script == "solve.sh"
    assert step.tests_dir == task_dir / "tests"


def test_multi_step_needs_no_top_level_instruction_or_tests(tmp_path):
    task_dir = harbor_task(tmp_path, toml='[[steps]]\nname = "only"\n', instruction=None, test_sh=False)
    write(task_dir / "steps" / "only" / "instruction.md", "Do it.\n")
    write(task_dir / "steps" / "only" / "tests" / "test.sh", "#!/bin/sh\n")
    task = load_task(task_dir)
    assert task.instruction == "Do it.\n" and task.tests_dir == task_dir / "steps" / "only" / "tests"


def test_empty_steps_is_a_single_step_task(tmp_path):
    task = load_task(harbor_task(tmp_path, toml="steps = []\n"))
    assert task.steps == () and task.instruction == "Print hello.\n"


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[environment.healthcheck]\ncommand = "true"', Healthcheck("true")),
        (
            '[environment.healthcheck]\ncommand = "pg_isready"\ninterval_sec = 0\nstart_interval_sec = 0.5\nretries = 0',
            Healthcheck("pg_isready", interval_sec=0.0, start_interval_sec=0.5, retries=0),
        ),
    ],
)
def test_healthcheck_defaults(tmp_path, toml, expected):
    assert load_task(harbor_task(tmp_path, toml=toml)).healthcheck == expected


@pytest.mark.parametrize(
    ("toml", "agent_user", "verifier_user"),
    [
        ('[agent]\nuser = "agent"', "agent", None),
        ("[verifier]\nuser = 1000", None, "1000"),
        ('[agent]\nuser = "1000:1000"\n[verifier]\nuser = "root"', "1000:1000", "root"),
        ('[agent]\nuser = "agent:staff"', "agent:staff", None),
    ],
)
def test_users(tmp_path, toml, agent_user, verifier_user):
    task = load_task(harbor_task(tmp_path, toml=toml))
    assert (task.agent_user, task.verifier_user) == (agent_user, verifier_user)


@pytest.mark.parametrize(
    ("toml", "network", "agent_network", "verifier_network"),
    [
        ("", True, None, None),
        ('[agent]\nnetwork_mode = "no-network"', True, False, None),
        ('[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"', False, None, True),
        ("[agent]\nallow_internet = false\n[verifier]\nallow_internet = true", True, False, True),
        ('[agent]\nnetwork_mode = "public"\nallow_internet = false', True, True, None),  # the mode wins
    ],
)
def test_network_per_phase(tmp_path, toml, network, agent_network, verifier_network):
    task = load_task(harbor_task(tmp_path, toml=toml))
    assert (task.network, task.agent_network, task.verifier_network) == (network, agent_network, verifier_network)
    assert task.warnings == ()


def test_allowlist_is_network_with_a_warning(tmp_path):
    task = load_task(harbor_task(tmp_path, toml='[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]'))
    assert task.agent_network is True
    assert task.warnings == (
        'task.toml: [agent].network_mode = "allowlist" is not enforced by termgym: '
        "the sandbox gets the whole network, not only pypi.org",
    )


# --- unknown keys and keys termgym does not act on: warnings, never errors --------------------


def test_unknown_keys_are_warnings_naming_them(tmp_path):
    toml = """\
        future = 1
        [task]
        name = "org/t"
        color = "red"
        [agent]
        speed = 2
        [environment]
        foo = "bar"
        [environment.healthcheck]
        command = "true"
        jitter = 1
        [verifier]
        timeout_sec = 10
        [extra]
        x = 1
        [[steps]]
        name = "one"
        mood = "calm"
        [steps.agent]
        nap_sec = 1
        """
    task_dir = harbor_task(tmp_path, toml="\n".join(line.strip() for line in toml.splitlines()))
    write(task_dir / "steps" / "one" / "instruction.md", "One.\n")
    task = load_task(task_dir)
    assert task.warnings == (
        "task.toml: unknown key future ignored",
        "task.toml: unknown key extra ignored",
        "task.toml: unknown key [task].color ignored",
        "task.toml: unknown key [agent].speed ignored",
        "task.toml: unknown key [environment].foo ignored",
        "task.toml: unknown key [environment].healthcheck.jitter ignored",
        "task.toml: unknown key steps[0].mood ignored",
        "task.toml: unknown key steps[0].agent.nap_sec ignored",
    )
    assert task.verifier_timeout_sec == 10 and task.healthcheck == Healthcheck("true")


@pytest.mark.parametrize(
    ("toml", "fragment"),
    [
        ("[environment]\ngpus = 1", "[environment].gpus = 1: termgym attaches no GPUs; ignored"),
        ('[environment]\ngpu_types = ["H100"]', "[environment].gpu_types (1 GPU types) not supported"),
        ('[environment.tpu]\ntype = "v6e"\ntopology = "2x4"', "[environment].tpu: termgym attaches no TPUs"),
        (
            '[[environment.mcp_servers]]\nname = "docs"\nurl = "http://docs:8000/sse"',
            "[environment].mcp_servers (1 MCP servers) not supported",
        ),
        ('[environment]\nskills_dir = "/skills"', "[environment].skills_dir = '/skills' not supported"),
        ('[solution.env]\nTOKEN = "x"', "[solution].env is not passed to the solution"),
        (
            'artifacts = [{ source = "/app/out", destination = "out" }]',
            "artifacts[0].destination not supported by termgym; ignored",
        ),
    ],
)
def test_unsupported_keys_warn(tmp_path, toml, fragment):
    task = load_task(harbor_task(tmp_path, toml=toml))
    assert len(task.warnings) == 1 and task.warnings[0].startswith("task.toml: "), task.warnings
    assert fragment in task.warnings[0]


def test_unsupported_step_keys_warn(tmp_path):
    toml = '[[steps]]\nname = "one"\nmin_reward = 1.0\n[steps.agent]\nuser = "agent"\n[steps.verifier]\nenv = {}\n'
    task_dir = harbor_task(tmp_path, toml=toml)
    write(task_dir / "steps" / "one" / "instruction.md", "One.\n")
    write(task_dir / "steps" / "one" / "workdir" / "setup.sh", "#!/bin/sh\n")
    assert load_task(task_dir).warnings == (
        "task.toml: steps[0].agent.user (per step) not supported by termgym yet; ignored",
        "task.toml: steps[0].verifier.env (per step) not supported by termgym yet; ignored",
        "task.toml: steps[0].min_reward (per step) not supported by termgym yet; ignored",
        "task.toml: steps/one/workdir (files and setup.sh) not supported by termgym yet; ignored",
    )


def test_empty_or_default_unsupported_keys_are_silent(tmp_path):
    toml = '[environment]\ngpus = 0\ngpu_types = []\nmcp_servers = []\nos = "Linux"\n[solution.env]\n'
    assert load_task(harbor_task(tmp_path, toml=toml)).warnings == ()


# --- malformed entries: one line naming the file and the key ---------------------------------


@pytest.mark.parametrize(
    ("toml", "fragments"),
    [
        ('[environment]\nhealthcheck = "true"', ["[environment].healthcheck must be a table"]),
        ("[environment.healthcheck]\ninterval_sec = 1", ["[environment].healthcheck.command must be a non-empty"]),
        ('[environment.healthcheck]\ncommand = " "', ["[environment].healthcheck.command"]),
        ('[environment.healthcheck]\ncommand = "x"\nretries = -1', ["[environment].healthcheck.retries must be"]),
        ('[environment.healthcheck]\ncommand = "x"\nretries = "3"', ["[environment].healthcheck.retries"]),
        (
            '[environment.healthcheck]\ncommand = "x"\ntimeout_sec = 0',
            ["[environment].healthcheck.timeout_sec", "positive"],
        ),
        ('[environment.healthcheck]\ncommand = "x"\ninterval_sec = -1', ["healthcheck.interval_sec", "non-negative"]),
        ('[agent]\nuser = ""', ["[agent].user must be a user name or uid"]),
        ('[agent]\nuser = "a b"', ["[agent].user"]),
        ("[verifier]\nuser = true", ["[verifier].user"]),
        ("[verifier]\nuser = -1", ["[verifier].user"]),
        ('[agent]\nnetwork_mode = "offline"', ["[agent].network_mode must be one of"]),
        ('[verifier]\nallow_internet = "yes"', ["[verifier].allow_internet must be true or false"]),
        ('[agent]\nnetwork_mode = "allowlist"', ["[agent].network_mode", "needs a non-empty allowed_hosts"]),
        ('[environment]\nallowed_hosts = ["pypi.org"]', ["[environment].allowed_hosts is only valid with"]),
        ('[agent]\nnetwork_mode = "public"\nallowed_hosts = ["a.org"]', ["[agent].allowed_hosts is only valid"]),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = "a.org"', ["[agent].allowed_hosts must be a list"]),
        ("[steps]\nx = 1", ["steps must be an array of tables"]),
        ("steps = [1]", ["steps[0] must be a table"]),
        ("[[steps]]\ntimeout_sec = 1", ["steps[0].name must be a directory name"]),
        ('[[steps]]\nname = "../up"', ["steps[0].name must be a directory name", "'../up'"]),
        ('[[steps]]\nname = "s"\nagent = 5', ["steps[0].agent must be a table"]),
        ('multi_step_reward_strategy = "max"', ["multi_step_reward_strategy must be one of ['mean', 'final']"]),
        ('[environment]\nos = "windows"', ["[environment].os = 'windows'", "Linux sandboxes only"]),
        ('[environment]\nos = "macos"', ["[environment].os must be 'linux' or 'windows'"]),
        ("[environment]\ngpus = -1", ["[environment].gpus must be a non-negative integer"]),
        ('[environment]\nmcp_servers = "docs"', ["[environment].mcp_servers must be a list"]),
        ('artifacts = [{ destination = "x" }]', ["artifacts[0] must be an absolute path"]),
    ],
)
def test_malformed_entries(tmp_path, toml, fragments):
    task_dir = harbor_task(tmp_path, toml=toml)
    with pytest.raises(TaskError) as info:
        load_task(task_dir)
    assert_task_error(info.value, task_dir / "task.toml", *fragments)


@pytest.mark.parametrize(
    ("toml", "make", "file", "fragments"),
    [
        ('[[steps]]\nname = "s"', [], "steps/s", ["missing step directory for steps[0] ('s')"]),
        ('[[steps]]\nname = "s"', ["steps/s/tests/test.sh"], "steps/s/instruction.md", ["missing instruction"]),
        (
            '[[steps]]\nname = "s"\n[[steps]]\nname = "s"',
            ["steps/s/instruction.md"],
            "task.toml",
            ["steps[1].name 's' is used by two steps"],
        ),
        (
            '[[steps]]\nname = "s"\n[steps.verifier]\ntimeout_sec = -5',
            ["steps/s/instruction.md"],
            "task.toml",
            ["steps[0].verifier.timeout_sec must be a positive number"],
        ),
    ],
)
def test_malformed_steps(tmp_path, toml, make, file, fragments):
    task_dir = harbor_task(tmp_path, toml=toml)
    for relative in make:
        write(task_dir / relative, "x\n")
    with pytest.raises(TaskError) as info:
        load_task(task_dir)
    assert_task_error(info.value, task_dir / file, *fragments)


def test_step_without_any_test_script(tmp_path):
    task_dir = harbor_task(tmp_path, toml='[[steps]]\nname = "s"', test_sh=False)
    write(task_dir / "steps" / "s" / "instruction.md", "x\n")
    with pytest.raises(TaskError) as info:
        load_task(task_dir)
    assert_task_error(info.value, task_dir / "steps" / "s" / "tests" / "test.sh", "missing test script for step 's'")


@pytest.mark.parametrize(
    ("toml", "fragment"),
    [
        ('[environment.healthcheck]\ncommand = "x"\nretries = "many"', "[environment].healthcheck.retries"),
        ('artifacts = ["relative/path"]', "artifacts[0] must be an absolute path"),
        ("[[steps]]\nname = 3", "steps[0].name"),
    ],
)
def test_cli_malformed_entry_is_one_line_and_exit_2(tmp_path, toml, fragment):
    task_dir = harbor_task(tmp_path, toml=toml)
    result = termgym("check", str(task_dir))
    assert result.returncode == 2
    line = one_line_error(result)
    assert "task.toml" in line and fragment in line, line


# --- Terminal-Bench 1: T_BENCH_* compose variables --------------------------------------------


def test_compose_variables():
    variables = compose_variables("Text Processing/Word Count!")
    assert variables == {
        "T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME": "termgym-tb1-text-processing-word-count",
        "T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME": "termgym-tb1-text-processing-word-count-client",
        "T_BENCH_TASK_DOCKER_NAME_PREFIX": "termgym-tb1",
        "T_BENCH_TEST_DIR": "/tests",
        "T_BENCH_TASK_LOGS_PATH": "/tmp/termgym-tb1/logs",
        "T_BENCH_CONTAINER_LOGS_PATH": "/logs",
        "T_BENCH_TASK_AGENT_LOGS_PATH": "/tmp/termgym-tb1/agent-logs",
        "T_BENCH_CONTAINER_AGENT_LOGS_PATH": "/agent-logs",
    }
    assert compose_variables("!!!")["T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME"] == "termgym-tb1-task"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${A}", "1"),
        ("$A/x", "1/x"),
        ("${A}${B}", "1"),  # B is set and empty
        ("${MISSING}|$MISSING", "|"),
        ("${MISSING:-d}", "d"),
        ("${B:-d}", "d"),  # :- also replaces an empty value
        ("${B-d}", ""),  # - only an unset one
        ("${MISSING-d}", "d"),
        ("${A:-d}", "1"),
        ("$$A", "$A"),
        ("${A:?required}", "${A:?required}"),  # other forms stay as written
        ("TEST_DIR=${T_BENCH_TEST_DIR}", "TEST_DIR=/tests"),
    ],
)
def test_fill_compose(text, expected):
    assert fill_compose(text, {"A": "1", "B": "", "T_BENCH_TEST_DIR": "/tests"}) == expected


def test_tb1_fixture_fills_the_compose_variables(monkeypatch):
    monkeypatch.delenv("TERMGYM_FIXTURE_UNSET_LEVEL", raising=False)
    task = load_task(FIXTURES / "tb1-word-count")
    assert dict(task.environment_env) == {
        "TEST_DIR": "/tests",
        "DATA_DIR": "/tests/data",
        "LOG_LEVEL": "info",
        "PRICE": "$5",
    }
    assert task.workdir == "/app"
    assert (task.agent_timeout_sec, task.verifier_timeout_sec) == (180.0, 30.0)
    assert task.warnings == ()
    monkeypatch.setenv("TERMGYM_FIXTURE_UNSET_LEVEL", "debug")
    assert load_task(FIXTURES / "tb1-word-count").environment_env["LOG_LEVEL"] == "debug"


@pytest.mark.parametrize(
    ("compose", "env", "workdir"),
    [
        ("services:\n  client:\n    build: .\n", {"TEST_DIR": "/tests"}, None),
        ("", {"TEST_DIR": "/tests"}, None),
        (
            "services:\n  client:\n    environment:\n      N: 3\n      FLAG: true\n",
            {"TEST_DIR": "/tests", "N": "3", "FLAG": "true"},
            None,
        ),
        ("services:\n  main:\n    working_dir: /srv\n  db:\n    image: postgres\n", {"TEST_DIR": "/tests"}, "/srv"),
        ("services:\n  client:\n    environment:\n      - TEST_DIR=/elsewhere\n", {"TEST_DIR": "/elsewhere"}, None),
        ("services:\n  client:\n    environment:\n      - TG_SURELY_UNSET_VAR\n", {"TEST_DIR": "/tests"}, None),
    ],
)
def test_tb1_compose_extraction(tmp_path, compose, env, workdir):
    task_dir = tb1_task(tmp_path)
    write(task_dir / "docker-compose.yaml", compose)
    task = load_task(task_dir)
    assert dict(task.environment_env) == env and task.workdir == workdir


def test_tb1_compose_host_value_cannot_inject_yaml(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_H5A_VALUE", "x\n    working_dir: /evil\n    - y: z")
    task_dir = tb1_task(tmp_path)
    write(task_dir / "docker-compose.yaml", "services:\n  client:\n    environment:\n      - V=${TG_H5A_VALUE}\n")
    task = load_task(task_dir)
    assert task.environment_env["V"] == "x\n    working_dir: /evil\n    - y: z" and task.workdir is None


@pytest.mark.parametrize(
    ("compose", "fragment"),
    [
        ("services:\n  client:\n    image: ubuntu:24.04\n", "services.client.image = 'ubuntu:24.04' is not pulled"),
        ("services:\n  client:\n    build:\n      context: ./env\n", "services.client.build (context './env'"),
    ],
)
def test_tb1_compose_warnings(tmp_path, compose, fragment):
    task_dir = tb1_task(tmp_path)
    write(task_dir / "docker-compose.yaml", compose)
    (warning,) = load_task(task_dir).warnings
    assert warning.startswith("docker-compose.yaml: ") and fragment in warning


@pytest.mark.parametrize(
    ("compose", "fragment"),
    [
        ("services: [unclosed\n", "invalid YAML"),
        ("- a\n- b\n", "must be a mapping with a services mapping"),
        ("services:\n  client: 3\n", "services.client must be a mapping"),
        ("services:\n  client:\n    environment: 5\n", "services.client.environment must be a list or a mapping"),
        ("services:\n  client:\n    environment:\n      - 5\n", "entries must be KEY=VALUE strings"),
        ("services:\n  client:\n    working_dir: app\n", "services.client.working_dir must be an absolute path"),
    ],
)
def test_tb1_compose_errors(tmp_path, compose, fragment):
    task_dir = tb1_task(tmp_path)
    write(task_dir / "docker-compose.yaml", compose)
    with pytest.raises(TaskError) as info:
        load_task(task_dir)
    assert_task_error(info.value, task_dir / "docker-compose.yaml", fragment)


async def test_tb1_compose_environment_reaches_the_tests(tmp_path, no_leaks):
    """End to end on the local backend: the compose file's filled-in environment is what the
    tests see (TB1's harness contract), and the record carries no loader warning."""
    from termgym.agents import OracleAgent
    from termgym.episode.options import EnvOptions
    from termgym.trial import run_trial

    task_dir = tb1_task(tmp_path, yaml_text="instruction: Write hi into /tmp/out.txt\nmax_agent_timeout_sec: 30\n")
    write(
        task_dir / "docker-compose.yaml",
        "services:\n  client:\n    build: .\n    environment:\n"
        "      - TEST_DIR=${T_BENCH_TEST_DIR}\n      - DATA_DIR=${T_BENCH_TEST_DIR}/data\n",
    )
    write(task_dir / "solution.sh", "#!/bin/bash\necho hi > /tmp/out.txt\n")
    write(
        task_dir / "run-tests.sh",
        "#!/bin/bash\n"
        'check() { if eval "$2"; then echo "PASSED test_outputs.py::$1"; else echo "FAILED test_outputs.py::$1"; fi; }\n'
        'echo "=========================== short test summary info ============================"\n'
        'check test_data_dir \'[ "$DATA_DIR" = /tests/data ] && [ -f "$TEST_DIR/test_outputs.py" ]\'\n'
        "check test_out 'grep -qx hi /tmp/out.txt'\n",
    )
    aliases = {"ubuntu:24.04": BASE_IMAGE}  # offline: the image on the host's system
    record = await run_trial(load_task(task_dir), OracleAgent(), EnvOptions(image_aliases=aliases))
    assert record.error is None, record
    assert record.report_format == "pytest" and record.passed == 2 and record.total == 2
    assert not any("task.toml" in warning or "compose" in warning for warning in record.warnings)
