"""Red team, the embedded backend: an agent running as root in the sandbox tries to reach the host.

Each attack would have worked before the sandbox ran as an unprivileged user (uid 0 mapped to 0,
every capability after ``nsenter``). Attacks that would change the host if a defence failed change
only a canary file (removed afterwards) or write a value back unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.sandboxes.local import LocalSandbox
from termgym.sandboxes.local.commands import COMMAND_CAPABILITIES
from termgym.tasks import load_task
from tests.redteam.helpers import attack, forged, host_canary, running_as_root

pytestmark = [pytest.mark.redteam]
root_only = pytest.mark.skipif(not running_as_root(), reason="the root-to-host attacks need termgym to run as root")

# The mask of Docker's default capabilities, as the kernel prints it in /proc/<pid>/status.
DOCKER_DEFAULT_CAPS = "00000000a80425fb"


async def run_in_sandbox(task_dir: Path, *commands: str) -> list[str]:
    """The agent's observations for ``commands`` in one episode of the task."""
    observations = []
    async with AsyncTerminalEnv(load_task(task_dir), EnvOptions(max_turns=len(commands) + 1)) as env:
        await env.reset()
        for command in commands:
            observation, *_ = await env.step(command)
            observations.append(observation)
    return observations


@root_only
async def test_read_only_host_binds_cannot_be_remounted_to_write_the_host(task_dir, no_leaks):
    with host_canary("/usr/local/bin") as in_usr, host_canary("/etc") as in_etc:
        commands = [
            f"mount -o remount,rw /usr; mount -o remount,rw,bind /usr; touch {in_usr}",
            f"mount -o remount,rw /etc; umount /etc; echo owned > {in_etc}",
            f"mount -t tmpfs none /usr/local; umount -l /usr; touch {in_usr}",
        ]
        observations = await run_in_sandbox(task_dir, *commands)
        assert not in_usr.exists() and not in_etc.exists(), observations


@root_only
async def test_a_helper_cannot_be_planted_where_termgym_finds_its_helpers(task_dir, no_leaks):
    """The old chain: remount /usr read-write from inside, plant /usr/sbin/nsenter (first on the
    PATH termgym ran helpers with), wait for termgym to run it as root outside every namespace.
    The plant fails; that termgym runs helpers by absolute path only is test_helpers_are_run_by_absolute_path."""
    with host_canary("/usr/sbin") as planted:
        plant = (
            f"mount -o remount,rw,bind /usr; printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > {planted} && chmod +x {planted}"
        )
        observations = await run_in_sandbox(task_dir, plant)
        assert not planted.exists(), observations


@root_only
async def test_host_sysctls_are_read_only(task_dir, no_leaks):
    write_back = "v=$(cat /proc/sys/kernel/{0}); printf '%s\\n' \"$v\" > /proc/sys/kernel/{0} && echo WROTE-{0}"
    observations = await run_in_sandbox(
        task_dir,
        write_back.format("core_pattern"),
        write_back.format("hostname"),
        "echo 1 > /proc/sysrq-trigger && echo WROTE-sysrq",
    )
    assert not any("WROTE" in o for o in observations), observations


@root_only
async def test_files_only_root_may_read_stay_unreadable(task_dir, no_leaks):
    first = Path("/etc/shadow").read_text().splitlines()[0]
    (observation,) = await run_in_sandbox(task_dir, "cat /etc/shadow; head -c 100 /etc/ssh/ssh_host_ed25519_key 2>&1")
    assert first not in observation and "Permission denied" in observation


async def test_sandbox_root_is_an_unprivileged_host_user_with_docker_capabilities(task_dir, no_leaks):
    observations = await run_in_sandbox(
        task_dir,
        "id -u; touch /app/mine",
        "grep CapEff /proc/self/status",
        "unshare -U true && echo NESTED-USERNS; mount -t tmpfs none /mnt && echo MOUNTED",
        "touch /planted-at-root && echo WROTE-ROOT",
    )
    assert observations[0].splitlines()[0] == "0"  # root inside...
    assert observations[1].split()[-1] == DOCKER_DEFAULT_CAPS  # ...with Docker's capabilities, not all
    assert "NESTED-USERNS" not in observations[2] and "MOUNTED" not in observations[2]
    assert "WROTE-ROOT" not in observations[3]
    assert len(COMMAND_CAPABILITIES) == bin(int(DOCKER_DEFAULT_CAPS, 16)).count("1")


@root_only
async def test_files_the_sandbox_writes_belong_to_an_unprivileged_host_uid(task_dir, no_leaks):
    from termgym.episode.spec import sandbox_spec

    sandbox = LocalSandbox(sandbox_spec(load_task(task_dir), run_id="redteam"))
    async with sandbox:
        await sandbox.exec(["/bin/sh", "-c", "echo x > /app/mine"], timeout=10)
        owner = (sandbox.files_dir / "app" / "mine").stat().st_uid
        assert owner == sandbox.owner and owner >= 1 << 20, owner


async def test_helpers_are_run_by_absolute_path(task_dir, no_leaks):
    from termgym.episode.spec import sandbox_spec

    sandbox = LocalSandbox(sandbox_spec(load_task(task_dir), run_id="redteam"))
    async with sandbox:
        # the command entered is the sandbox's own, named by its path there: here an absolute one
        for argv in (sandbox._keeper_argv(False), sandbox._enter_argv(["/usr/bin/true"], {}, "/")):
            programs = [argv[0]] + [
                argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--" and not argv[i + 1].startswith("-")
            ]
            assert programs and all(p.startswith("/") for p in programs), argv


@root_only
async def test_breaking_out_leaves_no_forged_reward(task_dir, no_leaks):
    """The whole chain at once, as an RL policy would try it: escape, then plant a passing report."""
    with host_canary("/usr/local/bin") as canary:
        record = await attack(
            task_dir,
            "local",
            f"mount -o remount,rw,bind /usr; touch {canary}",
            'mkdir -p /logs/verifier && echo \'{"results":{"tests":[{"name":"x","status":"passed"}]}}\' > /logs/verifier/ctrf.json',
        )
        assert not canary.exists() and not forged(record) and record.total == 2
