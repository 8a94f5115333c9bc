"""The persistent shell, attacked one property at a time on the embedded backend."""

from __future__ import annotations

import time

import pytest

from termgym.episode.persistent_shell import PersistentShell, bash_quote
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.local import LocalSandbox
from tests.helpers import pids_matching


@pytest.fixture
async def shell(no_leaks):
    sandbox = LocalSandbox(SandboxSpec(name="shell-test", context_dir=None, dockerfile=None))
    async with sandbox:
        shell = PersistentShell(sandbox, env={"PATH": "/usr/bin:/bin", "HOME": "/root"}, cwd="/app", output_limit=4096)
        await shell.start()
        yield shell
        await shell.close()


async def test_state_persists_between_commands(shell):
    await shell.run("cd /tmp && export GREETING=hello && f() { echo fn-$1; }", timeout=10)
    result = await shell.run("echo $PWD $GREETING; f x", timeout=10)
    assert result.output == "/tmp hello\nfn-x\n"
    assert result.exit_code == 0 and result.cwd == "/tmp"


async def test_background_job_survives_later_commands(shell):
    started = await shell.run("sleep 300 & echo $!", timeout=10)
    pid = started.output.strip()
    await shell.run("true", timeout=10)
    assert (await shell.run(f"kill -0 {pid} && echo alive", timeout=10)).output == "alive\n"


@pytest.mark.parametrize(
    ("command", "output", "code"),
    [
        ("printf abc", "abc", 0),
        ("printf 'abc\\n\\n'", "abc\n\n", 0),
        ("echo out; echo err >&2; exit_code=3; (exit $exit_code)", "out\nerr\n", 3),
        ("false", "", 1),
        ("echo 'it'\"'\"'s' \"a\\\\b\" $'tab\\there'", "it's a\\b tab\there\n", 0),
        ("cat <<'EOF'\nline one\n  $HOME stays\nEOF", "line one\n  $HOME stays\n", 0),
        ("echo 'héllo wörld ✓'", "héllo wörld ✓\n", 0),
        ('echo "__TG_deadbeef_ 0 /"', "__TG_deadbeef_ 0 /\n", 0),
        ("cat", "", 0),  # stdin is /dev/null, never the shell's command stream
        ("if true; then", "", 2),  # a syntax error is the command's failure, not the shell's
    ],
)
async def test_output_and_exit_code_are_exact(shell, command, output, code):
    result = await shell.run(command, timeout=10)
    if code == 2:
        assert "syntax error" in result.output
    else:
        assert result.output == output
    assert result.exit_code == code and not result.timed_out


async def test_foreground_timeout_kills_command_and_keeps_shell(shell):
    await shell.run("X=kept; sleep 300 & echo $! > /tmp/bg.pid", timeout=10)
    started = time.monotonic()
    result = await shell.run("sleep 123457 | cat", timeout=1)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 5
    assert not pids_matching("sleep 123457")
    after = await shell.run('echo $X; kill -0 "$(cat /tmp/bg.pid)" && echo bg-alive', timeout=10)
    assert after.output == "kept\nbg-alive\n"
    assert not after.shell_restarted


async def test_builtin_loop_timeout_is_broken_without_restart(shell):
    await shell.run("Y=still-here", timeout=10)
    started = time.monotonic()
    result = await shell.run("while true; do :; done", timeout=1)
    assert result.timed_out and not result.shell_restarted
    assert time.monotonic() - started < 5
    assert (await shell.run("echo $Y", timeout=10)).output == "still-here\n"


async def test_timeout_of_command_substitution_in_shell_group(shell):
    result = await shell.run("x=$(sleep 123458); echo never", timeout=1)
    assert result.timed_out
    assert "never" not in result.output
    assert not pids_matching("sleep 123458")
    assert (await shell.run("echo ok", timeout=10)).output == "ok\n"


async def test_flood_is_capped_head_and_tail(shell):
    result = await shell.run("seq 1 2000000", timeout=60)
    assert result.exit_code == 0
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("1999999\n2000000\n")
    assert result.dropped_bytes == len("".join(f"{i}\n" for i in range(1, 2000001))) - 4096
    assert len(result.output.encode()) < 4096 + 200


async def test_binary_and_invalid_utf8_output(shell):
    result = await shell.run("head -c 20000 /dev/urandom; printf '\\xff\\xfe\\x00ok'", timeout=10)
    assert result.exit_code == 0 and result.output.endswith("\x00ok")
    assert "\ufffd" in result.output


async def test_exit_restarts_shell_in_last_directory(shell):
    await shell.run("cd /tmp", timeout=10)
    result = await shell.run("echo bye; exit 3", timeout=10)
    assert result.shell_restarted and result.exit_code == 3
    assert "bye" in result.output
    after = await shell.run("pwd", timeout=10)
    assert after.output == "/tmp\n" and after.exit_code == 0


async def test_an_exit_is_seen_at_once_while_a_detached_job_holds_the_output(shell):
    """The shell's end is its process's end, not its output's: a detached job that inherited the
    output keeps the pipe open, and ``set -e`` then a failing command still ends the command at
    once with its status (it was reported as timed out after the whole timeout)."""
    await shell.run("(setsid sh -c 'while :; do sleep 0.05; done' &); set -e", timeout=10)
    started = time.monotonic()
    result = await shell.run("false", timeout=20)
    assert result.shell_restarted and result.exit_code == 1 and not result.timed_out, result
    assert time.monotonic() - started < 10
    assert (await shell.run("echo after", timeout=10)).output == "after\n"


async def test_redirected_stdout_does_not_hide_the_sentinel(shell):
    result = await shell.run("exec >/dev/null; echo hidden", timeout=10)
    assert result.exit_code == 0 and result.output == ""
    assert (await shell.run("echo also hidden; echo shown >&2", timeout=10)).output == "shown\n"


async def test_trapped_signal_falls_back_to_restart(shell):
    await shell.run("cd /tmp", timeout=10)
    result = await shell.run("trap '' USR1; while true; do :; done", timeout=1)
    assert result.timed_out and result.shell_restarted
    assert (await shell.run("pwd", timeout=10)).output == "/tmp\n"


@pytest.mark.parametrize(
    "text", ["plain", "it's", "back\\slash", "new\nline", "tab\t", "ünï €", "\x01\x7f", "'$(rm -rf /)'"]
)
def test_bash_quote_is_a_single_safe_word(text):
    quoted = bash_quote(text)
    assert quoted.startswith("$'") and quoted.endswith("'")
    assert "\n" not in quoted and "'" not in quoted[2:-1]
