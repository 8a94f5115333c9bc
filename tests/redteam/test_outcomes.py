"""Red team, outcomes: a policy under reward pressure learns to erase its failures if it can. A
sandbox the agent broke, a shell it took off the protocol, a tool it broke: reward 0, an error kind
that names the agent, kept in the batch and never retried. And the per-command nonce never shows
where the agent's commands can read it, so output cannot fake the end of a command."""

from __future__ import annotations

import pytest

from termgym.agents import ScriptedAgent
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.sandboxes.pacing import Pacer
from termgym.scheduling.pool import TaskPool, make_nodes
from termgym.scheduling.runners import TrialRunner
from termgym.scheduling.scheduler import FAILED_KINDS, RETRYABLE_KINDS, RolloutScheduler, SchedulerConfig
from termgym.tasks import load_task
from tests.helpers import require_docker
from tests.redteam.helpers import attack

pytestmark = [pytest.mark.redteam]

# Redefines `builtin`, which the shell's frame goes through, to answer a malformed frame.
PROTOCOL_BREAKER = (
    'builtin() { if [ "$1" = printf ]; then printf \'\\n__TG_%s_ not-a-status\\n__TG_%s_END\\n\' "$__tg_n" "$__tg_n" >&99;'
    ' else command "$@"; fi; }'
)


# `kill -9 -1` spares the shell that runs it. On Docker it also kills the container's keeper, so its
# init exits and the kernel ends the shell too: whether the shell's frame reaches the driver first
# (the agent then submits, and verification finds the sandbox broken) or not is a race the test does
# not control. Either way the episode ends as the agent broke it, and so it reports. On the embedded
# backend the keeper is its PID namespace's init, which nothing inside can signal (below).
@pytest.mark.parametrize(
    ("backend", "command"),
    [
        ("local", PROTOCOL_BREAKER),
        pytest.param("docker", PROTOCOL_BREAKER, marks=pytest.mark.docker),
        pytest.param("docker", "kill -9 -1", marks=pytest.mark.docker),
    ],
    ids=["local-break-the-protocol", "docker-break-the-protocol", "docker-kill-everything"],
)
async def test_breaking_the_sandbox_scores_zero_and_blames_the_agent(task_dir, backend, no_leaks, command):
    if backend == "docker":
        require_docker()
    record = await attack(task_dir, backend, "echo done > /app/result.txt", command)
    assert record.error is not None, record
    assert record.error["kind"] == "broken_by_agent", record.error
    assert record.stop_reason == "broken_by_agent", record.stop_reason  # never "sandbox_error"
    assert record.reward == 0.0 and not record.resolved
    assert record.error["kind"] not in RETRYABLE_KINDS and record.error["kind"] not in FAILED_KINDS


async def test_killing_every_process_leaves_an_embedded_sandbox_to_be_graded(task_dir, no_leaks):
    """The embedded keeper is its PID namespace's init: ``kill -9 -1`` (and ``kill -9 1``) from inside
    ends every other process but cannot end it, so the sandbox lives on and the work the agent left
    is graded as any other (with bubblewrap's own init in front of the keeper, the keeper died and
    the trial was broken)."""
    record = await attack(task_dir, "local", "echo done > /app/result.txt", "kill -9 -1; kill -9 1")
    assert record.error is None, record.error
    assert record.resolved and record.passed == record.total == 2, record


async def test_a_broken_sandbox_is_kept_in_the_batch_not_retried(task_dir, no_leaks):
    pacer = Pacer()
    runner = TrialRunner(ScriptedAgent((PROTOCOL_BREAKER,)), EnvOptions(run_id="redteam"), pacer)
    config = SchedulerConfig(batch_size=1, mode="wait", nodes=make_nodes([1]))
    scheduler = RolloutScheduler(runner, TaskPool([load_task(task_dir)], shuffle=False), config, pacer=pacer)
    result = await scheduler.step()
    errors = [k.record.error for k in result.kept]
    assert all(e is not None for e in errors), errors
    assert [e["kind"] for e in errors if e is not None] == ["broken_by_agent"]
    assert pacer.granted == 1  # one sandbox: the failure was not erased by a retry


@pytest.mark.docker
@pytest.mark.parametrize(("tamper", "kind"), [("fail", "tampered"), ("warn", "broken_by_agent")])
async def test_a_tool_the_harness_needs_broken_by_the_agent_scores_zero(task_dir, no_leaks, tamper, kind):
    """On Docker the harness resets /tests and reads the reports with the image's /bin/sh; the
    agent (root there) replaces it. By default that is tampering, found before anything runs; under
    "warn" the harness step fails: the agent broke the sandbox."""
    breaker = "cp /bin/bash /tmp/bash && printf '#!/tmp/bash\\nexit 127\\n' > /tmp/sh && mv -f /tmp/sh /bin/sh && chmod +x /bin/sh"
    record = await attack(task_dir, "docker", "echo done > /app/result.txt", breaker, tamper=tamper)
    assert record.error is not None, record
    assert record.error["kind"] == kind and record.reward == 0.0, record.error


async def test_the_nonce_is_nowhere_the_agents_commands_can_read(task_dir, no_leaks, monkeypatch):
    from termgym.episode import persistent_shell as shell

    nonces = iter(f"{n:016x}" for n in range(0xC0FFEE00, 0xC0FFEE00 + 100))
    used: list[str] = []

    def known_nonce(nbytes: int) -> str:
        used.append(next(nonces))
        return used[-1]

    monkeypatch.setattr(shell.secrets, "token_hex", known_nonce)
    reveal = 'echo "argv=${BASH_ARGV[*]}"; declare -p; env; set; caller 0; echo "${FUNCNAME[*]}" "${BASH_SOURCE[*]}"'
    async with AsyncTerminalEnv(load_task(task_dir), EnvOptions(max_turns=10)) as env:
        await env.reset()
        await env.step("shopt -s extdebug")
        observation, *_ = await env.step(reveal)
        # What the agent can print to fake the end of its command: every value it could read.
        fake = 'for w in "${BASH_ARGV[@]}" $__tg_n; do printf "\\n__TG_%s_ 0 /\\n__TG_%s_END\\n" "$w" "$w"; done; echo still-running; exit 3'
        faked, *_, info = await env.step(f"({fake})")
        await env.step(SUBMIT)
    assert used and not any(nonce in observation for nonce in used), "a nonce was readable"
    assert "still-running" in faked and info["exit_code"] == 3  # the real end of the command, not a fake
