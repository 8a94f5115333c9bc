"""``termgym shell`` driven as a person drives it: through a pseudo-terminal, with Ctrl-C, arrow
keys and the history; and ``display_safe``, what a command's output may do to that terminal."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from termgym.cli.shell import history_path
from termgym.episode.persistent_shell import PersistentShell
from termgym.output import display_safe
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.local import LocalSandbox
from termgym.transcript import read_transcript
from tests.helpers import REPO_ROOT

TASK = "termgym/file-ops/bulk-rename"
CTRL_C = "\x03"
UP = "\x1b[A"


class Terminal:
    """``termgym ARGS`` on the child side of a pseudo-terminal, read and typed into."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the command line, as a user starts it, in a 120x40 terminal
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
            os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-m", "termgym", *args], env)
        self.pid, self.fd = pid, fd
        self.screen = ""  # everything printed so far, "\r\n" read as "\n"
        self._seen = 0  # expect() looks after this point

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: str, timeout: float = 60) -> str:
        """Wait until ``pattern`` (a regex) appears in what was printed since the last match; the
        text up to and including it."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            found = regex.search(self.screen, self._seen)
            if found:
                text, self._seen = self.screen[self._seen : found.end()], found.end()
                return text
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"{pattern!r} never appeared; the screen ends with:\n{self.screen[-2000:]}")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the child closed the terminal
            return False
        self.screen += data.decode(errors="replace").replace("\r\n", "\n")
        return bool(data)

    def wait(self, timeout: float = 60) -> int:
        """The exit status, reading the rest of the output meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.1):
                    pass
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            self._read(0.1)
        self.kill()
        raise AssertionError(f"termgym shell did not exit; the screen ends with:\n{self.screen[-2000:]}")

    def kill(self) -> None:
        """After a failure: end a session still running as a user would (Ctrl-C, Ctrl-D), so that
        it stops its sandbox; SIGKILL if it does not exit."""
        try:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        with contextlib.suppress(OSError):
            self.type(CTRL_C)  # the terminal discards what was typed before it: then Ctrl-D
            time.sleep(1)
            self.type("\x04")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                return
            time.sleep(0.1)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


@pytest.fixture
def session_env(tmp_path: Path, no_leaks: Path) -> dict[str, str]:
    """The environment of a user's session: the repository importable, a private cache directory."""
    return {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONPATH": str(REPO_ROOT),
        "TERM": "xterm-256color",
        "COLUMNS": "120",
        "LINES": "40",
    }


def start(tmp_path: Path, env: dict[str, str]) -> Terminal:
    terminal = Terminal("shell", TASK, cwd=tmp_path, env=env)
    terminal.expect(r"/app\$ ", timeout=90)
    return terminal


def transcript_commands(tmp_path: Path) -> list[str]:
    (path,) = (tmp_path / "runs").glob("shell-*/trials/*/trajectory.json")
    turns = read_transcript(path)["turns"]
    return [turn["action"]["command"] for turn in turns if turn["action"]["kind"] == "command"]


def test_ctrl_c_stops_the_command_and_the_shell_keeps_its_state(tmp_path, session_env):
    terminal = start(tmp_path, session_env)
    try:
        terminal.type("export X=5\n")
        terminal.expect(r"/app\$ ")
        terminal.type("echo started; sleep 30; echo never\n")
        terminal.expect(r"echo never\n")  # the line as typed: it runs now
        time.sleep(1.0)
        asked = time.monotonic()
        terminal.type(CTRL_C)
        shown = terminal.expect(r"/app\$ ", timeout=15)
        assert time.monotonic() - asked < 10
        assert "started\n" in shown and "[interrupted]\n" in shown and "never" not in shown
        terminal.type("echo X is $X\n")
        terminal.expect(r"X is 5\n")
        # At the prompt, not before it: text typed ahead of the prompt is the terminal's own line,
        # and the prompt after Ctrl-C then starts on the same line (seen once in a full run).
        terminal.expect(r"/app\$ ")
        terminal.type("echo typed-but-dropped")
        terminal.expect("dropped")
        terminal.type(CTRL_C)
        terminal.expect(r"\n/app\$ ")  # a fresh prompt, the line gone
        terminal.type("echo after\n")
        terminal.expect(r"after\n/app\$ ")
        terminal.type(":help\n")
        listed = terminal.expect(r"/app\$ ")
        assert ":submit" in listed and ":quit" in listed and "Ctrl-C" in listed
        terminal.type(":quit\n")
        assert terminal.wait() == 0
    finally:
        terminal.kill()
    assert re.search(r"left without verifying · 4 turns · \d+\.\ds", terminal.screen), terminal.screen[-500:]
    assert transcript_commands(tmp_path) == [
        "export X=5",
        "echo started; sleep 30; echo never",
        "echo X is $X",
        "echo after",
    ]


