"""Red team, the verifier: the agent plants what the verifier would pick up from the agent's home,
working directory, git config or processes, to forge its report.

Each task's verifier does the real check (is /app/result.txt "done"?), which no attack satisfies,
and also runs something the agent could steer (python3, git, a program of the agent's). Python and
git come from the host on the embedded backend; the offline Docker base image has neither, so those
attacks run on the embedded backend only; the ones that need just a shell run on both.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import KIT_SOURCE
from tests.redteam.helpers import FORGED_CTRF, oracle_attack

pytestmark = [pytest.mark.redteam]

# What the agent's planted code does if the verifier ever runs it: leave a mark. (Run, it could
# forge anything the verifier writes; that it never runs is what is checked.)
MARK = "/app/agent-code-ran"
MARK_IT = f"open({MARK!r}, 'w').close()"


def verifier_running(step: str) -> str:
    """A verifier that runs ``step`` (something the agent could steer), then checks that the
    agent's code never ran and that the real work was done."""
    return textwrap.dedent(f"""\
        #!/bin/sh
        {KIT_SOURCE}
        tg_check_sh "verifier tool runs" {step!r}
        tg_check "no agent code ran" test ! -e {MARK}
        tg_check_sh "result says done" 'grep -qx done /app/result.txt'
        tg_finish
        """)


SOLVE = "#!/bin/sh\necho done > /app/result.txt\n"


async def test_a_python_usercustomize_in_the_agents_home_is_not_loaded(tmp_path, no_leaks):
    plant = SOLVE + textwrap.dedent(f"""\
        site=$(python3 -c 'import site; print(site.getusersitepackages())')
        mkdir -p "$site" && echo "{MARK_IT}" > "$site/usercustomize.py"
        """)
    record = await oracle_attack(tmp_path, "local", plant, test_sh=verifier_running("python3 -c 'print(1)'"))
    assert record.resolved, record.assertions


async def test_a_module_shadowing_the_standard_library_in_the_working_directory_is_not_imported(tmp_path, no_leaks):
    """``python3 -m unittest`` puts the working directory first on sys.path, unless safe-path is on:
    the agent's /app/unittest.py would run, say OK and exit 0."""
    plant = SOLVE + f"printf '%s\\nraise SystemExit(0)\\n' \"{MARK_IT}\" > /app/unittest.py\n"
    test_py = "import unittest\n\nclass T(unittest.TestCase):\n    def test_done(self):\n        self.assertEqual(open('/app/result.txt').read(), 'done\\n')\n"
    step = "cd /app && python3 -m unittest discover -s /tests -p 'test_*.py'"
    record = await oracle_attack(
        tmp_path, "local", plant, test_sh=verifier_running(step), extra_files={"tests/test_done.py": test_py}
    )
    assert record.resolved, record.assertions


@pytest.mark.parametrize("where", ["global", "repository"])
async def test_a_git_fsmonitor_hook_from_the_agent_is_not_run(tmp_path, no_leaks, where):
    hook = f"printf '#!/bin/sh\\ntouch {MARK}\\n' > /app/hook.sh && chmod +x /app/hook.sh"
    config = (
        "git config --global core.fsmonitor /app/hook.sh"
        if where == "global"
        else "git -C /app config core.fsmonitor /app/hook.sh"
    )
    plant = SOLVE + f"cd /app && git init -q . && {hook} && {config}\n"
    record = await oracle_attack(
        tmp_path, "local", plant, test_sh=verifier_running("git -C /app status --porcelain >/dev/null")
    )
    assert record.resolved, record.assertions


# Left behind by the agent's program, which the verifier runs: it waits for termgym's report reader
# (the one process whose command line reads /logs/verifier), stops it, swaps in an all-pass report,
# and lets it go on. Only a process still alive while the reports are read can do this.
SWAPPER = (
    "(while :; do ps=; for r in $(grep -ls 'cd /logs/verifie[r]' /proc/[0-9]*/cmdline); do p=${r#/proc/}; ps=\"$ps ${p%/cmdline}\"; done;"
    ' [ -n "$ps" ] || continue; kill -STOP $ps; echo \'' + FORGED_CTRF + "' > /logs/verifier/f.tmp;"
    " mv -f /logs/verifier/f.tmp /logs/verifier/ctrf.json; kill -CONT $ps; exit; done) >/dev/null 2>&1 &"
)


async def test_a_process_the_verifier_started_cannot_rewrite_the_reports_while_they_are_read(
    tmp_path, backend, no_leaks
):
    plant = f"#!/bin/sh\ncat > /app/tool.sh <<'EOF'\n#!/bin/sh\n{SWAPPER}\nexit 0\nEOF\nchmod +x /app/tool.sh\n"
    test_sh = f"#!/bin/sh\n{KIT_SOURCE}\ntg_check_sh 'tool runs' /app/tool.sh\ntg_check_sh 'result says done' 'grep -qx done /app/result.txt'\ntg_finish\n"
    # The swapper never exits, so the verifier always runs into its timeout (then everything it
    # started is ended before the reports are read): 8 s, not write_task's 30, is that wait.
    record = await oracle_attack(tmp_path, backend, plant, test_sh=test_sh, verifier_timeout=8.0)
    assert not record.resolved and record.passed == 1, record.assertions


async def test_the_verifier_runs_with_its_own_home_and_a_clean_environment(tmp_path, backend, no_leaks):
    plant = (
        "#!/bin/sh\necho 'export FORGED=1' >> /root/.profile; touch /root/.agent-was-here; export AGENT_VAR=1\n"
        "mkdir -p /tmp/.termgym-verifier/kit; ln -s /app/result.txt /tmp/.termgym-verifier/kit/out\n"
        "echo done > /app/result.txt\n"
    )
    test_sh = textwrap.dedent(f"""\
        #!/bin/sh
        {KIT_SOURCE}
        tg_check_sh "a fresh home" '[ "$HOME" != /root ] && [ -d "$HOME" ] && [ -z "$(ls -A "$HOME")" ]'
        tg_check_sh "no agent variable" '[ -z "${{AGENT_VAR:-}}${{FORGED:-}}" ]'
        tg_check_sh "python without user site nor cwd" '[ "$PYTHONNOUSERSITE" = 1 ] && [ "$PYTHONSAFEPATH" = 1 ]'
        tg_check_sh "git without the agent's config" '[ "$GIT_CONFIG_GLOBAL" = /dev/null ]'
        tg_check_sh "the kit's own fresh scratch" '[ "$TG_SCRATCH" = /tmp/.termgym-verifier/kit ] && [ ! -L "$TG_SCRATCH/out" ] && [ "$(ls -A "$TG_SCRATCH")" = out ]'
        tg_check_sh "a start time" 'case $TG_START_MS in "" | *[!0-9]*) exit 1 ;; esac; [ "$TG_START_MS" -gt 1700000000000 ]'
        tg_check_sh "the agent's link not followed" 'grep -qx done /app/result.txt'
        tg_finish
        """)
    record = await oracle_attack(tmp_path, backend, plant, test_sh=test_sh)
    assert record.resolved, record.assertions
