"""The episode runtime of Harbor's task features: the healthcheck before the agent, the agent's and
the verifier's users, the network per phase, artifacts copied into the trial directory, and
multi-step tasks (per-step instructions, tests and solutions, graded by ``mean`` or ``final``)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from termgym.agents import NullAgent, OracleAgent, ScriptedAgent
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.artifacts import export_artifacts
from termgym.episode.healthcheck import Try, judge, next_try_after, worst_case_sec
from termgym.episode.options import EnvOptions
from termgym.episode.overrides import RunOverrides
from termgym.episode.steps import StepResult, combine
from termgym.tasks import Healthcheck, Task, TaskStep, load_task
from termgym.trial import run_trial
from tests.helpers import write_task

BINARY_TEST = "#!/bin/sh\n{check}\n"


def _task(tmp_path: Path, **fields: object) -> Task:
    return replace(load_task(write_task(tmp_path)), **fields)  # type: ignore[arg-type]


# -- the healthcheck's schedule (pure) ---------------------------------------------------------


def test_judge_follows_docker_healthcheck_semantics():
    check = Healthcheck("true", interval_sec=1, timeout_sec=1, start_period_sec=2.5, retries=2)
    assert judge(check, []) == "again"
    assert judge(check, [Try(0, False), Try(1, False), Try(2, False)]) == "again"  # inside the start period
    assert judge(check, [Try(0, False), Try(3, False)]) == "again"  # one counted failure of two
    assert judge(check, [Try(0, False), Try(3, False), Try(4, False)]) == "unhealthy"
    assert judge(check, [Try(3, False), Try(4, True)]) == "healthy"
    assert judge(check, [Try(3, False), Try(4, True), Try(5, False)]) == "again"  # the run of failures restarts
    assert judge(replace(check, retries=0, start_period_sec=0), [Try(0, False)]) == "unhealthy"  # at least one
    assert worst_case_sec(check) == pytest.approx(2.5 + 5 + 1 * 2)  # start_interval_sec is 5 (Harbor's default)


def test_tries_are_start_interval_apart_in_the_start_period_then_interval_apart():
    check = Healthcheck("true", interval_sec=2, start_period_sec=3, start_interval_sec=0.5)
    assert [next_try_after(check, t) for t in (0, 2.9, 3, 10)] == [0.5, 0.5, 2, 2]


# -- multi-step grading (pure) ----------------------------------------------------------------


def test_combine_mean_and_final_as_harbor_defines_them():
    one = StepResult("one", 1.0, True, 2, 2, ({"name": "a", "passed": True},))
    two = StepResult("two", 0.0, False, 0, 1, ({"name": "b", "passed": False},))
    mean = combine([one, two], "mean")
    assert (mean.reward, mean.resolved, mean.passed, mean.total) == (0.5, False, 2, 3)
    assert [a["name"] for a in mean.assertions] == ["one: a", "two: b"]
    final = combine([one, two], "final")
    assert (final.reward, final.resolved, final.passed, final.total) == (0.0, False, 0, 1)
    assert [a["name"] for a in final.assertions] == ["two: b"]
    assert combine([two, one], "final").resolved
    assert combine([], "mean").reward == 0.0


# -- the healthcheck on a real sandbox ---------------------------------------------------------


async def test_healthcheck_retries_until_it_passes_before_the_agent_starts(tmp_path, no_leaks):
    # passes on its third try: the agent's first command sees the three tries already made
    command = "n=$(cat /tmp/tries 2>/dev/null || echo 0); n=$((n+1)); echo $n > /tmp/tries; [ $n -ge 3 ]"
    task = _task(tmp_path, healthcheck=Healthcheck(command, interval_sec=0.3, timeout_sec=5, retries=3))
    async with AsyncTerminalEnv(task, EnvOptions()) as env:
        await env.reset()
        assert env.timings["healthcheck"] >= 0.6
        obs, *_ = await env.step("cat /tmp/tries")
        assert obs == "3\n"


BACKGROUND_READY = (
    "[ -f /tmp/ready ] && exit 0; [ -f /tmp/started ] && exit 1; touch /tmp/started;"
    " setsid sh -c 'sleep 1; touch /tmp/ready' </dev/null >/dev/null 2>&1 & exit 1"
)


async def test_healthcheck_waits_for_a_file_a_background_process_creates(tmp_path, backend, no_leaks):
    check = Healthcheck(BACKGROUND_READY, interval_sec=0.25, timeout_sec=5, start_period_sec=0, retries=20)
    async with AsyncTerminalEnv(_task(tmp_path, healthcheck=check), EnvOptions(backend=backend)) as env:
        await env.reset()
        assert 0.9 <= env.timings["healthcheck"] < 10
        obs, *_ = await env.step("test -f /tmp/ready && echo ready")
        assert obs == "ready\n"


async def test_failing_healthcheck_is_a_sandbox_error_naming_it(tmp_path, no_leaks):
    check = Healthcheck("echo not ready yet; exit 1", interval_sec=0.5, timeout_sec=5, start_period_sec=1, retries=2)
    task = _task(tmp_path, healthcheck=check)
    started = time.monotonic()
    record = await run_trial(task, NullAgent(), EnvOptions())
    elapsed = time.monotonic() - started
    assert record.error is not None and record.error["kind"] == "sandbox_error"
    assert "healthcheck `echo not ready yet; exit 1`" in record.error["message"]
    assert record.error["message"].endswith("not ready yet")
    assert record.turns == 0 and record.reward == 0.0 and not record.resolved
    assert 1.0 <= elapsed < 1.0 + worst_case_sec(check) + 15  # the start period, then two counted failures


# -- users -------------------------------------------------------------------------------------

USER_TEST = """#!/bin/sh
set -e
id -u > /logs/verifier/uid.txt  # /logs/verifier is writable for the verifier's user
[ "$(id -u)" = "{uid}" ] && [ "$(cat /app/agent-uid)" = "{agent_uid}" ]
"""


@pytest.mark.docker
async def test_agent_and_verifier_users_on_docker(tmp_path, no_leaks):
    root = write_task(
        tmp_path,
        extra_files={"tests/test.sh": USER_TEST.format(uid=1000, agent_uid=1000)},
        dockerfile=("FROM debian:bookworm-slim\nWORKDIR /app\nRUN chmod 0777 /app\n"),
    )
    task = replace(load_task(root), agent_user="1000", verifier_user="1000")
    async with AsyncTerminalEnv(task, EnvOptions(backend="docker")) as env:
        await env.reset()
        obs, *_ = await env.step("id -u | tee /app/agent-uid")
        assert obs == "1000\n"
        _, reward, *_, info = await env.step(SUBMIT)
        assert info["resolved"] and reward > 0, info["verifier_output"]
        assert not [w for w in env.warnings if ".user" in w]


@pytest.mark.docker
async def test_an_unknown_agent_user_on_docker_is_an_invalid_task(tmp_path, no_leaks):
    """The task's fault, not the infrastructure's: no scheduler retries it."""
    task = _task(tmp_path, agent_user="no-such-user")
    record = await run_trial(task, NullAgent(), EnvOptions(backend="docker"))
    assert record.error is not None and record.error["kind"] == "invalid_task"
    assert "no-such-user" in record.error["message"]


async def test_users_on_the_embedded_backend_are_a_warning(tmp_path, no_leaks):
    root = write_task(tmp_path, extra_files={"tests/test.sh": USER_TEST.format(uid=0, agent_uid=0)})
    task = replace(load_task(root), agent_user="1000", verifier_user="root")
    record = await run_trial(task, ScriptedAgent(("id -u > /app/agent-uid",)), EnvOptions())
    assert record.resolved and record.error is None  # both ran as the sandbox's root
    assert "the local backend runs every command as root: [agent].user = 1000 is not applied" in record.warnings
    assert not [w for w in record.warnings if "[verifier].user" in w]  # root is root everywhere


# -- network per phase -------------------------------------------------------------------------


async def test_network_asked_on_the_embedded_backend_is_given_in_that_phase_only(tmp_path, no_leaks):
    """The agent's phase asks for network and gets it (pasta, ``termgym.sandboxes.local.network``);
    the verifier's does not ask and runs without; nothing to warn about."""
    task = _task(tmp_path, agent_network=True)
    record = await run_trial(task, OracleAgent(), EnvOptions())
    assert record.resolved and record.error is None
    assert record.network == {"agent": True, "verifier": False, "agent_asked": True, "verifier_asked": False}
    assert not [w for w in record.warnings if "network" in w], record.warnings


