"""Red team, the embedded backend over a task image: the whole root is writable now, so an agent
reaches for the image, the cache, the next sandbox and the programs every later command enters by.

The image is built once on the Docker engine (the offline base plus a marker) and read from there
by the embedded backend's image store (skopeo and umoci, no daemon in the trial itself).
"""

from __future__ import annotations

import io
import tarfile
import textwrap
from pathlib import Path

import pytest

from termgym.agents import NullAgent, OracleAgent
from termgym.episode.options import EnvOptions
from termgym.images.build import BASE_IMAGE
from termgym.sandboxes.local.images import ImageStore
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import KIT_SOURCE, require_docker, write_task
from tests.redteam.helpers import FORGED_CTRF, REAL_TEST_SH, forged

pytestmark = [pytest.mark.redteam, pytest.mark.docker, pytest.mark.slow]
IMAGE = "termgym-test/image-root:1"


@pytest.fixture(scope="module")
def image() -> str:
    """``IMAGE`` on the engine: the offline base with ``/etc/image-marker`` and ``/usr/share/doc``."""
    return build(IMAGE, f"FROM {BASE_IMAGE}\nRUN echo image > /etc/image-marker && mkdir -p /usr/share/doc/kept\n")


ENTRYPOINT_IMAGE = "termgym-test/image-entrypoint:1"
ENTRY = "/usr/local/bin/entry.sh"


def build(tag: str, dockerfile: str) -> str:
    """``dockerfile`` (no context) built on the engine as ``tag``."""
    require_docker()
    from termgym.sandboxes.docker import docker_client

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile.encode())
        archive.addfile(info, io.BytesIO(dockerfile.encode()))
    client = docker_client()
    for chunk in client.api.build(
        fileobj=io.BytesIO(buffer.getvalue()), custom_context=True, tag=tag, network_mode="none", decode=True
    ):
        assert "error" not in chunk, chunk
    return tag


@pytest.fixture(scope="module")
def entrypoint_image() -> str:
    """The offline base whose entrypoint notes each start in /run/entry-starts, then runs its command."""
    script = '#!/bin/sh\\necho start >> /run/entry-starts\\nexec \\"$@\\"\\n'
    return build(
        ENTRYPOINT_IMAGE,
        f'FROM {BASE_IMAGE}\nRUN printf "{script}" > {ENTRY} && chmod +x {ENTRY}\nENTRYPOINT ["{ENTRY}"]\n',
    )


def options() -> EnvOptions:
    return EnvOptions(backend="local", run_id="image-root")


def image_task(root: Path, name: str, solve_sh: str, checks: str, environment_toml: str = "") -> Path:
    test_sh = f"#!/bin/sh\n{KIT_SOURCE}\n{textwrap.dedent(checks)}\ntg_finish\n"
    return write_task(
        root,
        name,
        dockerfile=f"FROM {IMAGE}\nWORKDIR /app\n",
        solve_sh=solve_sh,
        test_sh=test_sh,
        environment_toml=environment_toml,
    )


async def test_an_agent_writes_anywhere_and_neither_the_image_nor_the_next_sandbox_sees_it(tmp_path, image, no_leaks):
    solve = """\
    #!/bin/sh
    set -e
    echo done > /app/result.txt
    printf '#!/bin/sh\\necho helper\\n' > /usr/local/bin/helper && chmod +x /usr/local/bin/helper
    echo agent > /etc/agent.conf && echo changed > /etc/image-marker && rm -rf /usr/share/doc/kept
    """
    checks = """\
    tg_check "the result is there" test -f /app/result.txt
    tg_check_sh "on the image" 'test -e /etc/image-marker'
    """
    task = load_task(image_task(tmp_path, "writes-anywhere", textwrap.dedent(solve), checks))
    record = await run_trial(task, OracleAgent(), options())
    assert record.error is None and record.resolved, record  # what the verifier never loads fails nothing
    changed = record.system_changes or []
    assert "/usr/local/bin/helper" in changed and "/etc/agent.conf" in changed, changed
    fresh_checks = """\
    tg_check_sh "no helper" 'test ! -e /usr/local/bin/helper && test ! -e /etc/agent.conf'
    tg_check_sh "the image as it was" 'grep -qx image /etc/image-marker && test -d /usr/share/doc/kept'
    """
    after = await run_trial(
        load_task(image_task(tmp_path, "next-sandbox", "#!/bin/sh\n", fresh_checks)), NullAgent(), options()
    )
    assert after.error is None and after.resolved, after  # the next sandbox starts from the untouched image
    unpacked = ImageStore.from_environment()
    stored = await unpacked.resolve(IMAGE, policy="missing", what="t", timeout=60)
    assert (stored.rootfs / "etc/image-marker").read_text() == "image\n"
    assert not (stored.rootfs / "usr/local/bin/helper").exists() and (stored.rootfs / "usr/share/doc/kept").is_dir()


