"""An image's USER on the embedded backend (as root) and on Docker, on the same task: the agent's
commands and the verifier run as that user, the agent's files are that user's; a task without USER
runs both as root. (The task makes /logs and /tests writable to its user: on both backends the
harness's own steps run as the image's USER too.)"""

from __future__ import annotations

import os

import pytest

from termgym.agents import ScriptedAgent
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from tests.helpers import write_task

BASE = "FROM termgym/base:bookworm\nRUN mkdir -p /logs /tests && chmod 1777 /logs /tests\n"
TEST_SH = """#!/bin/sh
said="$(id -u):$(id -g) $(stat -c %u:%g /tmp/agent-file)"
echo "$said"
[ "$said" = "{expected} {expected}" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""
USERS = {"nobody": ("USER nobody\n", "65534:65534"), "ids": ("USER 4242:4343\n", "4242:4343"), "none": ("", "0:0")}


@pytest.mark.skipif(os.geteuid() != 0, reason="the embedded backend honours USER as root only")
@pytest.mark.parametrize("user", USERS)
async def test_the_agent_and_the_verifier_run_as_the_images_user(tmp_path, backend, user, no_leaks):
    line, expected = USERS[user]
    task = load_task(write_task(tmp_path, dockerfile=BASE + line, test_sh=TEST_SH.format(expected=expected)))
    agent = ScriptedAgent(("touch /tmp/agent-file; echo $(id -u):$(id -g) $(stat -c %u:%g /tmp/agent-file)",))
    async with AsyncTerminalEnv(task, EnvOptions(backend=backend)) as env:
        await env.reset()
        observation, *_ = await env.step(agent.commands[0])
        _, reward, terminated, _, info = await env.step(SUBMIT)
    assert f"{expected} {expected}" in observation, observation
    assert terminated and info["resolved"] and reward > 0, info
    assert not [w for w in info.get("warnings") or () if "USER" in w], info