async def test_network_none_asks_for_nothing(tmp_path, no_leaks):
    task = _task(tmp_path, agent_network=True, verifier_network=True)
    options = EnvOptions(overrides=RunOverrides(network="none"))
    record = await run_trial(task, OracleAgent(), options)
    assert record.resolved
    assert record.network == {"agent": False, "verifier": False, "agent_asked": False, "verifier_asked": False}
    assert [w for w in record.warnings if "network" in w] == [
        "the task asks for network in its agent and verifier phase; --network none withholds it"
    ]


@pytest.mark.docker
async def test_verifier_network_on_an_engine_without_bridge_is_a_warning(tmp_path, no_leaks):
    task = _task(tmp_path, verifier_network=True)
    record = await run_trial(task, OracleAgent(), EnvOptions(backend="docker"))
    assert record.resolved and record.error is None
    assert record.network == {"agent": False, "verifier": False, "agent_asked": False, "verifier_asked": True}
    assert any(w.startswith("the verifier phase asks for network: ") and "bridge" in w for w in record.warnings)


@pytest.mark.docker
async def test_agent_network_on_an_engine_without_bridge_fails_clearly(tmp_path, no_leaks):
    record = await run_trial(_task(tmp_path, agent_network=True), OracleAgent(), EnvOptions(backend="docker"))
    assert record.error is not None and record.error["kind"] == "sandbox_error"
    assert "bridge" in record.error["message"] and "--network none" in record.error["message"]
    assert record.network == {}  # the sandbox never started
    again = await run_trial(  # as the line says: without network, the trial runs
        _task(tmp_path / "again", agent_network=True),
        OracleAgent(),
        EnvOptions(backend="docker", overrides=RunOverrides(network="none")),
    )
    assert again.resolved and again.network["agent_asked"] is False