# The programs a command enters the sandbox by, as an agent would shim them: each writes the result
# the verifier checks, then runs the real one. Were any of them run for the verifier, it would pass.
SHIMS = ("/usr/bin/env", "/usr/bin/setpriv", "/usr/bin/timeout", "/bin/sleep", "/usr/bin/nsenter")


async def test_the_programs_every_command_enters_by_are_never_the_agents(tmp_path, image, no_leaks):
    lines = ["#!/bin/sh", "set -e"]
    for path in SHIMS:
        lines += [
            f"if [ -e {path} ]; then mv {path} {path}.real; fi",
            f"printf '#!/bin/sh\\necho done > /app/result.txt\\nexec {path}.real \"$@\"\\n' > {path}",
            f"chmod +x {path}",
        ]
    checks = 'tg_check "the result is there" test -f /app/result.txt\n'
    task = load_task(image_task(tmp_path, "shims", "\n".join(lines) + "\n", checks))
    record = await run_trial(task, OracleAgent(), options())
    assert not record.resolved and record.reward == 0, record  # no shim wrote the result
    assert record.error is None or record.error["kind"] == "tampered", record


async def test_a_preload_the_kits_loader_would_read_is_counted_as_loaded(tmp_path, image, no_leaks):
    solve = "#!/bin/sh\necho done > /app/result.txt\necho /tmp/nothing.so > /etc/ld.so.preload\n"
    checks = 'tg_check "the result is there" test -f /app/result.txt\n'
    record = await run_trial(load_task(image_task(tmp_path, "preload", solve, checks)), OracleAgent(), options())
    assert record.error is not None and record.error["kind"] == "tampered", record
    assert "/etc/ld.so.preload" in record.error["message"]


async def test_the_storage_limit_holds_anywhere_in_the_root(tmp_path, image, no_leaks):
    """As over the host's system: the file stops at the task's storage, and a verifier left no
    room is the agent's doing."""
    solve = "#!/bin/sh\nhead -c 200000000 /dev/zero > /usr/big\nwc -c < /usr/big > /app/size\n"
    checks = 'tg_check "the result is there" test -f /app/result.txt\n'
    task = load_task(image_task(tmp_path, "storage", solve, checks, environment_toml="storage_mb = 32"))
    record = await run_trial(task, OracleAgent(), options())
    assert record.error is not None and record.error["kind"] == "broken_by_agent", record
    assert "the sandbox reached its storage limit (32 MB)" in record.warnings


async def test_the_images_entrypoint_runs_before_the_agent_and_again_before_the_verifier(
    tmp_path, entrypoint_image, no_leaks
):
    """As on Docker: the agent's first command finds the entrypoint ran once; the verifier, after
    the kill step's restart, twice."""
    solve = "#!/bin/sh\nwc -l < /run/entry-starts > /app/seen && echo done > /app/result.txt\n"
    checks = """\
    tg_check "the agent saw one start" grep -qx 1 /app/seen
    tg_check_sh "the verifier sees two" '[ "$(wc -l < /run/entry-starts)" -eq 2 ]'
    """
    task_dir = write_task(
        tmp_path,
        "entrypoint",
        dockerfile=f"FROM {entrypoint_image}\nWORKDIR /app\n",
        solve_sh=solve,
        test_sh=f"#!/bin/sh\n{KIT_SOURCE}\n{textwrap.dedent(checks)}\ntg_finish\n",
    )
    record = await run_trial(load_task(task_dir), OracleAgent(), options())
    assert record.error is None and record.resolved, (record.error, record.assertions)


async def test_an_entrypoint_the_agent_rewrote_to_forge_the_report_is_caught(tmp_path, entrypoint_image, no_leaks):
    """The kill step's restart runs the entrypoint before the verifier (and its listing of the
    agent's changes): the agent's version would plant a passing report. The tamper check counts the
    entrypoint as loaded, never traced."""
    forge = f"mkdir -p /logs/verifier && printf '%s' '{FORGED_CTRF}' > /logs/verifier/ctrf.json"
    solve = f"#!/bin/sh\nprintf '#!/bin/sh\\n{forge}\\nexec \"$@\"\\n' > {ENTRY}\n"
    task_dir = write_task(
        tmp_path,
        "entrypoint-forge",
        dockerfile=f"FROM {entrypoint_image}\nWORKDIR /app\n",
        solve_sh=solve,
        test_sh=REAL_TEST_SH,
    )
    record = await run_trial(load_task(task_dir), OracleAgent(), options())
    assert not forged(record), record
    assert record.error is not None and record.error["kind"] == "tampered" and ENTRY in record.error["message"]
