"""Red team, search paths: the agent plants a program where the verifier or the harness looks one up.

The task's own image may put a directory the agent can write first on a search path (``ENV
PATH=/root/.local/bin:$PATH``, ``PYTHONPATH``, ``PERL5LIB``, ``BASH_ENV``: common in real images),
link a tool from a system directory into one the agent can write, or run files the agent can write
from its entrypoint at every restart; the harness itself may run its helpers (``timeout``, ``env``,
the container's ``sleep`` keeper) by the container's ``PATH``; and on Docker the agent is root over
``/usr/local/bin`` and ``/bin/sh``. Each attack plants a program that forges the verifier's report;
none does the real work (the verifier checks that /app/result.txt says done), so any reward is
forged. The verifier must drop the agent-writable entries (saying so in a warning), the harness
must run only what the agent could not change, and on Docker the default tamper policy fails a
trial that changed system paths.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.redteam.helpers import FORGED_CTRF, REAL_TEST_SH, forged, oracle_attack
from tests.redteam.plants import HOOK_DIR, HOOKED_ENTRYPOINT, HOOKED_ENTRYPOINT_SCRIPT, LOCAL_BIN, LOCAL_BIN_FIRST

pytestmark = [pytest.mark.redteam]

# Leaves the all-pass report where a planted program can print or copy it.
FORGED_FILE = "/root/.local/forged.json"
WRITE_FORGED = f"mkdir -p {LOCAL_BIN} && printf '%s' '{FORGED_CTRF}' > {FORGED_FILE}\n"


# A stand-in for the `date` the assertion kit runs under dash for its stop time (the one program it
# still runs under termgym, which gives it a scratch directory and a start time): it tells the time,
# then leaves a writer that puts the forged report in place, again and again, for two seconds or
# more: long past the kit's final report (one that never stopped would hold the traced verifier
# until its timeout: strace waits for every process it follows).
DATE_SHIM = (
    f'#!/bin/sh\n/usr/bin/date "$@"\n'
    f"(n=0; while [ $n -lt 200 ]; do cat {FORGED_FILE} > /logs/verifier/ctrf.json; sleep 0.01; n=$((n+1)); done) >/dev/null 2>&1 &"
)


def planted(path: str, body: str) -> str:
    """A solution that writes the executable ``path`` with ``body``, after the forged report."""
    return f"#!/bin/sh\n{WRITE_FORGED}cat > {path} <<'EOF'\n{textwrap.dedent(body).strip()}\nEOF\nchmod +x {path}\n"


def warned_about(record, directory: str) -> bool:
    return any(directory in warning for warning in record.warnings)


async def test_an_agent_writable_directory_first_on_the_images_path_cannot_shim_the_verifiers_tools(
    tmp_path, backend, no_leaks
):
    """The assertion kit runs ``date`` for its stop time: a ``date`` in /root/.local/bin (first on
    the image's PATH) would put an all-pass report in place."""
    shim = planted(f"{LOCAL_BIN}/date", DATE_SHIM)
    record = await oracle_attack(tmp_path, backend, shim, dockerfile=LOCAL_BIN_FIRST, test_sh=REAL_TEST_SH)
    assert not forged(record), record
    assert warned_about(record, LOCAL_BIN), record.warnings


async def test_an_agent_writable_pythonpath_of_the_image_cannot_rewrite_a_python_verifiers_report(tmp_path, no_leaks):
    """``ENV PYTHONPATH=/app/lib``: the agent's /app/lib/sitecustomize.py would be imported by the
    verifier's python3 and rewrite its report at exit, even with the report's format and count
    declared. (python3 is the host's on the embedded backend; the offline Docker image has none.)"""
    check_py = textwrap.dedent("""\
        import json, os

        def says_done():
            try:
                with open("/app/result.txt") as f:
                    return f.read() == "done\\n"
            except OSError:
                return False

        def one_line():
            try:
                with open("/app/result.txt") as f:
                    return len(f.read().splitlines()) == 1
            except OSError:
                return False

        checks = {"result exists": os.path.isfile("/app/result.txt"), "result says done": says_done(), "one line": one_line()}
        tests = [{"name": n, "status": "passed" if ok else "failed"} for n, ok in checks.items()]
        with open("/logs/verifier/ctrf.json", "w") as f:
            json.dump({"results": {"tests": tests}}, f)
        """)
    forger = textwrap.dedent("""\
        import atexit, json

        def forge():
            tests = [{"name": f"t{i}", "status": "passed"} for i in range(3)]
            with open("/logs/verifier/ctrf.json", "w") as f:
                json.dump({"results": {"tests": tests}}, f)

        atexit.register(forge)
        """)
    solve = f"#!/bin/sh\nmkdir -p /app/lib\ncat > /app/lib/sitecustomize.py <<'EOF'\n{forger}EOF\n"
    record = await oracle_attack(
        tmp_path,
        "local",
        solve,
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nENV PYTHONPATH=/app/lib\n",
        test_sh="#!/bin/sh\nexec python3 /tests/check.py\n",
        extra_files={"tests/check.py": check_py},
        verifier_toml='report_format = "ctrf"\nassertions = 3',
    )
    assert not forged(record), record
    assert record.total == 3, record.assertions
    assert warned_about(record, "/app/lib"), record.warnings


async def test_a_perl5lib_of_the_image_cannot_shadow_a_perl_verifiers_modules(tmp_path, backend, no_leaks):
    """``ENV PERL5LIB=/app/lib`` puts the agent's directory before perl's own: its strict.pm would be
    loaded by the verifier's ``use strict`` and rewrite the report at exit. (perl is in the offline
    Docker image and on the host.)"""
    check_pl = textwrap.dedent("""\
        use strict;
        use warnings;
        my $done = open(my $in, '<', '/app/result.txt') && (<$in> // '') eq "done\\n";
        open(my $out, '>', '/logs/verifier/ctrf.json') or die "report: $!";
        print $out '{"results":{"tests":[{"name":"result says done","status":"' . ($done ? 'passed' : 'failed') . '"}]}}';
        close $out;
        """)
    strict_pm = f"package strict;\nsub import {{}}\nsub unimport {{}}\nEND {{ system('cat {FORGED_FILE} > /logs/verifier/ctrf.json') }}\n1;\n"
    solve = f"#!/bin/sh\n{WRITE_FORGED}mkdir -p /app/lib\ncat > /app/lib/strict.pm <<'EOF'\n{strict_pm}EOF\n"
    record = await oracle_attack(
        tmp_path,
        backend,
        solve,
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nENV PERL5LIB=/app/lib\n",
        test_sh="#!/bin/sh\nexec perl /tests/check.pl\n",
        extra_files={"tests/check.pl": check_pl},
    )
    assert not forged(record), record
    assert warned_about(record, "/app/lib"), record.warnings


async def test_a_bash_env_of_the_image_cannot_hook_a_bash_verifier(tmp_path, backend, no_leaks):
    """``ENV BASH_ENV=/root/.bash_env``: every non-interactive bash sources that file first, the
    verifier's ``#!/bin/bash`` test script too; the agent's file traps its exit to forge the report."""
    hook = f"printf '%s\\n' 'trap \"cat {FORGED_FILE} > /logs/verifier/ctrf.json\" EXIT' > /root/.bash_env\n"
    record = await oracle_attack(
        tmp_path,
        backend,
        f"#!/bin/sh\n{WRITE_FORGED}{hook}",
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nENV BASH_ENV=/root/.bash_env\n",
        test_sh=REAL_TEST_SH.replace("#!/bin/sh", "#!/bin/bash", 1),
    )
    assert not forged(record), record
    assert warned_about(record, "/root/.bash_env"), record.warnings


@pytest.mark.docker
async def test_a_timeout_first_on_the_containers_path_cannot_answer_the_report_read(tmp_path, no_leaks):
    """Every command the Docker backend runs starts with ``timeout`` and ``env``, looked up on the
    container's PATH: a planted ``timeout`` passes everything through but termgym's read of the
    reports, which it answers with a forged stream (name NUL size NUL bytes)."""
    shim = planted(
        f"{LOCAL_BIN}/timeout",
        f"""\
        #!/bin/sh
        case "$*" in
          *"cd /logs/verifier"*) printf 'ctrf.json\\0%s\\0' "$(wc -c < {FORGED_FILE})"; cat {FORGED_FILE}; exit 0 ;;
        esac
        exec /usr/bin/timeout "$@"
        """,
    )
    record = await oracle_attack(tmp_path, "docker", shim, dockerfile=LOCAL_BIN_FIRST, test_sh=REAL_TEST_SH)
    assert not forged(record), record


@pytest.mark.docker
async def test_a_sleep_first_on_the_containers_path_does_not_run_again_at_the_kill_step(tmp_path, no_leaks):
    """The kill step restarts the container, whose keeper ``sleep infinity`` is found on the
    container's PATH: a planted ``sleep`` runs the agent's code after every restart, the one after
    the verifier too, and overwrites the report before termgym reads it; then it becomes the keeper
    (``exec -a sleep``), so the engine lists the keeper it expects."""
    shim = planted(
        f"{LOCAL_BIN}/sleep",
        f"""\
        #!/bin/bash
        mkdir -p /logs/verifier && cat {FORGED_FILE} > /logs/verifier/ctrf.json
        exec -a sleep /usr/bin/sleep "$@"
        """,
    )
    record = await oracle_attack(tmp_path, "docker", shim, dockerfile=LOCAL_BIN_FIRST, test_sh=REAL_TEST_SH)
    assert not forged(record), record


# What an agent plants under system paths on Docker to forge the report, with default settings.
SYSTEM_PLANTS = {
    "path-shim-in-usr-local-bin": planted("/usr/local/bin/date", DATE_SHIM),
    "replaced-bin-sh": planted(
        "/tmp/sh.new",
        f"""\
        #!/usr/bin/dash
        if [ "$1" = /tests/test.sh ]; then mkdir -p /logs/verifier; cat {FORGED_FILE} > /logs/verifier/ctrf.json; exit 0; fi
        exec /usr/bin/dash "$@"
        """,
    )
    + "mv -f /tmp/sh.new /usr/bin/sh\n",
}


@pytest.mark.docker
@pytest.mark.parametrize("plant", list(SYSTEM_PLANTS), ids=list(SYSTEM_PLANTS))
async def test_by_default_a_trial_that_changed_system_paths_earns_nothing(tmp_path, no_leaks, plant):
    """No ``tamper=`` given: the default policy must not grade a verifier the agent replaced."""
    record = await oracle_attack(tmp_path, "docker", SYSTEM_PLANTS[plant], test_sh=REAL_TEST_SH)
    assert not forged(record), record
    assert record.error is not None and record.error["kind"] == "tampered", record.error


# An image's entrypoint runs again at every restart of the container, the kill step's after the
# verifier too, before termgym reads the reports: whatever of the agent's it runs can overwrite them.
ENTRYPOINTS = {
    "absolute-in-app": (
        'COPY entry.sh /app/entry.sh\nRUN chmod +x /app/entry.sh\nENTRYPOINT ["/app/entry.sh"]\n',
        '#!/bin/sh\nexec "$@"\n',
        "/app/entry.sh",
    ),
    "relative-to-the-workdir": (
        'COPY entry.sh /app/entry.sh\nRUN chmod +x /app/entry.sh\nENTRYPOINT ["./entry.sh"]\n',
        '#!/bin/sh\nexec "$@"\n',
        "/app/entry.sh",
    ),
}


@pytest.mark.docker
@pytest.mark.parametrize("entrypoint", list(ENTRYPOINTS), ids=list(ENTRYPOINTS))
async def test_what_the_images_entrypoint_runs_at_a_restart_cannot_rewrite_the_reports(tmp_path, no_leaks, entrypoint):
    """The image's entrypoint (as the task author wrote it) is a file the agent can write, named by
    an absolute path or one relative to the working directory. The agent's version writes an
    all-pass report, then starts the keeper: the tamper check watches the entrypoint."""
    setup, script, hook = ENTRYPOINTS[entrypoint]
    body = f'mkdir -p /logs/verifier && cat {FORGED_FILE} > /logs/verifier/ctrf.json 2>/dev/null\nexec "$@"'
    record = await oracle_attack(
        tmp_path,
        "docker",
        planted(hook, f"#!/bin/sh\n{body}"),
        dockerfile=f"FROM debian:bookworm-slim\nWORKDIR /app\n{setup}",
        test_sh=REAL_TEST_SH,
        extra_files={"environment/entry.sh": script},
    )
    assert not forged(record), record
    assert record.error is not None and record.error["kind"] == "tampered" and hook in record.error["message"]


@pytest.mark.docker
async def test_a_hook_an_entrypoint_runs_from_a_writable_directory_is_left_behind_by_the_separate_mode(
    tmp_path, no_leaks
):
    """An unchanged entrypoint that runs every hook in /docker-entrypoint.d at each start (as nginx's
    and postgres's images do) runs the agent's hook again at the kill step's restarts: no check of
    the shared container can tell it from the task's own (docs/security.md says so). The separate
    mode grades in a fresh container of the image, where the agent's hook is not."""
    hook = f"{HOOK_DIR}/50-hook.sh"
    solve = planted(hook, f"#!/bin/sh\nmkdir -p /logs/verifier && cat {FORGED_FILE} > /logs/verifier/ctrf.json")
    record = await oracle_attack(
        tmp_path,
        "docker",
        solve,
        dockerfile=f"FROM debian:bookworm-slim\nWORKDIR /app\n{HOOKED_ENTRYPOINT}",
        test_sh=REAL_TEST_SH,
        extra_files={"environment/entry.sh": HOOKED_ENTRYPOINT_SCRIPT},
        verifier_toml='environment_mode = "separate"',
        top_toml='artifacts = ["/app/result.txt"]',
    )
    assert not forged(record), record


@pytest.mark.docker
async def test_a_system_path_link_into_a_directory_the_agent_can_write_is_not_a_trusted_tool(tmp_path, no_leaks):
    """The image installs a tool under /opt and links it from /usr/local/bin (as images do for node,
    conda or an editable install's scripts): the PATH entry is a system directory, the program is
    not. Here the tool is ``date``, which the assertion kit runs; the agent rewrites /opt's copy."""
    setup = (
        "RUN mkdir -p /opt/tools/bin && cp /usr/bin/date /opt/tools/bin/date"
        " && ln -s /opt/tools/bin/date /usr/local/bin/date\n"
    )
    shim = planted("/opt/tools/bin/date.new", DATE_SHIM)
    record = await oracle_attack(
        tmp_path,
        "docker",
        shim + "/usr/bin/mv -f /opt/tools/bin/date.new /opt/tools/bin/date\n",
        dockerfile=f"FROM debian:bookworm-slim\nWORKDIR /app\n{setup}",
        test_sh=REAL_TEST_SH,
    )
    assert not forged(record), record
