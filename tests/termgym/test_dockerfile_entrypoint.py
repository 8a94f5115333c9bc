"""A task Dockerfile's own ENTRYPOINT, run alike on the embedded backend and on Docker: it starts a
service the agent can use and the verifier needs, again after the restart that ends the agent's
processes (exec form, and the shell form under ``/bin/sh -c`` that runs the keeper as ``"$0" "$@"``);
without it the same task scores 0 on both."""

from __future__ import annotations

import pytest

from termgym.agents import ScriptedAgent
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from tests.helpers import write_task

# Doubles the number in /tmp/request into /tmp/response, for as long as it runs.
DOUBLER = """#!/bin/sh
while true; do
  if [ -f /tmp/request ]; then
    n=$(cat /tmp/request); rm -f /tmp/request; echo $((n * 2)) > /tmp/response.new; mv /tmp/response.new /tmp/response
  fi
  sleep 0.05
done
"""
ENTRY = '#!/bin/sh\n/opt/svc/doubler.sh &\nexec "$@"\n'
# Asks, and waits up to {tries} tenths of a second for the answer: 10 s where the service runs (room
# for a loaded machine), 2 s where there is none (the doubler answers in a tenth when it runs, so 2 s
# still tells; the 10 s the test waited there, twice, were most of its time).
ASK = (
    "rm -f /tmp/response; echo {n} > /tmp/request; i=0; "
    "while [ ! -f /tmp/response ] && [ $i -lt {tries} ]; do sleep 0.1; i=$((i + 1)); done; "
    'echo "answer $(cat /tmp/response 2>/dev/null)"'
)
REWARD = 'grep -qx "answer 42" /tmp/said && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n'


def verifier_script(tries: int) -> str:
    return "#!/bin/sh\nmkdir -p /logs/verifier\n" + ASK.format(n=21, tries=tries) + " > /tmp/said\n" + REWARD


BASE = (
    "FROM termgym/base:bookworm\nWORKDIR /app\nCOPY doubler.sh entry.sh /opt/svc/\n"
    "RUN chmod +x /opt/svc/doubler.sh /opt/svc/entry.sh\n"
)
FORMS = {
    "exec-form": 'ENTRYPOINT ["/opt/svc/entry.sh"]\n',
    "shell-form": 'ENTRYPOINT /opt/svc/doubler.sh & exec "$0" "$@"\n',
    "none": "",
}


@pytest.mark.parametrize("form", FORMS)
async def test_the_dockerfiles_entrypoint_service_is_up_for_the_agent_and_the_verifier(
    tmp_path, backend, form, no_leaks
):
    served = form != "none"
    tries = 100 if served else 20
    files = {"environment/doubler.sh": DOUBLER, "environment/entry.sh": ENTRY}
    task = load_task(
        write_task(tmp_path, dockerfile=BASE + FORMS[form], test_sh=verifier_script(tries), extra_files=files)
    )
    agent = ScriptedAgent((ASK.format(n=5, tries=tries),))
    async with AsyncTerminalEnv(task, EnvOptions(backend=backend)) as env:
        await env.reset()
        observation, *_ = await env.step(agent.commands[0])
        _, reward, terminated, _, info = await env.step(SUBMIT)
    assert ("answer 10" in observation) == served, observation
    assert terminated and info["resolved"] == served and (reward > 0) == served, info
    assert not [w for w in info.get("warnings") or () if "ntrypoint" in w], info
