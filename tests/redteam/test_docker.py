"""Red team, Docker: the agent is root in the file system its verifier then executes.

What it changes there cannot be prevented: it is listed (the engine's diff, in the record), and a
trial whose traced verifier loads any of it outside the work directory scores 0 by default
(``--tamper fail``); what the verifier never loads fails nothing. Tasks that need it avoid the
question (the separate verification mode grades in a fresh container). The kill step
spares nothing, the keeper included; builds get no network the task does not allow. (The embedded
backend's builds never had network; a fork storm is in tests/docker.)
"""

from __future__ import annotations

import socket
import textwrap
import threading

import pytest

from termgym.images import build as images
from tests.helpers import KIT_SOURCE, write_task
from tests.redteam.helpers import FORGED_CTRF, attack, forged, oracle_attack

pytestmark = [pytest.mark.redteam, pytest.mark.docker]

# A shim earlier on PATH for the `date` the assertion kit runs under dash for its stop time (the one
# program it still runs under termgym, which gives it a scratch directory and a start time): it tells
# the time, then leaves a writer that puts an all-pass report in place, again and again, for two
# seconds or more: long past the kit's final report. (One that never stopped would hold the traced
# verifier until its timeout, 30 s here: strace waits for every process it follows.)
DATE_SHIM = (
    'printf \'#!/bin/sh\\n/usr/bin/date "$@"\\n'
    "(n=0; while [ $n -lt 200 ]; do echo %s > /logs/verifier/ctrf.json; sleep 0.01; n=$((n+1)); done) >/dev/null 2>&1 &\\n'"
    f" '{FORGED_CTRF}' > /usr/local/bin/date && chmod +x /usr/local/bin/date"
)
PLANTS = {
    "path-shim": (DATE_SHIM, "/usr/local/bin/date"),
    "ld-so-preload": ("echo /usr/lib/libforge.so > /etc/ld.so.preload", "/etc/ld.so.preload"),
    "replaced-sh": (
        "cp /bin/sh /tmp/sh.orig && cp /tmp/sh.orig /bin/sh.new && mv -f /bin/sh.new /bin/sh",
        "/usr/bin/sh",
    ),
}


@pytest.fixture
def backend() -> str:
    return "docker"


@pytest.mark.parametrize("plant", list(PLANTS), ids=list(PLANTS))
async def test_by_default_a_trial_whose_verifier_loads_what_the_agent_planted_scores_zero_and_names_it(
    task_dir, backend, no_leaks, plant
):
    command, path = PLANTS[plant]
    record = await attack(task_dir, backend, command, "echo done > /app/result.txt")
    assert record.system_changes is not None and path in record.system_changes, record.system_changes
    assert record.error is not None and record.error["kind"] == "tampered" and path in record.error["message"]
    assert record.reward == 0.0 and not record.resolved and record.assertions == []


async def test_files_the_verifier_never_reads_are_recorded_and_fail_nothing(task_dir, backend, no_leaks):
    """A ``pytest.ini`` and ``conftest.py`` at ``/`` steer only a pytest that reads them, and this
    verifier (the assertion kit) never does; likewise a helper nobody runs."""
    plant = "echo '[pytest]' > /pytest.ini && echo 'import os' > /conftest.py && touch /usr/local/bin/helper"
    record = await attack(task_dir, backend, plant, "echo done > /app/result.txt")
    assert record.resolved and record.error is None, record
    assert {"/pytest.ini", "/conftest.py", "/usr/local/bin/helper"} <= set(record.system_changes or ())


# A shim the kit's ``date`` finds first on the verifier's PATH, doing nothing but telling the time.
PASS_THROUGH_DATE = (
    "printf '#!/bin/sh\\nexec /usr/bin/date \"$@\"\\n' > /usr/local/bin/date && chmod +x /usr/local/bin/date"
)


async def test_under_the_warn_policy_the_forged_loads_are_a_warning_and_the_verdict_stands(task_dir, backend, no_leaks):
    record = await attack(task_dir, backend, PASS_THROUGH_DATE, "echo done > /app/result.txt", tamper="warn")
    assert record.resolved and record.error is None, record
    assert any("/usr/local/bin/date (added by the agent; executed by the verifier" in w for w in record.warnings)


async def test_a_task_that_allows_system_changes_is_verified_without_a_warning(tmp_path, backend, no_leaks):
    task = write_task(tmp_path, verifier_toml="allow_system_changes = true")
    record = await attack(task, backend, PASS_THROUGH_DATE, "echo done > /app/result.txt")
    assert record.resolved and record.error is None, record
    assert "/usr/local/bin/date" in (record.system_changes or [])
    assert not any("the agent wrote" in w for w in record.warnings), record.warnings


