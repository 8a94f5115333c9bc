"""The Docker backend against Podman's Docker-compatible API (``podman system service``, Debian's
podman), rootful and rootless (as a user of its own, where users without root run it): real
trials resolve, fail and are caught tampering as on Docker, and the sandbox's limits and removal
hold; a limit the rootless engine cannot set (no cgroup controller delegated to the user: all of
them on a cgroup v1 host like this one) is a warning of the trial's.

Each mode's service is its own: installed if missing, started on a socket and a storage under a
temporary directory by ``scripts/podman-service.sh`` (the offline base image copied in from the
Docker engine), stopped at the end with every process it left.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from termgym.agents import ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.images import build as images
from termgym.sandboxes.base import Resources, SandboxSpec
from termgym.sandboxes.docker import DockerSandbox, engine, wait_for_removals
from termgym.sandboxes.limits import PIDS_LIMIT
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import KIT_SOURCE, write_task
from tests.redteam.helpers import FORGED_CTRF, REAL_TEST_SH, forged, oracle_attack

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[4]
BUNDLED = REPO / "envs" / "file-ops" / "bulk-rename"


ROOTLESS_USER = "termgym-podman"  # made by the script where missing


@dataclass(frozen=True)
class Podman:
    host: str  # DOCKER_HOST
    storage: Path
    user: str | None = None  # rootless: the user the service runs as
    runtime: Path | None = None  # rootless: its XDG_RUNTIME_DIR

    def cli(self, *args: str) -> str:
        command = ["podman", "--root", str(self.storage / "root"), "--runroot", str(self.storage / "run"), *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", "env", f"XDG_RUNTIME_DIR={self.runtime}", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout

    def containers(self) -> list[str]:
        return self.cli("ps", "--all", "--quiet").split()


def processes_under(path: Path) -> list[int]:
    """The processes whose command line names ``path`` (the service, the conmons it left)."""
    found = subprocess.run(["pgrep", "-f", str(path)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found if int(pid) != os.getpid()]


@pytest.fixture(scope="module", params=["rootful", "rootless"])
def podman(request: pytest.FixtureRequest) -> Iterator[Podman]:
    rootless = request.param == "rootless"
    root = Path(tempfile.mkdtemp(prefix="termgym-test-podman-", dir="/tmp"))
    root.chmod(0o755)  # the rootless service's user reaches its storage and socket under it
    socket, storage = root / "service" / "podman.sock", root / "storage"
    env = {**os.environ, "TERMGYM_PODMAN_SOCKET": str(socket), "TERMGYM_PODMAN_STORAGE": str(storage)}
    if rootless:
        env["TERMGYM_PODMAN_USER"] = ROOTLESS_USER
    pid_file = socket.parent / "podman.pid"
    try:  # a set-up that fails half-way (the service started, the image not copied) is ended too
        started = subprocess.run(
            ["bash", "scripts/podman-service.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
        )
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip().splitlines()[-1] == f"DOCKER_HOST=unix://{socket}"
        if rootless:
            yield Podman(f"unix://{socket}", storage, ROOTLESS_USER, socket.parent / "runtime")
        else:
            yield Podman(f"unix://{socket}", storage)
    finally:
        service = int(pid_file.read_text()) if pid_file.exists() else None
        if service is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(service, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while service is not None and Path(f"/proc/{service}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        # Podman keeps each exec's conmon for five minutes after it ended (exit_command_delay),
        # the container long removed: this service's are ended here; rootless, its pause process
        # too (it holds the user namespace), by the pid it wrote.
        leftovers = processes_under(storage) + (pause_process(socket.parent / "runtime") if rootless else [])
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if str(root) in line]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)
        subprocess.run(["rm", "-rf", str(root)], check=False)
        assert not processes_under(storage), "processes of the service left running"


def pause_process(runtime: Path) -> list[int]:
    """The rootless service's pause process (it holds the user's namespaces), by the pid it wrote."""
    pid_file = runtime / "libpod" / "tmp" / "pause.pid"
    return [int(pid_file.read_text())] if pid_file.exists() else []


def limit_warnings(podman: Podman) -> list[str]:
    """The warnings a trial on ``podman`` carries for the limits it cannot set: none rootful; rootless
    on a cgroup v1 host (no ``cgroup.controllers`` at the root), one for each of the three."""
    if podman.user is None:
        return []
    client = docker.DockerClient(base_url=podman.host)
    try:
        warnings = engine.dialect_of(client).limit_warnings()
    finally:
        client.close()
    if not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        assert [warning.split(" limit")[0] for warning in warnings] == ["memory", "process-count", "CPU", "storage"]
    return warnings


@pytest.fixture
def on_podman(podman: Podman, monkeypatch: pytest.MonkeyPatch) -> Iterator[Podman]:
    """This process's Docker backend pointed at the service for one test: its client made anew
    from ``DOCKER_HOST``, and the process's cache of built images (which names Docker's) empty.
    No container is left in Podman after the test."""
    monkeypatch.setenv("DOCKER_HOST", podman.host)
    monkeypatch.setattr(engine, "_client", None)
    monkeypatch.setattr(images, "_ready", {})
    yield podman
    wait_for_removals(timeout=60)
    if engine._client is not None:
        engine._client.close()
    assert not podman.containers(), "containers left in Podman"


def check(podman: Podman, task: str = str(BUNDLED), *args: str) -> dict:
    """``termgym check`` (a bundled task by default), through the Docker backend at Podman, as a
    user runs it: its record."""
    result = subprocess.run(
        [sys.executable, "-m", "termgym", "check", task, "--backend", "docker", "--json", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "DOCKER_HOST": podman.host},
    )
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout)


def test_the_backend_tells_podman_from_its_version_report(podman: Podman):
    client = docker.DockerClient(base_url=podman.host)
    try:
        dialect = engine.dialect_of(client)
        assert dialect.podman and dialect.version.startswith("4.")
        if podman.user is None:
            assert dialect.unenforced == ()
        elif not Path("/sys/fs/cgroup/cgroup.controllers").exists():  # cgroup v1: rootless sets none
            assert dialect.unenforced == ("memory", "pids", "cpu", "storage")
    finally:
        client.close()


def test_an_oracle_trial_resolves_a_bundled_task(podman: Podman):
    record = check(podman, str(BUNDLED), "--agent", "oracle")
    assert record["resolved"] and record["error"] is None, record
    assert [w for w in record["warnings"] if "limit not enforced" in w] == limit_warnings(podman), record["warnings"]
    assert record["passed"] == record["total"] == 5
    # Podman's own files (its init, /etc/hosts, /etc/mtab, /run/.containerenv) are not the agent's
    assert record["system_changes"] == ["/solution/solve.sh"], record["system_changes"]
    assert not podman.containers()


def test_the_null_agent_fails_a_bundled_task(podman: Podman):
    record = check(podman, str(BUNDLED), "--agent", "null")
    assert not record["resolved"], record
    assert record["error"] is None and record["total"] == 5 and record["passed"] < 5, record
    assert record["system_changes"] == [], record["system_changes"]
    assert not podman.containers()


# Tells the time, then leaves a writer that puts an all-pass report in place for two seconds or more,
# long past the kit's final report (one that never stopped would hold the traced verifier until its
# timeout: strace waits for every process it follows).
FORGE = (
    'printf \'#!/bin/sh\\n/usr/bin/date "$@"\\n'
    "(n=0; while [ $n -lt 200 ]; do echo %s > /logs/verifier/ctrf.json; sleep 0.01; n=$((n+1)); done) >/dev/null 2>&1 &\\n'"
    f" '{FORGED_CTRF}'"
)
ATTACKS = {
    # a shim earlier on the verifier's PATH for the `date` the assertion kit runs under dash (its
    # stop time: the one program it still runs under termgym)
    "path-shim": (f"{FORGE} > /usr/local/bin/date && chmod +x /usr/local/bin/date", "/usr/local/bin/date"),
    # the same shim in the work directory, a directory of the image's PATH replaced by a link to it
    # (Podman's archive of a link is what it leads to: the link is read from its stat)
    "directory-link": (
        f"mkdir -p /app/bin && {FORGE} > /app/bin/date && chmod +x /app/bin/date"
        " && rm -rf /usr/local/bin && ln -s /app/bin /usr/local/bin",
        "/usr/local/bin",
    ),
}


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_a_tampering_agent_is_caught(tmp_path, on_podman: Podman, name: str):
    command, planted = ATTACKS[name]
    task = load_task(write_task(tmp_path))
    record = await run_trial(task, ScriptedAgent((command,)), EnvOptions(backend="docker"))
    assert record.error is not None and record.error["kind"] == "tampered", record
    assert planted in record.error["message"] and "by the verifier" in record.error["message"], record.error
    assert not forged(record) and planted in (record.system_changes or []), record


async def test_the_images_bash_env_does_not_reach_the_verifier(tmp_path, on_podman: Podman):
    """Podman refuses an exec's unset variable: the image's ``BASH_ENV`` (the agent's file, which
    traps the verifier's exit to forge the report) is set empty for the verifier instead."""
    forged_file = "/root/forged.json"
    hook = f"printf '%s\\n' 'trap \"cat {forged_file} > /logs/verifier/ctrf.json\" EXIT' > /root/.bash_env"
    record = await oracle_attack(
        tmp_path,
        "docker",
        f"#!/bin/sh\nprintf '%s' '{FORGED_CTRF}' > {forged_file}\n{hook}\n",
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nENV BASH_ENV=/root/.bash_env\n",
        test_sh=REAL_TEST_SH.replace("#!/bin/sh", "#!/bin/bash", 1),
    )
    assert not forged(record), record
    assert record.total == 2, record


async def test_the_sandboxs_limits_hold_and_it_is_removed(on_podman: Podman):
    spec = SandboxSpec(
        name="podman-limits",
        context_dir=None,
        dockerfile=None,
        image=images.BASE_IMAGE,
        resources=Resources(cpus=1, memory_mb=128, storage_mb=16),
        env={"FROM_SPEC": "1"},
    )
    sandbox = DockerSandbox(spec)
    await sandbox.start()
    try:
        container = sandbox._container
        assert container is not None and sandbox._keeper is not None  # the keeper, in Podman's process list
        unenforced = limit_warnings(on_podman)
        assert [w for w in sandbox.warnings if "limit not enforced" in w] == unenforced, sandbox.warnings
        host = engine.docker_client().api.inspect_container(container)["HostConfig"]
        if not unenforced:
            assert (host["PidsLimit"], host["Memory"], host["NanoCpus"]) == (PIDS_LIMIT, 128 << 20, 10**9)
        big = await sandbox.exec(
            ["/bin/sh", "-c", "head -c 40000000 /dev/zero > /tmp/big; wc -c < /tmp/big"], timeout=30
        )
        # the shell's message (stderr) and wc's count (stdout) come through Podman's attach stream in
        # either order
        sizes = [int(word) for word in big.text.split() if word.isdigit()]
        if unenforced:  # rootless: as the trial's warning says, the container has no per-file limit
            assert sizes == [40000000] and "storage limit not enforced" in unenforced[-1], big.text
        else:
            assert "File size limit exceeded" in big.text and sizes == [16 << 20], big.text
        if not unenforced:  # the process-count limit, where the engine sets it
            spawn = f"for i in $(seq {PIDS_LIMIT + 50}); do /bin/sleep 30 >/dev/null 2>&1 & done 2>&1 | tail -1"
            forks = await sandbox.exec(["/bin/sh", "-c", spawn], timeout=60)
            assert "fork" in forks.text, forks.text
        await sandbox.kill_agent_processes()  # a restart: every process ended, a new keeper
        await sandbox.check_alive()
        left = await sandbox.exec(["/bin/sh", "-c", "ls /proc | grep -c '^[0-9]'"], timeout=30)
        assert int(left.text.strip()) < 10, left.text  # the init, the keeper, this command
        # exactly the environment asked for: the spec's variable set empty where Podman cannot unset it
        clean = await sandbox.exec(["/bin/sh", "-c", 'echo "[${FROM_SPEC-unset}]"'], timeout=30, env={"PATH": "/bin"})
        assert clean.text.strip() in ("[unset]", "[]"), clean.text
        # a path is read literally (Podman's archive API would match it as a glob) and a link as the link
        made = "echo literal > '/tmp/[x]' && echo other > /tmp/x && ln -s /tmp/x /tmp/link"
        assert (await sandbox.exec(["/bin/sh", "-c", made], timeout=30)).exit_code == 0
        archive = await sandbox.download_tar(["/tmp/[x]", "/tmp/link"], limit=1 << 20)
        with tarfile.open(fileobj=io.BytesIO(archive)) as members:
            literal, link = members.getmember("tmp/[x]"), members.getmember("tmp/link")
            assert members.extractfile(literal).read() == b"literal\n"  # type: ignore[union-attr]
            assert link.issym() and link.linkname == "/tmp/x"
        changes = await sandbox.agent_changes()
        assert changes == {"/tmp/big": "A", "/tmp/[x]": "A", "/tmp/x": "A", "/tmp/link": "A"}, changes
    finally:
        await sandbox.stop()
    wait_for_removals(timeout=60)
    assert not on_podman.containers()


def test_a_build_step_gets_no_network(tmp_path, podman: Podman):
    """Podman's build API runs RUN steps in the host's network namespace unless told otherwise
    (``engine.podman_build_params``): a step that lists its network interfaces sees only ``lo``."""
    dockerfile = textwrap.dedent(f"""\
        FROM {images.BASE_IMAGE}
        WORKDIR /app
        RUN tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' ' > /etc/interfaces
        """)
    test_sh = f"#!/bin/sh\n{KIT_SOURCE}\ntg_check_sh 'the build saw only lo' 'test \"$(cat /etc/interfaces)\" = \"lo \"'\ntg_finish\n"
    record = check(podman, str(write_task(tmp_path, dockerfile=dockerfile, test_sh=test_sh)))
    assert record["error"] is None and record["total"] == 1, record
    assert record["resolved"], record["assertions"]