def test_the_closing_line_the_transcript_and_the_history(tmp_path, session_env):
    terminal = start(tmp_path, session_env)
    try:
        for command in ("cd /tmp", "sleep 0.3; pwd", "echo third > /tmp/three"):
            terminal.type(command + "\n")
            terminal.expect(r"\$ ")
        terminal.type(":quit\n")
        assert terminal.wait() == 0
    finally:
        terminal.kill()
    closing = re.search(r"left without verifying · (\d+) turns · (\d+\.\d)s", terminal.screen)
    assert closing and closing.group(1) == "3" and float(closing.group(2)) >= 0.3, terminal.screen[-500:]
    assert "transcript: runs/shell-" in terminal.screen
    assert transcript_commands(tmp_path) == ["cd /tmp", "sleep 0.3; pwd", "echo third > /tmp/three"]
    history = history_path(TASK, session_env)
    assert history.is_file() and "sleep 0.3; pwd" in history.read_text()

    # The next session of the task starts with that history (:quit last): Up three times is the
    # second command.
    again = start(tmp_path, session_env)
    try:
        again.type(UP * 3 + "\n")
        again.expect(r"\n/app\n/app\$ ")  # a fresh sandbox: pwd in its workdir
        again.type(":quit\n")
        assert again.wait() == 0
    finally:
        again.kill()
    assert "left without verifying · 1 turns" in again.screen


def test_a_multi_step_task_hands_over_each_step_then_verifies_the_last(tmp_path, session_env):
    task = str(REPO_ROOT / "tests/termgym/fixtures/tasks/harbor-multi-step")
    # its docker_image, ubuntu:24.04, on the host's system (offline), as a user's config says
    (tmp_path / "termgym.toml").write_text('[images.aliases]\n"ubuntu:24.04" = "termgym/base:bookworm"\n')
    terminal = Terminal("shell", task, cwd=tmp_path, env=session_env)
    try:
        terminal.expect(r"Create the directory /app/notes", timeout=90)
        terminal.expect(r"\$ ")
        terminal.type("mkdir -p /app/notes\n:submit\n")
        terminal.expect(r"step 1: Write hello into /app/notes/hello.txt")
        terminal.type("echo hello > /app/notes/hello.txt\n")
        terminal.expect(r"\$ ")
        terminal.type(":submit\n")
        assert terminal.wait() == 0
    finally:
        terminal.kill()
    assert re.search(r"resolved(\x1b\[0m)? · reward 1\.000 · 1/1 assertions", terminal.screen), terminal.screen[-800:]
    assert transcript_commands(tmp_path) == ["mkdir -p /app/notes", "echo hello > /app/notes/hello.txt"]


def test_output_keeps_colours_but_not_what_changes_the_terminal(tmp_path, session_env):
    terminal = start(tmp_path, session_env)
    try:
        terminal.type(r"printf '\033[31mred\033[0m \033]0;pwned\007\033]52;c;cm0K\007\033[6n\033[?1049hend\n'" + "\n")
        terminal.expect(r"end\\n'\n")  # the line as typed
        shown = terminal.expect(r"\$ ")  # what it printed, and the next prompt
        terminal.type(":submit\n")
        assert terminal.wait() == 0
    finally:
        terminal.kill()
    assert shown == "\x1b[31mred\x1b[0m end\n/app$ "
    assert "not resolved" in terminal.screen and "1 turns" in terminal.screen