async def test_a_task_that_declares_an_agent_path_lets_the_verifier_run_the_agents_work_there(
    tmp_path, backend, no_leaks
):
    test_sh = f"#!/bin/sh\n{KIT_SOURCE}\ntg_check_sh 'the tool says done' '[ \"$(/usr/local/bin/say-done)\" = done ]'\ntg_finish\n"
    install = "printf '#!/bin/sh\\necho done\\n' > /usr/local/bin/say-done && chmod +x /usr/local/bin/say-done"
    undeclared = write_task(tmp_path, "undeclared", test_sh=test_sh)
    record = await attack(undeclared, backend, install)
    assert record.error is not None and record.error["kind"] == "tampered", record
    declared = write_task(
        tmp_path, "declared", test_sh=test_sh, verifier_toml='agent_paths = ["/usr/local/bin/say-done"]'
    )
    record = await attack(declared, backend, install)
    assert record.resolved and record.error is None, record


async def test_a_clean_episode_fails_nothing_and_its_changes_are_listed(task_dir, backend, no_leaks):
    record = await attack(task_dir, backend, "echo done > /app/result.txt; mkdir -p /root/x /tmp/y")
    assert record.resolved and record.error is None
    assert record.system_changes == ["/root/x", "/tmp/y"] and not record.warnings[:-1]


async def test_under_the_fail_policy_a_tampered_trial_scores_zero_without_running_the_verifier(
    task_dir, backend, no_leaks
):
    record = await attack(task_dir, backend, DATE_SHIM)  # "fail" is the default
    assert record.error is not None, record
    assert record.error["kind"] == "tampered" and "/usr/local/bin/date" in record.error["message"]
    assert record.reward == 0.0 and not record.resolved and record.assertions == []


async def test_the_separate_verification_mode_grades_in_a_fresh_container(tmp_path, backend, no_leaks):
    """The shim would have forged the report in the agent's container; the separate verifier runs
    in a new one, into which only the declared artifact is copied."""
    task = write_task(
        tmp_path, verifier_toml='environment_mode = "separate"', top_toml='artifacts = ["/app/result.txt"]'
    )
    cheated = await attack(task, backend, DATE_SHIM)
    assert not forged(cheated), cheated
    honest = await attack(task, backend, DATE_SHIM, "echo done > /app/result.txt")
    assert honest.resolved and honest.error is None, honest


async def test_a_rewritten_keeper_does_not_survive_into_verification(tmp_path, backend, no_leaks):
    """The old kill step spared PID 1 and the keeper; a root process can rewrite the keeper's memory
    through /proc/<pid>/mem. Here the rewrite is visible (its command line), and the verifier
    looks for it: the container's restart must have ended it."""
    rewrite = textwrap.dedent("""\
        for p in /proc/[0-9]*; do [ "$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)" = "/bin/sleep infinity " ] && pid=${p#/proc/}; done
        perl -e 'my $pid = shift; open my $s, "<", "/proc/$pid/stat" or die; my $st = <$s>; $st =~ s/^.*\\) //;
                 my @f = split / /, $st; open my $m, "+<", "/proc/$pid/mem" or die "mem: $!";
                 sysseek $m, $f[45], 0 or die; syswrite $m, "PWNED" or die "write: $!"' "$pid" && tr '\\0' ' ' < /proc/$pid/cmdline > /app/rewritten
        """)
    test_sh = textwrap.dedent(f"""\
        #!/bin/sh
        {KIT_SOURCE}
        tg_check_sh "the attack rewrote the keeper" 'grep -q PWNED /app/rewritten'
        tg_check_sh "no rewritten process left" '! cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" " " | grep -q "PWNE[D]"'
        tg_finish
        """)
    record = await oracle_attack(tmp_path, backend, f"#!/bin/bash\n{rewrite}", test_sh=test_sh)
    assert record.resolved, record.assertions


async def test_a_build_step_cannot_reach_the_hosts_loopback(tmp_path, backend, no_leaks):
    """A task without network builds without network: a RUN step that connects to a listener on the
    host's loopback (the old builds ran in the host's network namespace) reaches nothing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    reached = threading.Event()

    def accept() -> None:
        try:
            listener.accept()
            reached.set()
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    dockerfile = f"FROM {images.BASE_IMAGE}\nWORKDIR /app\nRUN bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' || true\n"
    task = write_task(tmp_path, dockerfile=dockerfile)
    record = await attack(task, backend, "echo done > /app/result.txt")
    thread.join()
    listener.close()
    assert record.resolved and not reached.is_set()
