"""Tests for termgym.tasks: Harbor / Terminal-Bench 2 and Terminal-Bench 1 task directories."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from termgym.tasks import Resources, Task, TaskError, discover_tasks, load_task

TB21_TOML = """\
schema_version = "1.1"

[metadata]
author_name = "Jane Doe"
author_email = "jane@example.com"
difficulty = "medium"
category = "data-processing"
tags = ["regex", "logs"]
expert_time_estimate_min = 30

[verifier]
timeout_sec = 900.0

[agent]
timeout_sec = 900.0

[environment]
build_timeout_sec = 600.0
docker_image = "alexgshaw/regex-log:20251031"
cpus = 1
memory_mb = 2048
storage_mb = 10240
allow_internet = true
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def harbor_task(
    parent: Path,
    name: str = "demo",
    toml: str = "",
    *,
    instruction: str | None = "Print hello.\n",
    dockerfile: bool = True,
    test_sh: bool = True,
    solve_sh: bool = True,
) -> Path:
    task = parent / name
    write(task / "task.toml", toml)
    if instruction is not None:
        write(task / "instruction.md", instruction)
    if dockerfile:
        write(task / "environment" / "Dockerfile", "FROM ubuntu:24.04\n")
    if test_sh:
        write(task / "tests" / "test.sh", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    if solve_sh:
        write(task / "solution" / "solve.sh", "#!/bin/bash\necho hello\n")
    return task


def tb1_task(
    parent: Path,
    name: str = "old",
    yaml_text: str = "instruction: Do the thing.\n",
    *,
    run_tests: bool = True,
    compose: bool = True,
    dockerfile: bool = True,
    solution: str | None = "solution.sh",
    tests: bool = True,
) -> Path:
    task = parent / name
    write(task / "task.yaml", yaml_text)
    if run_tests:
        write(task / "run-tests.sh", "#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n")
    if compose:
        write(task / "docker-compose.yaml", "services:\n  client:\n    build: .\n")
    if dockerfile:
        write(task / "Dockerfile", "FROM ubuntu:24.04\n")
    if solution is not None:
        write(task / solution, "echo solved\n")
    if tests:
        write(task / "tests" / "test_outputs.py", "def test_x():\n    pass\n")
    return task


def assert_task_error(exc: TaskError, file: Path, *fragments: str) -> None:
    message = str(exc)
    assert "\n" not in message
    assert message.startswith(f"{file}: "), message
    assert exc.path == file
    for fragment in fragments:
        assert fragment in message, message


# --- Harbor / Terminal-Bench 2 ----------------------------------------------------------------


def test_tb21_task(tmp_path):
    task_dir = harbor_task(tmp_path, "regex-log", TB21_TOML)
    write(task_dir / "environment" / "docker-compose.yaml", "services: {}\n")
    task = load_task(task_dir)
    assert task == Task(
        name="regex-log",
        family="data-processing",
        path=task_dir.resolve(),
        layout="harbor",
        instruction="Print hello.\n",
        environment_dir=task_dir / "environment",
        dockerfile=task_dir / "environment" / "Dockerfile",
        docker_image="alexgshaw/regex-log:20251031",
        compose_file=task_dir / "environment" / "docker-compose.yaml",
        solution_dir=task_dir / "solution",
        solution_script="solve.sh",
        tests_dir=task_dir / "tests",
        test_script="test.sh",
        agent_timeout_sec=900.0,
        verifier_timeout_sec=900.0,
        build_timeout_sec=600.0,
        resources=Resources(cpus=1.0, memory_mb=2048, storage_mb=10240),
        network=True,
        verifier_env={},
        environment_env={},
        workdir=None,
        metadata={
            "author_name": "Jane Doe",
            "author_email": "jane@example.com",
            "difficulty": "medium",
            "category": "data-processing",
            "tags": ["regex", "logs"],
            "expert_time_estimate_min": 30,
        },
    )
    assert isinstance(task.resources.cpus, float) and isinstance(task.agent_timeout_sec, float)


def test_harbor_defaults(tmp_path):
    task = load_task(harbor_task(tmp_path / "family-dir", "t", "", solve_sh=False))
    assert (task.name, task.family) == ("t", "family-dir")
    assert (task.agent_timeout_sec, task.verifier_timeout_sec, task.build_timeout_sec) == (900.0, 600.0, 600.0)
    assert task.resources == Resources(1.0, 2048, 10240)
    assert task.network is True
    assert (task.docker_image, task.compose_file, task.workdir) == (None, None, None)
    assert (task.solution_dir, task.solution_script, task.solution_files()) == (None, None, [])
    assert dict(task.metadata) == {} and dict(task.verifier_env) == {} and dict(task.environment_env) == {}


# (id, task.toml, attribute, expected)
HARBOR_FIELD_CASES = [
    ("legacy-version-key", 'version = "1.0"\n[agent]\ntimeout_sec = 120', "agent_timeout_sec", 120.0),
    ("task-name", '[task]\nname = "org/my-task"', "name", "org/my-task"),
    (
        "int-timeouts-become-float",
        "[verifier]\ntimeout_sec = 30\n[environment]\nbuild_timeout_sec = 45",
        "verifier_timeout_sec",
        30.0,
    ),
    ("build-timeout", "[environment]\nbuild_timeout_sec = 45.5", "build_timeout_sec", 45.5),
    (
        "resources",
        "[environment]\ncpus = 2.5\nmemory_mb = 4096\nstorage_mb = 20000",
        "resources",
        Resources(2.5, 4096, 20000),
    ),
    ("legacy-memory-G", '[environment]\nmemory = "2G"', "resources", Resources(memory_mb=2048)),
    ("legacy-memory-M", '[environment]\nmemory = "512M"', "resources", Resources(memory_mb=512)),
    ("legacy-memory-fraction", '[environment]\nmemory = "1.5g"', "resources", Resources(memory_mb=1536)),
    ("legacy-memory-K", '[environment]\nmemory = "8192K"', "resources", Resources(memory_mb=8)),
    ("legacy-memory-GB", '[environment]\nmemory = "4GB"', "resources", Resources(memory_mb=4096)),
    ("legacy-storage-T", '[environment]\nstorage = "1T"', "resources", Resources(storage_mb=1024 * 1024)),
    ("legacy-storage-10G", '[environment]\nstorage = "10G"', "resources", Resources(storage_mb=10240)),
    (
        "legacy-equal-to-new-key",
        '[environment]\nmemory = "1G"\nmemory_mb = 1024',
        "resources",
        Resources(memory_mb=1024),
    ),
    ("network-public", '[environment]\nnetwork_mode = "public"', "network", True),
    ("network-none", '[environment]\nnetwork_mode = "no-network"', "network", False),
    ("network-allowlist", '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]', "network", True),
    ("allow-internet-false", "[environment]\nallow_internet = false", "network", False),
    ("allow-internet-true", "[environment]\nallow_internet = true", "network", True),
    (
        "network-mode-beats-allow-internet",
        '[environment]\nallow_internet = false\nnetwork_mode = "public"',
        "network",
        True,
    ),
    ("workdir", '[environment]\nworkdir = "/app"', "workdir", "/app"),
    ("metadata-category-family", '[metadata]\ncategory = "security"', "family", "security"),
    ("blank-category-falls-back", '[metadata]\ncategory = " "', "family", "parent"),
    ("verifier-env", '[verifier.env]\nMODE = "strict"\nEMPTY = ""', "verifier_env", {"MODE": "strict", "EMPTY": ""}),
    ("environment-env-literal", '[environment.env]\nA = "1"', "environment_env", {"A": "1"}),
    (
        "env-host-default-used",
        '[environment.env]\nA = "${TG_TEST_UNSET_VAR:-fallback}"',
        "environment_env",
        {"A": "fallback"},
    ),
    (
        "env-host-value-wins",
        '[environment.env]\nA = "${TG_TEST_SET_VAR:-fallback}"',
        "environment_env",
        {"A": "from-host"},
    ),
    ("env-host-plain", '[verifier.env]\nA = "${TG_TEST_SET_VAR}"', "verifier_env", {"A": "from-host"}),
    (
        "env-not-whole-template-is-literal",
        '[verifier.env]\nA = "x-${TG_TEST_SET_VAR}"',
        "verifier_env",
        {"A": "x-${TG_TEST_SET_VAR}"},
    ),
    ("unknown-keys-ignored", 'future_key = 1\n[agent]\nuser = "agent"\n[extra]\nx = 1', "agent_timeout_sec", 900.0),
    ("report-format", '[verifier]\nreport_format = "ctrf"', "report_format", "ctrf"),
    ("report-format-default", "", "report_format", None),
    ("assertions", "[verifier]\nassertions = 7", "expected_assertions", 7),
    ("assertions-default", "", "expected_assertions", None),
    ("verifier-mode-default", "", "verifier_mode", "shared"),
    ("verifier-mode-separate", '[verifier]\nenvironment_mode = "separate"', "verifier_mode", "separate"),
    (
        "artifacts-paths-and-tables",
        'artifacts = ["/app/out.txt", { source = "/data/results/", destination = "r" }]\n',
        "artifacts",
        ("/app/out.txt", "/data/results"),
    ),
    (
        "resources-at-the-engine-bounds",
        "[environment]\ncpus = 0.01\nmemory_mb = 6\nstorage_mb = 1",
        "resources",
        Resources(0.01, 6, 1),
    ),
]


@pytest.mark.parametrize(
    ("toml", "attribute", "expected"), [c[1:] for c in HARBOR_FIELD_CASES], ids=[c[0] for c in HARBOR_FIELD_CASES]
)
def test_harbor_fields(tmp_path, monkeypatch, toml, attribute, expected):
    monkeypatch.setenv("TG_TEST_SET_VAR", "from-host")
    monkeypatch.delenv("TG_TEST_UNSET_VAR", raising=False)
    task = load_task(harbor_task(tmp_path / "parent", "t", toml))
    assert getattr(task, attribute) == expected


def test_docker_image_without_dockerfile(tmp_path):
    task = load_task(harbor_task(tmp_path, "t", '[environment]\ndocker_image = "img:1"', dockerfile=False))
    assert (task.dockerfile, task.docker_image) == (None, "img:1")
    assert task.environment_dir == (tmp_path / "t" / "environment").resolve()


def test_harbor_files(tmp_path):
    task_dir = harbor_task(tmp_path, "t", "")
    write(task_dir / "tests" / "test_outputs.py", "")
    write(task_dir / "tests" / "data" / "b.txt", "")
    write(task_dir / "tests" / "data" / "a.txt", "")
    write(task_dir / "solution" / "lib" / "helper.py", "")
    task = load_task(task_dir)
    tests = (task_dir / "tests").resolve()
    assert task.test_files() == [
        (tests / "data" / "a.txt", "data/a.txt"),
        (tests / "data" / "b.txt", "data/b.txt"),
        (tests / "test.sh", "test.sh"),
        (tests / "test_outputs.py", "test_outputs.py"),
    ]
    solution = (task_dir / "solution").resolve()
    assert task.solution_files() == [
        (solution / "lib" / "helper.py", "lib/helper.py"),
        (solution / "solve.sh", "solve.sh"),
    ]


def test_solution_dir_without_solve_sh(tmp_path):
    task_dir = harbor_task(tmp_path, "t", "", solve_sh=False)
    write(task_dir / "solution" / "notes.txt", "")
    task = load_task(task_dir)
    assert task.solution_dir == task_dir / "solution" and task.solution_script is None


def test_task_is_immutable(tmp_path):
    task = load_task(harbor_task(tmp_path, "t", '[metadata]\ncategory = "c"'))
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.name = "other"  # pyright: ignore[reportAttributeAccessIssue]  # deliberately writes a frozen field: the FrozenInstanceError is under test
    with pytest.raises(TypeError):
        task.metadata["category"] = "x"  # pyright: ignore[reportIndexIssue]  # deliberately writes the read-only mapping: the TypeError is under test


# (id, task.toml, fragments the one-line message must contain)
HARBOR_TOML_ERRORS = [
    ("toml-syntax", "[agent\ntimeout_sec = 1", ["invalid TOML:", "line 1"]),
    ("timeout-string", '[agent]\ntimeout_sec = "abc"', ["[agent].timeout_sec must be a positive number, got 'abc'"]),
    ("timeout-negative", "[verifier]\ntimeout_sec = -5", ["[verifier].timeout_sec must be a positive number, got -5"]),
    ("timeout-zero", "[agent]\ntimeout_sec = 0", ["[agent].timeout_sec must be a positive number, got 0"]),
    ("timeout-bool", "[agent]\ntimeout_sec = true", ["[agent].timeout_sec must be a positive number, got True"]),
    ("timeout-inf", "[agent]\ntimeout_sec = inf", ["[agent].timeout_sec must be a positive number, got inf"]),
    ("build-timeout", '[environment]\nbuild_timeout_sec = "10m"', ["[environment].build_timeout_sec"]),
    ("cpus-zero", "[environment]\ncpus = 0", ["[environment].cpus must be a positive number, got 0"]),
    ("cpus-string", '[environment]\ncpus = "2"', ["[environment].cpus"]),
    (
        "memory-mb-float",
        "[environment]\nmemory_mb = 1.5",
        ["[environment].memory_mb must be a positive integer, got 1.5"],
    ),
    ("storage-mb-negative", "[environment]\nstorage_mb = -1", ["[environment].storage_mb must be a positive integer"]),
    (
        "legacy-memory-bad-unit",
        '[environment]\nmemory = "2X"',
        ["[environment].memory must be a size like '2G'", "'2X'"],
    ),
    ("legacy-memory-not-string", "[environment]\nmemory = 2048", ["[environment].memory must be a size"]),
    ("legacy-memory-too-small", '[environment]\nmemory = "1K"', ["[environment].memory"]),
    (
        "legacy-memory-conflict",
        '[environment]\nmemory = "2G"\nmemory_mb = 1024',
        ["[environment].memory = '2G' (2048 MB) conflicts with [environment].memory_mb = 1024"],
    ),
    (
        "network-mode-unknown",
        '[environment]\nnetwork_mode = "bridge"',
        ["[environment].network_mode must be one of", "'bridge'"],
    ),
    (
        "allow-internet-string",
        '[environment]\nallow_internet = "yes"',
        ["[environment].allow_internet must be true or false"],
    ),
    ("env-not-table", '[environment]\nenv = "A=1"', ["[environment].env must be a table of strings"]),
    ("env-value-int", "[verifier.env]\nA = 1", ["[verifier].env.A must be a string, got 1"]),
    (
        "env-host-missing",
        '[environment.env]\nKEY = "${TG_TEST_UNSET_VAR}"',
        ["[environment].env.KEY: host variable TG_TEST_UNSET_VAR is not set and has no default"],
    ),
    ("section-not-table", 'agent = "fast"', ["[agent] must be a table, got 'fast'"]),
    ("metadata-not-table", "metadata = 3", ["[metadata] must be a table"]),
    ("task-name-empty", '[task]\nname = ""', ["[task].name must be a non-empty string"]),
    ("docker-image-int", "[environment]\ndocker_image = 3", ["[environment].docker_image must be a non-empty string"]),
    (
        "workdir-relative",
        '[environment]\nworkdir = "app"',
        ["[environment].workdir must be an absolute path, got 'app'"],
    ),
    ("schema-version-float", "schema_version = 1.1", ["schema_version must be a string, got 1.1"]),
    ("version-int", "version = 1", ["version must be a string, got 1"]),
    (
        "report-format-unknown",
        '[verifier]\nreport_format = "xml"',
        ["[verifier].report_format must be one of", "'xml'"],
    ),
    ("assertions-zero", "[verifier]\nassertions = 0", ["[verifier].assertions must be a positive integer, got 0"]),
    ("assertions-string", '[verifier]\nassertions = "5"', ["[verifier].assertions must be a positive integer"]),
    ("verifier-mode-unknown", '[verifier]\nenvironment_mode = "fresh"', ["[verifier].environment_mode must be one of"]),
    (
        "verifier-environment-table",
        '[verifier]\nenvironment_mode = "separate"\n[verifier.environment]\ndocker_image = "x"',
        ["[verifier.environment] (a separate grading image) is not supported yet"],
    ),
    ("artifacts-relative", 'artifacts = ["app/out.txt"]', ["artifacts[0] must be an absolute path"]),
    ("artifacts-dotdot", 'artifacts = ["/app/../etc"]', ["artifacts[0] must be an absolute path"]),
    ("artifacts-root", 'artifacts = ["/"]', ["artifacts[0] must be an absolute path"]),
    ("artifacts-not-list", 'artifacts = "/app"', ["artifacts must be a list of paths"]),
    # values no container engine accepts: an invalid task, never a retried sandbox fault
    (
        "cpus-absurd",
        "[environment]\ncpus = 1e12",
        ["[environment].cpus = 1e+12 is outside what a container engine accepts"],
    ),
    (
        "cpus-tiny",
        "[environment]\ncpus = 0.001",
        ["[environment].cpus = 0.001 is outside what a container engine accepts"],
    ),
    ("memory-absurd", "[environment]\nmemory_mb = 1000000000000000", ["[environment].memory_mb = 1e+15 is outside"]),
    (
        "memory-below-docker-minimum",
        "[environment]\nmemory_mb = 4",
        ["[environment].memory_mb = 4 is outside", "(6 to"],
    ),
    ("storage-absurd", '[environment]\nstorage = "100000000T"', ["[environment].storage_mb", "is outside"]),
]


@pytest.mark.parametrize(
    ("toml", "fragments"), [c[1:] for c in HARBOR_TOML_ERRORS], ids=[c[0] for c in HARBOR_TOML_ERRORS]
)
def test_harbor_toml_errors(tmp_path, monkeypatch, toml, fragments):
    monkeypatch.delenv("TG_TEST_UNSET_VAR", raising=False)
    task_dir = harbor_task(tmp_path, "t", toml)
    with pytest.raises(TaskError) as caught:
        load_task(task_dir)
    assert_task_error(caught.value, (task_dir / "task.toml").resolve(), *fragments)


# (id, how to build the broken task, offending file relative to the task, fragment)
HARBOR_FILE_ERRORS = [
    ("instruction-missing", {"instruction": None}, "instruction.md", "missing instruction file"),
    ("instruction-empty", {"instruction": ""}, "instruction.md", "instruction is empty"),
    ("instruction-blank", {"instruction": " \n\t\n"}, "instruction.md", "instruction is empty"),
    ("test-sh-missing", {"test_sh": False}, "tests/test.sh", "missing test script"),
    (
        "dockerfile-missing",
        {"dockerfile": False},
        "environment/Dockerfile",
        "missing Dockerfile (and task.toml sets no [environment].docker_image)",
    ),
]


@pytest.mark.parametrize(
    ("options", "file", "fragment"), [c[1:] for c in HARBOR_FILE_ERRORS], ids=[c[0] for c in HARBOR_FILE_ERRORS]
)
def test_harbor_file_errors(tmp_path, options, file, fragment):
    task_dir = harbor_task(tmp_path, "t", "", **options)
    with pytest.raises(TaskError) as caught:
        load_task(task_dir)
    assert_task_error(caught.value, (task_dir / file).resolve(), fragment)


def test_instruction_not_utf8(tmp_path):
    task_dir = harbor_task(tmp_path, "t", "")
    (task_dir / "instruction.md").write_bytes(b"\xff\xfe bad")
    with pytest.raises(TaskError) as caught:
        load_task(task_dir)
    assert_task_error(caught.value, (task_dir / "instruction.md").resolve(), "cannot read")


# --- Terminal-Bench 1 ---------------------------------------------------------------------------


def test_tb1_defaults(tmp_path):
    task_dir = tb1_task(tmp_path / "tb1-tasks", "hello-world")
    task = load_task(task_dir)
    root = task_dir.resolve()
    assert task == Task(
        name="hello-world",
        family="tb1-tasks",
        path=root,
        layout="tb1",
        instruction="Do the thing.",
        environment_dir=root,
        dockerfile=root / "Dockerfile",
        docker_image=None,
        compose_file=root / "docker-compose.yaml",
        solution_dir=None,
        solution_script="solution.sh",
        tests_dir=root / "tests",
        test_script="run-tests.sh",
        agent_timeout_sec=360.0,
        verifier_timeout_sec=60.0,
        build_timeout_sec=600.0,
        resources=Resources(),
        network=True,
        verifier_env={},
        environment_env={"TEST_DIR": "/tests"},
        workdir=None,
        metadata={},
    )
    assert task.solution_files() == [(root / "solution.sh", "solution.sh")]
    assert task.test_files() == [
        (root / "run-tests.sh", "run-tests.sh"),
        (root / "tests" / "test_outputs.py", "test_outputs.py"),
    ]


def test_tb1_overrides_and_metadata(tmp_path):
    yaml_text = """\
instruction: |-
  Fix the server.
  Then start it.
author_name: Someone
difficulty: hard
category: system-administration
tags: [nginx, networking]
parser_name: pytest
max_agent_timeout_sec: 1200
max_test_timeout_sec: 180.5
run_tests_in_same_shell: false
"""
    task = load_task(tb1_task(tmp_path, "fix-server", yaml_text))
    assert task.instruction == "Fix the server.\nThen start it."
    assert (task.agent_timeout_sec, task.verifier_timeout_sec) == (1200.0, 180.5)
    assert task.family == "system-administration"
    assert dict(task.metadata) == {
        "author_name": "Someone",
        "difficulty": "hard",
        "category": "system-administration",
        "tags": ["nginx", "networking"],
        "parser_name": "pytest",
        "run_tests_in_same_shell": False,
    }


def test_tb1_null_timeouts_use_defaults(tmp_path):
    task = load_task(tb1_task(tmp_path, "t", "instruction: x\nmax_agent_timeout_sec:\nmax_test_timeout_sec: null\n"))
    assert (task.agent_timeout_sec, task.verifier_timeout_sec) == (360.0, 60.0)


def test_tb1_solution_yaml_is_not_a_script(tmp_path):
    task = load_task(tb1_task(tmp_path, "t", solution="solution.yaml"))
    assert task.solution_script is None and task.solution_files() == []
    assert task.metadata["solution_yaml"] == "solution.yaml"


def test_tb1_without_solution_and_tests_dir(tmp_path):
    task_dir = tb1_task(tmp_path, "t", solution=None, tests=False)
    task = load_task(task_dir)
    assert task.solution_script is None and task.solution_files() == []
    assert not task.tests_dir.exists()
    assert task.test_files() == [(task_dir.resolve() / "run-tests.sh", "run-tests.sh")]


def test_tb1_top_level_run_tests_wins(tmp_path):
    task_dir = tb1_task(tmp_path, "t")
    write(task_dir / "tests" / "run-tests.sh", "shadowed")
    files = load_task(task_dir).test_files()
    assert [rel for _, rel in files] == ["run-tests.sh", "test_outputs.py"]
    assert files[0][0] == task_dir.resolve() / "run-tests.sh"


# (id, task.yaml, build options, offending file relative to the task, fragments)
TB1_ERRORS = [
    ("yaml-syntax", "instruction: [unclosed\n", {}, "task.yaml", ["invalid YAML:"]),
    ("yaml-list", "- a\n- b\n", {}, "task.yaml", ["top level must be a mapping, got list"]),
    ("yaml-scalar", "just text\n", {}, "task.yaml", ["top level must be a mapping, got str"]),
    ("yaml-empty", "", {}, "task.yaml", ["top level must be a mapping, got NoneType"]),
    ("instruction-missing", "category: x\n", {}, "task.yaml", ["missing 'instruction'"]),
    ("instruction-empty", "instruction: ''\n", {}, "task.yaml", ["'instruction' must be a non-empty string"]),
    (
        "instruction-not-string",
        "instruction: [a]\n",
        {},
        "task.yaml",
        ["'instruction' must be a non-empty string, got ['a']"],
    ),
    (
        "timeout-string",
        "instruction: x\nmax_agent_timeout_sec: abc\n",
        {},
        "task.yaml",
        ["max_agent_timeout_sec must be a positive number, got 'abc'"],
    ),
    (
        "test-timeout-negative",
        "instruction: x\nmax_test_timeout_sec: -1\n",
        {},
        "task.yaml",
        ["max_test_timeout_sec must be a positive number, got -1"],
    ),
    ("run-tests-missing", "instruction: x\n", {"run_tests": False}, "run-tests.sh", ["missing test script"]),
    ("compose-missing", "instruction: x\n", {"compose": False}, "docker-compose.yaml", ["missing docker-compose.yaml"]),
    ("dockerfile-missing", "instruction: x\n", {"dockerfile": False}, "Dockerfile", ["missing Dockerfile"]),
]


@pytest.mark.parametrize(
    ("yaml_text", "options", "file", "fragments"), [c[1:] for c in TB1_ERRORS], ids=[c[0] for c in TB1_ERRORS]
)
def test_tb1_errors(tmp_path, yaml_text, options, file, fragments):
    task_dir = tb1_task(tmp_path, "t", yaml_text, **options)
    with pytest.raises(TaskError) as caught:
        load_task(task_dir)
    assert_task_error(caught.value, (task_dir / file).resolve(), *fragments)


# --- paths and discovery --------------------------------------------------------------------------


def test_load_task_path_errors(tmp_path):
    with pytest.raises(TaskError) as caught:
        load_task(tmp_path / "nope")
    assert_task_error(caught.value, tmp_path / "nope", "does not exist")
    write(tmp_path / "file.txt", "x")
    with pytest.raises(TaskError) as caught:
        load_task(tmp_path / "file.txt")
    assert_task_error(caught.value, tmp_path / "file.txt", "not a directory")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError) as caught:
        load_task(tmp_path / "empty")
    assert_task_error(caught.value, (tmp_path / "empty").resolve(), "no task.toml or task.yaml")