def test_attach_enters_a_kept_sandbox_with_or_without_its_task(tmp_path, no_leaks):
    def termgym(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "termgym", *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    kept = termgym("check", TASK, "--keep")
    assert kept.returncode == 0, kept.stderr
    (sandbox_id,) = [p.name for p in no_leaks.iterdir()]

    alone = termgym("shell", "--attach", sandbox_id, "--keep", stdin="echo mark > /tmp/mark\n:submit\n:quit\n")
    assert alone.returncode == 0, alone.stderr
    assert "no task to verify" in alone.stdout and "left without verifying · 1 turns" in alone.stdout
    assert [p.name for p in no_leaks.iterdir()] == [sandbox_id]  # --keep: still there

    with_task = termgym("shell", TASK, "--attach", sandbox_id, stdin="cat /tmp/mark\n:submit\n")
    assert with_task.returncode == 0, with_task.stderr
    assert "mark\n" in with_task.stdout and "resolved" in with_task.stdout  # the oracle's work, kept
    assert not list(no_leaks.iterdir())  # without --keep the session's end removes it

    missing = termgym("shell", "--attach", sandbox_id)
    assert missing.returncode == 2 and missing.stderr.strip().endswith("it was never kept)")


async def test_an_interrupt_stops_the_command_and_keeps_the_shell(no_leaks):
    sandbox = LocalSandbox(SandboxSpec(name="interrupt-test", context_dir=None, dockerfile=None))
    async with sandbox:
        shell = PersistentShell(sandbox, env={"PATH": "/usr/bin:/bin"}, cwd="/app")
        await shell.start()
        try:
            await shell.run("cd /tmp && export X=5", timeout=10)
            interrupt = asyncio.Event()
            asyncio.get_running_loop().call_later(0.5, interrupt.set)
            result = await shell.run("echo before; sleep 30; echo after", timeout=60, interrupt=interrupt)
            assert result.interrupted and not result.timed_out and result.exit_code is None
            assert result.output.startswith("before\n") and "after" not in result.output
            assert result.duration < 10 and not result.shell_restarted
            interrupt.clear()
            again = await shell.run("echo $PWD $X", timeout=10, interrupt=interrupt)
            assert again.output == "/tmp 5\n" and not again.interrupted
        finally:
            await shell.close()


# -- display_safe ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text ✓", "plain text ✓"),
        ("\x1b[31mred\x1b[0m", "\x1b[31mred\x1b[0m"),  # SGR kept; it ends in a reset already
        ("\x1b[1;38;5;196mbold", "\x1b[1;38;5;196mbold\x1b[0m"),  # a reset added
        ("\x1b[38:2:10:20:30mrgb\x1b[m", "\x1b[38:2:10:20:30mrgb\x1b[m"),
        ("10%\r\x1b[K20%\x1b[3D\x1b[2C\x1b[1G!", "10%\r\x1b[K20%\x1b[3D\x1b[2C\x1b[1G!"),  # within the line
        ("ab\bc\tz\n", "ab\bc\tz\n"),
        ("a\x1b]0;title\x07b", "ab"),  # window title (OSC 0), BEL-terminated
        ("a\x1b]2;title\x1b\\b", "ab"),  # ... and ST-terminated
        ("\x1b]52;c;cm0gLXJmIH4=\x07x", "x"),  # clipboard write
        ("\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\", "link"),  # hyperlink: its text stays
        ("\x1b[6nx", "x"),  # cursor position report request
        ("\x1b[cx\x1b[>cy", "xy"),  # device attributes requests
        ("\x1b[18tx", "x"),  # window size report
        ("\x1b[?1049hx\x1b[?1049l", "x"),  # alternate screen
        ("\x1b[?2004hx", "x"),  # bracketed paste
        ("\x1b[?25lx", "x"),  # hidden cursor
        ("\x1b[?1000hx", "x"),  # mouse reporting
        ("\x1b[2J\x1b[Hx", "x"),  # clear screen, cursor home
        ("\x1b[5Ax\x1b[10;20Hy", "xy"),  # moves to other lines
        ("\x1b[1;5rx", "x"),  # scroll region
        ("\x1bPq#0;2;0;0;0\x1b\\x", "x"),  # DCS (sixel)
        ("\x1b_apc\x1b\\x\x1b^pm\x1b\\y\x1bXsos\x1b\\z", "xyz"),
        ("\x1bcx\x1b7y\x1b8z\x1b(0q\x1b(B", "xyzq"),  # reset, save/restore cursor, line-drawing set
        ("\x9b31mx\x9dy", "31mxy"),  # 8-bit CSI and OSC: the C1 controls go
        ("a\x07b\x0ec\x0fd\x00e\x7f", "abcde"),  # BEL, shift out/in, NUL, DEL
        ("a\x1b", "a"),  # an ESC cut off
        ("\x1b]0;never ends", "]0;never ends"),  # an unterminated OSC loses its ESC
    ],
)
def test_display_safe(text, shown):
    assert display_safe(text) == shown


def test_display_safe_is_linear_on_hostile_input():
    text = "\x1b[" * 50_000 + "\x1b]" * 50_000
    started = time.monotonic()
    display_safe(text)
    assert time.monotonic() - started < 2


def test_history_path_follows_the_cache_directory():
    assert history_path("termgym/file-ops/bulk-rename", {"XDG_CACHE_HOME": "/c"}) == Path(
        "/c/termgym/history/termgym_file-ops_bulk-rename"
    )
    assert history_path("../x y", {"HOME": "/home/u"}) == Path("/home/u/.cache/termgym/history/x_y")