# -- artifacts ---------------------------------------------------------------------------------

MAKE_ARTIFACTS = (
    "mkdir -p /app/out/sub /logs/artifacts && echo a > /app/out/sub/a.txt && echo b > /logs/artifacts/b.txt"
    " && ln -s /etc/passwd /app/out/link && echo c > /app/not-declared.txt"
)


async def test_artifacts_are_copied_into_the_trial_directory(tmp_path, no_leaks):
    task = _task(tmp_path / "task", artifacts=("/app/out",))
    trials = tmp_path / "trials"
    record = await run_trial(task, ScriptedAgent((MAKE_ARTIFACTS,)), EnvOptions(trials_dir=str(trials)))
    assert record.artifacts == ["artifacts/app/out/sub/a.txt", "artifacts/logs/artifacts/b.txt"]
    trial_dir = trials / record.trial_id
    assert (trial_dir / "artifacts/app/out/sub/a.txt").read_text() == "a\n"
    assert (trial_dir / "artifacts/logs/artifacts/b.txt").read_text() == "b\n"
    assert not (trial_dir / "artifacts/app/out/link").exists()  # a link is never copied out
    assert any(w.startswith("1 artifact entries were not kept (links,") for w in record.warnings), record.warnings


async def test_artifacts_without_a_trial_directory_are_not_kept(tmp_path, no_leaks):
    task = _task(tmp_path, artifacts=("/app/out",))
    record = await run_trial(task, ScriptedAgent((MAKE_ARTIFACTS,)), EnvOptions())
    assert record.artifacts == []
    assert "the task's artifacts were not kept: this run keeps no trial directory" in record.warnings


