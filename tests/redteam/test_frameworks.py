"""Red team, the framework integrations: an agent driven by inspect-ai acts through the provider's
``exec`` (a fresh process per command, not termgym's shell) and by inspect's injected tools; it must
not be able to steer the verdict ``termgym_scorer`` reads.

The task's verifier does the real check (is /app/result.txt "done"?), which no attack satisfies.
"""

from __future__ import annotations

import pytest

from tests.helpers import write_task
from tests.redteam.helpers import FORGED_CTRF

pytest.importorskip("inspect_ai", reason="the integrations extra")
from termgym.integrations.inspect import TermgymSandboxConfig, TermgymSandboxEnvironment

pytestmark = [pytest.mark.redteam]

# A detached writer (its own session, stdio closed, the parent gone at once) that forges every
# report the verifier could write, as fast as it can, for as long as it lives.
FORGER = (
    "setsid sh -c 'while :; do mkdir -p /logs/verifier; "
    f"printf %s {FORGED_CTRF!r} > /logs/verifier/ctrf.json; echo 1 > /logs/verifier/reward.txt; "
    "sleep 0.01; done' </dev/null >/dev/null 2>&1 &"
)

SEEN_FORGED = (
    "for _ in $(seq 100); do "
    '[ "$(cat /logs/verifier/reward.txt 2>/dev/null)" = 1 ] && { echo 1; exit 0; }; '
    "sleep 0.1; done"
)


async def test_a_detached_forger_started_through_inspects_exec_is_gone_before_the_scorer_verifies(
    tmp_path, backend, no_leaks
):
    config = TermgymSandboxConfig(task=str(write_task(tmp_path)), backend=backend)
    environments = await TermgymSandboxEnvironment.sample_init("redteam", config, {})
    box = environments["default"].as_type(TermgymSandboxEnvironment)
    try:
        started = await box.exec(["sh", "-c", FORGER])
        assert started.success
        # The forger truncates and rewrites the file every 10 ms, so one read may land between
        # the two; a busy machine may start it late. Look until it is seen (10 s at most).
        alive = await box.exec(["sh", "-c", SEEN_FORGED])
        assert alive.stdout == "1\n"  # the forger runs, out of the command's reach
        verdict = await box.verify()
    finally:
        await TermgymSandboxEnvironment.sample_cleanup("redteam", config, environments, False)
    assert (verdict["resolved"], verdict["passed"], verdict["reward"]) == (0, 0, 0.0), verdict
    assert verdict["total"] == 2 and verdict["error"] is None, (verdict["error"], verdict["verifier_output"])
