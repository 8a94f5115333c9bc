"""The tamper check's evidence (termgym.episode.loads): strace's output read, the kernel's own loads
found, the verdict held against the agent's changes; tables, and the real strace on this host."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from termgym.episode.loads import (
    Load,
    elf_interpreter,
    forged_loads,
    is_cache,
    is_pure_data,
    kernel_interpreter,
    parse_trace,
    reads_as_data,
    shebang_interpreter,
    walked,
)
from termgym.sandboxes.tracing import traced_argv

STRACE = shutil.which("strace", path="/usr/bin:/bin")


def _hex(text: str) -> str:
    return "".join(f"\\x{byte:02x}" for byte in text.encode())


def _open(path: str, *, pid: int | None = None, flags: str = "O_RDONLY|O_CLOEXEC", cwd: str = "/") -> str:
    prefix = f"[pid {pid:5d}] " if pid else ""
    return f'{prefix}openat(AT_FDCWD<{_hex(cwd)}>, "{_hex(path)}", {flags}) = 3<{_hex(path)}>\n'


def _exec(path: str, *, pid: int | None = None) -> str:
    prefix = f"[pid {pid:5d}] " if pid else ""
    return f'{prefix}execve("{_hex(path)}", ["{_hex(path)}"], 0x7ffc /* 3 vars */) = 0\n'


@pytest.mark.parametrize(
    ("trace", "loads", "complete"),
    [
        ("", [], True),
        (_exec("/bin/sh") + _open("/etc/ld.so.cache"), [("/bin/sh", "executed"), ("/etc/ld.so.cache", "opened")], True),
        # children, a directory listed, a file written: only reads and executions are loads
        (
            _exec("/tests/test.sh", pid=7)
            + _open("/opt/venv/lib", pid=7, flags="O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_DIRECTORY")
            + _open("/logs/verifier/junit.xml", pid=8, flags="O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC")
            + _open("/opt/venv/lib/x.pth", pid=8, flags="O_RDWR"),
            [("/tests/test.sh", "executed"), ("/opt/venv/lib/x.pth", "opened")],
            True,
        ),
        # a relative execution resolved by the working directory the same process showed
        (
            _open("/etc/passwd", pid=9, cwd="/app") + _exec("./run.sh", pid=9),
            [("/etc/passwd", "opened"), ("/app/run.sh", "executed")],
            True,
        ),
        # a file name that holds strace's own syntax stays one path
        (_open('/tmp/a> = 3</usr/bin/ok"\n'), [('/tmp/a> = 3</usr/bin/ok"\n', "opened")], True),
        # a line cut in the middle: not read, and the trace is incomplete
        (_open("/etc/passwd") + _open("/opt/x")[:30], [("/etc/passwd", "opened")], False),
        # what is not strace's: ignored
        ("+++ exited with 0 +++\nhello\n", [], True),
    ],
)
def test_parse_trace(trace, loads, complete):
    parsed = parse_trace(trace.encode())
    assert [(load.path, load.how) for load in parsed.loads] == loads
    assert parsed.complete is complete


def test_an_open_names_the_path_as_asked_and_the_directories_on_its_way():
    line = _open("/opt/venv/lib/x.py").replace(f'"{_hex("/opt/venv/lib/x.py")}"', f'"{_hex("lib/../lib/x.py")}"')
    line = line.replace(f"AT_FDCWD<{_hex('/')}>", f"AT_FDCWD<{_hex('/opt/venv')}>")
    (load,) = parse_trace(line.encode()).loads
    assert load.path == "/opt/venv/lib/x.py"
    assert load.via == ("/opt", "/opt/venv", "/opt/venv/lib", "/opt/venv/lib/x.py")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/usr/bin/python3", ("/usr", "/usr/bin", "/usr/bin/python3")),
        ("/opt/./a//b/../c", ("/opt", "/opt/a", "/opt/a/b", "/opt/a/c")),
        ("/..", ()),
        ("relative/x", ()),
    ],
)
def test_walked(path, expected):
    assert walked(path) == expected


def test_a_cut_capture_is_an_incomplete_trace_whatever_it_holds():
    assert not parse_trace(_open("/etc/passwd").encode(), cut=True).complete


def test_a_relative_execution_of_an_unknown_directory_stays_relative():
    (load,) = parse_trace(_exec("bin/tool", pid=3).encode()).loads
    assert load == Load("bin/tool", "executed", 3, relative=True)


@pytest.mark.parametrize(
    ("path", "cache", "data"),
    [
        ("/usr/lib/python3.11/__pycache__/json.cpython-311.pyc", True, False),
        ("/opt/venv/lib/python3.11/site-packages/x/__pycache__", True, False),
        ("/opt/x.pyc", True, False),
        ("/opt/venv/lib/python3.11/site-packages/zz.pth", False, False),
        ("/opt/venv/lib/python3.11/site-packages/forge-1.0.dist-info/entry_points.txt", False, True),
        ("/opt/venv/lib/python3.11/site-packages/forge-1.0.dist-info/METADATA", False, True),
        ("/opt/venv/lib/python3.11/site-packages/forge-1.0.dist-info/forge.py", False, False),
        ("/opt/venv/pyvenv.cfg", False, False),
        ("/etc/passwd", False, True),
        ("/etc/ld.so.preload", False, False),
        ("/var/lib/dpkg/status", False, True),
        ("/var/lib/dpkgx/status", False, False),
    ],
)
def test_caches_and_pure_data(path, cache, data):
    assert is_cache(path) is cache
    assert is_pure_data(path) is data


@pytest.mark.parametrize(
    ("path", "kind", "data"),
    [
        # what a test reads: an output the agent added, a page of the image it changed
        ("/tmp/out.txt", "A", True),
        ("/srv/results/answer", "A", True),
        ("/var/www/html/index.html", "C", True),
        # what a toolchain looks up by name and runs or follows, added
        ("/opt/venv/lib/python3.11/site-packages/zz.pth", "A", False),
        ("/usr/local/lib/python3.11/dist-packages/_pytest/__init__.py", "A", False),
        ("/pytest.ini", "A", False),
        ("/usr/lib/x86_64-linux-gnu/libforge.so.1", "A", False),
        ("/etc/ld.so.preload", "A", False),
        ("/root/.bashrc", "A", False),
        ("/etc/bash.bashrc", "A", False),
        ("/opt/venv/pyvenv.cfg", "A", False),
        # the image's own files, changed: its toolchain's, whatever their name
        ("/opt/venv/bin/activate", "C", False),
        ("/etc/nginx/nginx.conf", "C", False),
        ("/opt/venv/lib/python3.11/site-packages/_pytest/reports.py", "C", False),
        # a package's metadata and the package managers' state, either way
        ("/opt/venv/lib/python3.11/site-packages/x-1.0.dist-info/entry_points.txt", "A", True),
        ("/var/lib/dpkg/status", "C", True),
    ],
)
def test_reads_as_data(path, kind, data):
    assert reads_as_data(path, kind) is data


CHANGES = {
    "/opt/venv/lib/python3.11/site-packages/zz.pth": "A",
    "/opt/venv/pyvenv.cfg": "C",
    "/app/solution.py": "A",
    "/etc/passwd": "C",
    "/usr/local/bin/tool": "A",
    "/srv/declared/helper.sh": "A",
    "/tmp/out.txt": "A",
    "/opt/venv/lib/python3.11/site-packages/_pytest/reports.py": "C",  # a link to /app/forged.py
    "/opt/toolchain": "C",  # a directory replaced by a link
}
REPORTS = "/opt/venv/lib/python3.11/site-packages/_pytest/reports.py"


@pytest.mark.parametrize(
    ("loads", "forged"),
    [
        (
            [Load("/opt/venv/lib/python3.11/site-packages/zz.pth", "opened", 5)],
            ["/opt/venv/lib/python3.11/site-packages/zz.pth"],
        ),
        ([Load("/opt/venv/pyvenv.cfg", "opened", 5)], ["/opt/venv/pyvenv.cfg"]),
        # the work directory and what the task declares are the agent's work the verifier runs
        ([Load("/app/solution.py", "opened", 5), Load("/srv/declared/helper.sh", "executed", 5)], []),
        # pure data opened is no load; executed, anything is
        ([Load("/etc/passwd", "opened", 5)], []),
        ([Load("/etc/passwd", "executed", 5)], ["/etc/passwd"]),
        # unchanged files, and a deleted one, are not the agent's
        ([Load("/usr/bin/python3", "executed", 5), Load("/gone", "opened", 5)], []),
        # a relative path of an unknown directory matches every change it ends
        ([Load("bin/tool", "executed", 5, relative=True)], ["/usr/local/bin/tool"]),
        # each file once, first load wins
        (
            [Load("/usr/local/bin/tool", "executed", 5), Load("/usr/local/bin/tool", "opened", 6)],
            ["/usr/local/bin/tool"],
        ),
        # an output the tests read is data
        ([Load("/tmp/out.txt", "opened", 5, via=walked("/tmp/out.txt"))], []),
        # a link into the work directory: the kernel reached /app, the call named the link
        ([Load("/app/forged.py", "opened", 5, via=walked(REPORTS))], [REPORTS]),
    ],
)
def test_forged_loads(loads, forged):
    changes = {**CHANGES, "/gone": "D"}
    found = forged_loads(loads, changes, agent_paths=("/app", "/srv/declared"), step="the verifier")
    assert [item.path for item in found] == forged
    assert all(item.step == "the verifier" and item.kind == changes[item.path] for item in found)


def test_shebang_and_elf_interpreters_of_real_files(tmp_path):
    script = tmp_path / "s"
    script.write_bytes(b"#!/opt/venv/bin/python -u\nprint(1)\n")
    assert shebang_interpreter(script.read_bytes()) == "/opt/venv/bin/python"
    assert shebang_interpreter(b"#!\n") is None and shebang_interpreter(b"print") is None
    loader = elf_interpreter(Path(sys.executable).resolve().read_bytes()[:4096])
    assert loader is not None and loader.startswith("/lib") and "ld-linux" in loader
    assert kernel_interpreter(Path("/bin/sh").resolve().read_bytes()[:4096]) == loader
    assert elf_interpreter(b"\x7fELF" + b"\0" * 60) is None  # no program headers
    assert elf_interpreter(Path("/etc/passwd").read_bytes()[:4096]) is None


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_the_real_tracer_reports_what_a_command_loads(tmp_path):
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\ncat /etc/hostname > /dev/null\n")
    tool.chmod(0o755)
    argv = traced_argv([str(STRACE)], ["/bin/sh", "-c", f"cd {tmp_path} && ./tool.sh && echo out && echo err >&2"])
    done = subprocess.run(argv, capture_output=True, timeout=30, check=True)
    assert done.stdout.decode().split() == ["out", "err"]  # the command's stderr joins its stdout
    trace = parse_trace(done.stderr)
    loaded = {(load.path, load.how) for load in trace.loads}
    assert trace.complete and (str(tool), "executed") in loaded and ("/etc/hostname", "opened") in loaded


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_the_trace_ends_with_the_command_and_what_it_left_running_ends_unseen_never(tmp_path):
    """The command exits 3 and leaves four processes: one holding its output, one in a session of
    its own, one whose leader thread exited before its other thread (a zombie leader), one that
    would read a file a moment later. The tracer ends at once, with status 3; the four are killed
    while still traced (the late reader never read), and none is left."""
    secret, copy = tmp_path / "secret", tmp_path / "copy"
    secret.write_text("x")
    leader_exits = (
        "import threading, time, ctypes; threading.Thread(target=time.sleep, args=(309,)).start();"
        " ctypes.CDLL(None).pthread_exit(None)"
    )
    script = (
        f"sleep 307 & setsid sh -c 'sleep 308' >/dev/null 2>&1 & {sys.executable} -c '{leader_exits}' &"
        f" (sleep 2; cat {secret} > {copy}) & sleep 0.5; echo out; exit 3"
    )
    done = subprocess.run(traced_argv([str(STRACE)], ["/bin/sh", "-c", script]), capture_output=True, timeout=60)
    assert (done.returncode, done.stdout.decode().split()) == (3, ["out"]), done
    trace = parse_trace(done.stderr)
    assert trace.complete and any(load.path == "/bin/sh" and load.how == "executed" for load in trace.loads)
    subprocess.run(["sleep", "3"], check=True)  # past the late reader's moment
    assert not copy.exists() and str(secret) not in {load.path for load in trace.loads}
    left = subprocess.run(["pgrep", "-f", "sleep 30[78]|args=.309"], capture_output=True, text=True).stdout.split()
    assert left == [], subprocess.run(
        ["ps", "-o", "pid,ppid,stat,args", "-p", ",".join(left)], capture_output=True, text=True
    ).stdout


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_a_command_that_kills_its_tracer_can_open_nothing_more(tmp_path):
    """The filter stays in the kernel: once the tracer is gone every traced call fails, so a forged
    module that ends the tracer cannot go on to write a report unseen (its own load was reported
    before it ran)."""
    report = tmp_path / "report"
    code = (
        "import os, signal; os.kill(int(os.environ['TRACER']), signal.SIGKILL); import time; time.sleep(0.2)\n"
        f"open({str(report)!r}, 'w').write('forged')"
    )
    script = f'TRACER=$PPID exec {sys.executable} -c "$0"'
    argv = [str(STRACE), "-f", "-qq", "--seccomp-bpf", "-e", "trace=openat", "-o", "/dev/null", "--"]
    done = subprocess.run([*argv, "/bin/sh", "-c", script, code], capture_output=True, timeout=30, env={**os.environ})
    assert done.returncode != 0 and not report.exists(), done.stderr


def test_a_directory_on_the_way_counts_when_it_is_a_link_now():
    """The lookup of ``/opt/toolchain/bin/tool`` passed through ``/opt/toolchain``, which the agent
    changed: a link it put there counts (``links``, which the guard reads from the sandbox), a
    directory it only made and removed a file in does not, and an opened file the kernel reached
    where the call named it followed no link at all."""
    changes = {"/opt/toolchain": "C", "/opt/new": "A"}
    executed = Load("/opt/toolchain/bin/tool", "executed", 5, via=walked("/opt/toolchain/bin/tool"))
    assert [f.path for f in forged_loads([executed], changes, agent_paths=(), step="s", links=["/opt/toolchain"])] == [
        "/opt/toolchain"
    ]
    assert forged_loads([executed], changes, agent_paths=(), step="s") == []
    linked = Load("/app/x.py", "opened", 5, via=walked("/opt/new/x.py"))  # a new link on the way
    assert [f.path for f in forged_loads([linked], changes, agent_paths=(), step="s")] == ["/opt/new"]
    direct = Load("/opt/toolchain/x.py", "opened", 5, via=walked("/opt/toolchain/x.py"))
    assert forged_loads([direct], changes, agent_paths=(), step="s", links=["/opt/toolchain"]) == []