async def test_artifacts_over_the_limit_are_a_warning(tmp_path, no_leaks):
    task = _task(tmp_path / "task", artifacts=("/app/out",))
    async with AsyncTerminalEnv(task, EnvOptions()) as env:
        await env.reset()
        await env.step("mkdir -p /app/out && head -c 200000 /dev/urandom > /app/out/big")
        assert env.sandbox is not None
        files, warnings = await export_artifacts(env.sandbox, task.artifacts, tmp_path / "trial", limit=50_000)
    assert files == [] and len(warnings) == 1 and warnings[0].startswith("the artifacts were not kept: ")
    assert not (tmp_path / "trial").exists()


# -- multi-step tasks --------------------------------------------------------------------------


def _two_step_task(tmp_path: Path, strategy: str = "mean") -> Task:
    root = write_task(tmp_path)
    steps = []
    for name, check, solve in (
        ("one", "test -f /app/one", "touch /app/one"),
        ("two", "test -f /app/one && test -f /app/two", "touch /app/two"),  # the same environment, in order
    ):
        step_dir = root / "steps" / name
        (step_dir / "tests").mkdir(parents=True)
        (step_dir / "solution").mkdir()
        (step_dir / "tests" / "test.sh").write_text(BINARY_TEST.format(check=check))
        (step_dir / "solution" / "solve.sh").write_text(f"#!/bin/sh\n{solve}\n")
        steps.append(
            TaskStep(
                name=name,
                instruction=f"Step {name}: create /app/{name}.",
                tests_dir=step_dir / "tests",
                test_script="test.sh",
                solution_dir=step_dir / "solution",
                solution_script="solve.sh",
                agent_timeout_sec=30.0,
                verifier_timeout_sec=30.0,
            )
        )
    task = load_task(root)
    return replace(task, steps=tuple(steps), multi_step_reward_strategy=strategy, solution_script=None)  # type: ignore[arg-type]


async def test_multi_step_gym_api_hands_over_the_next_instruction(tmp_path, no_leaks):
    async with AsyncTerminalEnv(_two_step_task(tmp_path), EnvOptions()) as env:
        obs, info = await env.reset()
        assert obs == "Step one: create /app/one." and info["step"] == 0 and info["steps"] == 2
        await env.step("touch /app/one")
        obs, reward, terminated, truncated, info = await env.step(SUBMIT)
        assert obs == "Step two: create /app/two." and reward == 0.0 and not terminated and not truncated
        assert info["step"] == 1 and info["step_result"]["name"] == "one" and info["step_result"]["resolved"]
        obs, *_ = await env.step("pwd; ls /app")  # a fresh shell in the same sandbox
        assert obs.split() == ["/app", "one"]
        _, reward, terminated, _, info = await env.step(SUBMIT)  # step two not done: mean of 1 and 0
        assert terminated and not info["resolved"] and reward == pytest.approx(0.5)
        assert [s["resolved"] for s in info["steps"]] == [True, False]
        assert env.transcript.stop_reason == "submitted"


@pytest.mark.parametrize("strategy", ["mean", "final"])
async def test_multi_step_oracle_resolves_every_step(tmp_path, no_leaks, strategy):
    record = await run_trial(_two_step_task(tmp_path, strategy), OracleAgent(), EnvOptions())
    assert record.error is None and record.resolved and record.reward == pytest.approx(1.0)
    assert [(s["name"], s["resolved"], s["reward"]) for s in record.steps] == [("one", True, 1.0), ("two", True, 1.0)]
    assert record.turns == 2  # one solution per step