def test_task_toml_wins_over_task_yaml(tmp_path):
    task_dir = harbor_task(tmp_path, "t", "")
    write(task_dir / "task.yaml", "instruction: yaml\n")
    assert load_task(task_dir).layout == "harbor"


def test_task_error_is_value_error_and_one_line(tmp_path):
    error = TaskError(tmp_path / "task.toml", "first\nsecond  third")
    assert isinstance(error, ValueError)
    assert str(error) == f"{tmp_path / 'task.toml'}: first second third"


def test_discover_tasks(tmp_path):
    root = tmp_path / "envs"
    harbor_task(root / "text", "word-count", "")
    harbor_task(root / "text", "csv", '[metadata]\ncategory = "data"')
    harbor_task(root / "files", "named", '[task]\nname = "org/custom"')
    tb1_task(root / "legacy", "hello")
    harbor_task(root / ".hidden", "skipped", "")
    harbor_task(root / "flat-parent" / "x" / "deep", "task", "")
    write(root / "text" / "word-count" / "tests" / "inner" / "task.toml", "not scanned = = =")
    tasks = discover_tasks(root)
    assert [t.name for t in tasks] == [
        "flat-parent/x/deep/task",
        "legacy/hello",
        "org/custom",
        "text/csv",
        "text/word-count",
    ]
    assert [t.family for t in tasks] == ["deep", "legacy", "files", "data", "text"]
    assert [t.layout for t in tasks] == ["harbor", "tb1", "harbor", "harbor", "harbor"]


def test_discover_flat_root_uses_dir_names(tmp_path):
    harbor_task(tmp_path, "b", "")
    harbor_task(tmp_path, "a", "")
    assert [t.name for t in discover_tasks(tmp_path)] == ["a", "b"]


def test_discover_root_that_is_a_task(tmp_path):
    task_dir = harbor_task(tmp_path, "only", "")
    assert [t.name for t in discover_tasks(task_dir)] == ["only"]


def test_discover_empty_root(tmp_path):
    assert discover_tasks(tmp_path) == []


def test_discover_invalid_task_raises(tmp_path):
    harbor_task(tmp_path, "good", "")
    bad = harbor_task(tmp_path, "bad", "[agent]\ntimeout_sec = -1")
    with pytest.raises(TaskError) as caught:
        discover_tasks(tmp_path)
    assert_task_error(caught.value, (bad / "task.toml").resolve(), "[agent].timeout_sec")


def test_discover_duplicate_names(tmp_path):
    harbor_task(tmp_path, "a", '[task]\nname = "same"')
    second = harbor_task(tmp_path, "b", '[task]\nname = "same"')
    with pytest.raises(TaskError) as caught:
        discover_tasks(tmp_path)
    assert_task_error(caught.value, second.resolve(), "duplicate task name 'same'")


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_discover_bad_root(tmp_path, kind):
    root = tmp_path / "root"
    if kind == "file":
        write(root, "x")
    with pytest.raises(TaskError) as caught:
        discover_tasks(root)
    assert_task_error(caught.value, root, "does not exist" if kind == "missing" else "not a directory")