async def test_multi_step_null_agent_and_the_final_strategy(tmp_path, no_leaks):
    record = await run_trial(_two_step_task(tmp_path), NullAgent(), EnvOptions())
    assert not record.resolved and record.reward == 0.0 and record.error is None
    assert [(s["name"], s["resolved"]) for s in record.steps] == [("one", False), ("two", False)]
    agent = ScriptedAgent(("touch /app/one",))  # step one done, step two submitted as is
    final = await run_trial(_two_step_task(tmp_path / "final", "final"), agent, EnvOptions())
    assert [s["resolved"] for s in final.steps] == [True, False] and final.reward == 0.0
    mean = await run_trial(_two_step_task(tmp_path / "mean", "mean"), agent, EnvOptions())
    assert mean.reward == pytest.approx(0.5) and not mean.resolved
    assert mean.assertions == [{"name": "one: exit code", "passed": True}, {"name": "two: exit code", "passed": False}]
    assert (mean.passed, mean.total) == (1, 2)


async def test_the_model_agent_is_handed_the_next_step_after_submit(tmp_path, no_leaks):
    from termgym.agents import ModelConfig
    from termgym.agents.settings import build_model_agent
    from tests.termgym.agents.fault_server import MODEL, FaultServer, bash

    async with FaultServer() as server:
        server.add(bash("touch /app/one"), bash(":submit"), bash("touch /app/two"), bash(":submit"))
        config = ModelConfig(model=MODEL, base_url=server.base_url, request_timeout=5.0, action_format="text")
        agent = build_model_agent(config, environ={})
        record = await run_trial(_two_step_task(tmp_path), agent, EnvOptions())
        third = server.requests_to("chat/completions")[2]
    assert record.error is None and record.resolved and record.stop_reason == "submitted"
    assert [s["resolved"] for s in record.steps] == [True, True]
    assert third.body["messages"][-1]["content"] == "Step two: create /app/two."


async def test_a_steps_agent_timeout_verifies_that_step_and_ends_the_trial(tmp_path, no_leaks):
    task = _two_step_task(tmp_path)
    one, two = task.steps
    task = replace(task, steps=(replace(one, agent_timeout_sec=1.0), replace(two, agent_timeout_sec=7.0)))
    async with AsyncTerminalEnv(task, EnvOptions()) as env:
        _, info = await env.reset()
        assert info["agent_timeout"] == 1.0  # the step's own
        *_, truncated, info = await env.step("touch /app/one; sleep 5")
        assert truncated and info["stop_reason"] == "agent_timeout"
        assert [s["name"] for s in info["steps"]] == ["one"] and info["resolved"]  # step one was done
    assert env.error is not None and env.error["kind"] == "agent_timeout"


# -- the image's own entrypoint (docker) ------------------------------------------------------

ENTRYPOINT_SERVICE = """#!/bin/sh
( while true; do date +%s > /tmp/service-alive; sleep 0.2; done ) &
exec "$@"
"""


@pytest.mark.docker
async def test_an_image_entrypoint_service_runs_for_the_agent_and_again_for_the_verifier(tmp_path, no_leaks):
    """As in Harbor (the image's ENTRYPOINT runs with the keeper as its command): a service the
    entrypoint starts is up for the agent and, after the restart that ends the agent's processes,
    for the verifier too."""
    dockerfile = (
        "FROM termgym/base:bookworm\nWORKDIR /app\nCOPY entry.sh /usr/local/bin/entry.sh\n"
        'RUN chmod +x /usr/local/bin/entry.sh\nENTRYPOINT ["/usr/local/bin/entry.sh"]\n'
    )
    test_sh = "#!/bin/sh\nmkdir -p /logs/verifier\nrm -f /tmp/service-alive; sleep 1\n[ -f /tmp/service-alive ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    task = load_task(
        write_task(
            tmp_path, dockerfile=dockerfile, test_sh=test_sh, extra_files={"environment/entry.sh": ENTRYPOINT_SERVICE}
        )
    )
    agent = ScriptedAgent(("sleep 1; test -f /tmp/service-alive && echo service-up",))
    async with AsyncTerminalEnv(task, EnvOptions(backend="docker")) as env:
        await env.reset()
        observation, *_ = await env.step(agent.commands[0])
        assert "service-up" in observation
        _, reward, terminated, _, info = await env.step(SUBMIT)
    assert terminated and info["resolved"] and reward > 0, info
