"""Red team, round four: the task's own toolchain, and honest work that must not be failed.

The verifier is real pytest in a venv the image installed outside the work directory, run by
absolute path or through ``bin/activate`` (``tests.redteam.toolchain``). The agent is root and owns
that venv: each attack below forged all three assertions on both backends, with defaults and no
warning, before the verifier was traced (pytest's own log read "3 passed"). Now each is a trial
scored 0, ``tampered``, whose record names the planted file and how the verifier reached it.

The other direction holds as firmly: an agent whose Python writes byte-code where the verifier's
Python later looks, that pip-installs into the verifier's own venv a package the verifier never
imports, that writes a helper to ``/usr/local/bin`` or ``dpkg -i``s a tool it uses, is resolved.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.redteam.helpers import attack
from tests.redteam.toolchain import python_image, write_toolchain_task

# Both backends run PYTHON_IMAGE, built on the engine: the embedded one copies it from there.
pytestmark = [pytest.mark.redteam, pytest.mark.slow, pytest.mark.docker]

FORGED_JUNIT = (
    '<testsuite tests="3">'
    + "".join(f'<testcase classname="test_outputs" name="test_{i}"/>' for i in range(3))
    + "</testsuite>"
)
FORGE_AT_EXIT = (
    f"import atexit, os; atexit.register(lambda: (open('/logs/verifier/junit.xml', 'w').write('{FORGED_JUNIT}'),"
    " os._exit(0)))"
)
PLUGIN = textwrap.dedent("""\
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        report.outcome, report.longrepr = "passed", None
    """)
REPORTS_PATCH = textwrap.dedent("""\

    _made = TestReport.from_item_and_call.__func__
    def _forged(cls, item, call):
        report = _made(cls, item, call)
        report.outcome, report.longrepr = "passed", None
        return report
    TestReport.from_item_and_call = classmethod(_forged)
    """)


def _write(path: str, text: str) -> str:
    """A shell command that writes ``text`` to ``path`` (its directory made)."""
    quoted = text.replace("'", "'\\''")
    return f"mkdir -p \"$(dirname {path})\" && printf '%s' '{quoted}' > {path}"


def attacks(venv: str) -> dict[str, tuple[str, str]]:
    """Each attack's commands and the file the record must name."""
    site = f"{venv}/lib/python3.11/site-packages"
    dist = f"{site}/forge_plugin-1.0.dist-info"
    return {
        "pth-file": (_write(f"{site}/zz_forge.pth", FORGE_AT_EXIT + "\n"), f"{site}/zz_forge.pth"),
        "pytest11-entry-point": (
            " && ".join(
                [
                    _write(f"{site}/forge_plugin.py", PLUGIN),
                    _write(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: forge-plugin\nVersion: 1.0\n"),
                    _write(f"{dist}/entry_points.txt", "[pytest11]\nforge = forge_plugin\n"),
                ]
            ),
            f"{site}/forge_plugin.py",
        ),
        "edited-pytest-source": (
            f"printf '%s' '{REPORTS_PATCH}' >> {site}/_pytest/reports.py",
            f"{site}/_pytest/reports.py",
        ),
        # the forged module in the work directory, which the verifier may load, and a link to it
        # in the toolchain: the kernel reaches /app, the call names the link
        "link-into-the-work-directory": (
            f"cp {site}/_pytest/reports.py /app/reports.py && printf '%s' '{REPORTS_PATCH}' >> /app/reports.py"
            f" && ln -sf /app/reports.py {site}/_pytest/reports.py",
            f"{site}/_pytest/reports.py",
        ),
        # the whole package moved into the work directory, the toolchain's directory a link to it
        "directory-link-into-the-work-directory": (
            f"cp -r {site}/_pytest /app/_pytest && printf '%s' '{REPORTS_PATCH}' >> /app/_pytest/reports.py"
            f" && rm -rf {site}/_pytest && ln -s /app/_pytest {site}/_pytest",
            f"{site}/_pytest",
        ),
        "pyvenv-home": (
            " && ".join(
                [
                    "mkdir -p /tmp/fake/bin /tmp/fake/lib",
                    "cp -r /usr/lib/python3.11 /tmp/fake/lib/python3.11",
                    "ln -s /usr/bin/python3.11 /tmp/fake/bin/python3.11",
                    "ln -s python3.11 /tmp/fake/bin/python3",
                    "rm -f /tmp/fake/lib/python3.11/sitecustomize.py",
                    _write("/tmp/fake/lib/python3.11/sitecustomize.py", FORGE_AT_EXIT + "\n"),
                    f"sed -i 's|^home = .*|home = /tmp/fake/bin|' {venv}/pyvenv.cfg",
                ]
            ),
            f"{venv}/pyvenv.cfg",
        ),
    }


TOOLCHAINS = {"opt-venv": ("/opt/venv", False), "root-local-activated": ("/root/.local/venv", True)}
# Every attack on the venv run by absolute path; on the one sourced through bin/activate from the
# agent's home, the two that reach the interpreter before pytest runs (where it lies is no matter
# to the check: it lists no paths).
CASES = [("opt-venv", name) for name in attacks("/opt/venv")] + [
    ("root-local-activated", name) for name in ("pth-file", "pyvenv-home")
]


@pytest.fixture(scope="module")
def docker_python() -> str:
    return python_image()


@pytest.mark.parametrize("backend", ["local", "docker"])
@pytest.mark.parametrize(("toolchain", "name"), CASES, ids=[f"{name}-{where}" for where, name in CASES])
async def test_a_plant_in_the_tasks_own_toolchain_scores_zero_and_is_named(
    tmp_path, request, backend, toolchain, name, no_leaks
):
    request.getfixturevalue("docker_python")
    venv, activate = TOOLCHAINS[toolchain]
    task = write_toolchain_task(tmp_path, venv=venv, activate=activate)
    command, planted = attacks(venv)[name]
    record = await attack(task, backend, command)  # the agent never writes /app/result.txt
    assert record.reward == 0.0 and not record.resolved and record.passed == 0, record
    assert record.error is not None and record.error["kind"] == "tampered", record.error
    assert planted in record.error["message"] and "by the verifier" in record.error["message"], record.error


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_the_same_task_done_honestly_is_resolved(tmp_path, request, backend, no_leaks):
    request.getfixturevalue("docker_python")
    task = write_toolchain_task(tmp_path)
    record = await attack(task, backend, "echo done > /app/result.txt")
    assert record.resolved and record.passed == 3 and record.error is None, record


WHEEL_MAKER = textwrap.dedent("""\
    import sys, zipfile
    name, module, script = sys.argv[1:4]
    info = f"{module}-1.0.dist-info"
    with zipfile.ZipFile(f"/tmp/{module}-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{module}/__init__.py", "def main():\\n    print(1)\\n")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\\nName: {name}\\nVersion: 1.0\\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        if script:
            wheel.writestr(f"{info}/entry_points.txt", f"[console_scripts]\\n{script} = {module}:main\\n")
        wheel.writestr(f"{info}/RECORD", "")
    """)
PIP = "/opt/venv/bin/python -m pip install -q --no-index --no-compile"
DONE = "echo done > /app/result.txt"


def _wheel(name: str, module: str, script: str = "") -> str:
    """Commands that make a real wheel of a one-module package at /tmp/<module>-1.0-py3-none-any.whl."""
    return f"{_write('/tmp/make_wheel.py', WHEEL_MAKER)} && python3 /tmp/make_wheel.py {name} {module} '{script}'"


HONEST = {
    # Python that imports modules without cached byte-code writes it where the verifier's Python
    # looks next (the standard library's __pycache__ on Docker; the venv's on both)
    "byte-code": (
        "python3 -c 'import json, csv, fractions' && /opt/venv/bin/python -c 'import pluggy, iniconfig'",
        ("/opt/venv/lib/python3.11/site-packages/pluggy/__pycache__",),
    ),
    # a package with a console script, installed into the verifier's own venv (byte-code and all),
    # never imported by the verifier: pytest reads its metadata, which runs nothing
    "pip-install-into-the-verifiers-venv": (
        f"{_wheel('honest-tool', 'honest_tool', 'honest-tool')}"
        " && /opt/venv/bin/python -m pip install -q --no-index /tmp/honest_tool-1.0-py3-none-any.whl"
        " && /opt/venv/bin/honest-tool",
        ("/opt/venv/bin/honest-tool", "/opt/venv/lib/python3.11/site-packages/honest_tool/__init__.py"),
    ),
}
HONEST_ROOT = {  # writes outside the venv, anywhere in the image's root
    "helper-in-usr-local-bin": (
        "printf '#!/bin/sh\\necho done\\n' > /usr/local/bin/say-done && chmod +x /usr/local/bin/say-done"
        " && say-done > /app/result.txt",
        ("/usr/local/bin/say-done",),
    ),
    "dpkg-installed-tool-the-solution-uses": (
        "mkdir -p /tmp/deb/DEBIAN /tmp/deb/usr/bin"
        " && printf 'Package: say-done\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@t>\\n"
        "Description: says done\\n' > /tmp/deb/DEBIAN/control"
        " && printf '#!/bin/sh\\necho done\\n' > /tmp/deb/usr/bin/say-done && chmod 0755 /tmp/deb/usr/bin/say-done"
        " && dpkg-deb -b /tmp/deb /tmp/say-done.deb >/dev/null && dpkg -i /tmp/say-done.deb >/dev/null"
        " && say-done > /app/result.txt",
        ("/usr/bin/say-done", "/var/lib/dpkg/status"),
    ),
    "pip-install-under-usr-local": (
        f"{_wheel('helper-lib', 'helper_lib')}"
        f" && {PIP.replace('--no-compile', '')} --prefix /usr/local /tmp/helper_lib-1.0-py3-none-any.whl",
        ("/usr/local/lib/python3.11/site-packages/helper_lib/__init__.py",),
    ),
}


@pytest.mark.parametrize(
    ("backend", "name"),
    [
        *(("local", name) for name in [*HONEST, *HONEST_ROOT]),
        *(("docker", name) for name in [*HONEST, *HONEST_ROOT]),
    ],
)
async def test_honest_work_that_the_verifier_never_loads_is_resolved(tmp_path, request, backend, name, no_leaks):
    request.getfixturevalue("docker_python")
    task = write_toolchain_task(tmp_path)
    command, changed = {**HONEST, **HONEST_ROOT}[name]
    record = await attack(task, backend, command, "grep -qx done /app/result.txt || echo done > /app/result.txt")
    assert record.resolved and record.error is None, record
    assert record.system_changes is not None
    assert all(any(path.startswith(c) for path in record.system_changes) for c in changed), record.system_changes


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_a_shim_that_shadows_the_verifiers_python_still_fails(tmp_path, docker_python, backend, no_leaks):
    """Honest installs pass; a program found on the verifier's own search path in place of its
    interpreter does not: the activated venv's ``python`` resolved through a shim the agent put
    first on that path."""
    task = write_toolchain_task(tmp_path, activate=True)
    shim = "printf '#!/bin/sh\\nexec /opt/venv/bin/python3 \"$@\"\\n' > /opt/venv/bin/python && chmod +x /opt/venv/bin/python"
    record = await attack(task, backend, f"rm /opt/venv/bin/python && {shim}", "echo done > /app/result.txt")
    assert record.error is not None and record.error["kind"] == "tampered", record
    assert "/opt/venv/bin/python (" in record.error["message"], record.error


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_a_pth_plant_cannot_forge_inspects_scorer(tmp_path, request, backend, no_leaks):
    """The same plant through inspect-ai's sandbox provider: ``termgym_scorer`` reads the verdict of
    the same traced verification."""
    pytest.importorskip("inspect_ai", reason="the integrations extra")
    from termgym.integrations.inspect import TermgymSandboxConfig, TermgymSandboxEnvironment

    request.getfixturevalue("docker_python")
    config = TermgymSandboxConfig(task=str(write_toolchain_task(tmp_path)), backend=backend)
    environments = await TermgymSandboxEnvironment.sample_init("redteam", config, {})
    box = environments["default"].as_type(TermgymSandboxEnvironment)
    try:
        planted = await box.exec(["sh", "-c", attacks("/opt/venv")["pth-file"][0]])
        assert planted.success, planted.stderr
        verdict = await box.verify()
    finally:
        await TermgymSandboxEnvironment.sample_cleanup("redteam", config, environments, False)
    assert (verdict["resolved"], verdict["passed"], verdict["reward"]) == (0, 0, 0.0), verdict
    assert verdict["error"] is not None and verdict["error"]["kind"] == "tampered", verdict


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_an_entry_point_plant_cannot_forge_the_skyrl_reward(tmp_path, request, backend, no_leaks):
    """The same plant through the SkyRL-gym environment, whose final step's reward is the
    traced verification's."""
    skyrl_gym = pytest.importorskip("skyrl_gym", reason="the integrations extra")
    from termgym.integrations import skyrl  # noqa: F401  (registers the id)

    request.getfixturevalue("docker_python")
    task = write_toolchain_task(tmp_path)
    env = skyrl_gym.make("termgym", env_config={"max_turns": 4}, extras={"task": str(task), "backend": backend})
    try:
        env.init([])
        env.step(f"```bash\n{attacks('/opt/venv')['pytest11-entry-point'][0]}\n```\n")
        final = env.step("```bash\n:submit\n```\n")
    finally:
        env.close()
    assert final["done"] and final["reward"] == 0.0, final
    assert final["metadata"]["error"]["kind"] == "tampered", final["metadata"]


def test_on_a_ray_cluster_a_plant_is_tampered_and_honest_work_resolved(tmp_path, ray_cluster, capsys, no_leaks):
    """The same check on a node of a real Ray cluster (the embedded backend there): the node's
    actor forwards the traced exec and the list of changes, so the verdict is the same as here."""
    pytest.importorskip("ray", reason="the ray extra")
    import json

    from termgym.cli import main as termgym_main

    planted = attacks("/opt/venv")["pth-file"][0]
    forged = write_toolchain_task(tmp_path, "forged", solve_sh=f"#!/bin/sh\n{planted}\n")
    honest = write_toolchain_task(
        tmp_path, "honest", solve_sh=f"#!/bin/sh\n{HONEST['pip-install-into-the-verifiers-venv'][0]}\n{DONE}\n"
    )
    verdicts = {}
    for name, task in (("forged", forged), ("honest", honest)):
        argv = ["check", str(task), "--agent", "oracle", "--cluster", ray_cluster.address, "--json"]
        termgym_main(argv)
        verdicts[name] = json.loads(capsys.readouterr().out)
    assert verdicts["forged"]["error"]["kind"] == "tampered" and verdicts["forged"]["reward"] == 0.0
    assert "zz_forge.pth" in verdicts["forged"]["error"]["message"] and verdicts["forged"]["node"].startswith("ray-")
    assert verdicts["honest"]["resolved"] and verdicts["honest"]["error"] is None, verdicts["honest"]


@pytest.mark.parametrize("name", ["directory-link-into-the-work-directory", "pth-file"])
async def test_without_the_prepared_environment_cache_the_embedded_check_is_the_same(
    tmp_path, monkeypatch, name, docker_python, no_leaks
):
    """``TERMGYM_ENV_CACHE=0``: the sandbox is prepared in its own upper layer over the image, and
    its changes are that layer less what the preparation left there (a directory replaced by a
    link is listed with what is gone under it); the verdicts do not change."""
    monkeypatch.setenv("TERMGYM_ENV_CACHE", "0")
    task = write_toolchain_task(tmp_path)
    command, planted = attacks("/opt/venv")[name]
    record = await attack(task, "local", command)
    assert record.error is not None and record.error["kind"] == "tampered" and planted in record.error["message"]
    honest = await attack(task, "local", HONEST["pip-install-into-the-verifiers-venv"][0], DONE)
    assert honest.resolved and honest.error is None, honest


# A forged byte-code cache of a module the verifier's pytest imports (fnmatch, from the standard
# library), its header carrying the pristine source's time and size, so that Python loads it in
# place of that source; its code writes an all-pass report when the verifier's Python exits.
FORGED_PYC = textwrap.dedent(f"""\
    import importlib.util, marshal, os, struct
    source = "/usr/lib/python3.11/fnmatch.py"
    info = os.stat(source)
    code = open(source).read() + "\\n" + {FORGE_AT_EXIT!r} + "\\n"
    compiled = compile(code, source, "exec")
    header = importlib.util.MAGIC_NUMBER + struct.pack("<III", 0, int(info.st_mtime) & 0xFFFFFFFF, info.st_size & 0xFFFFFFFF)
    os.makedirs("/usr/lib/python3.11/__pycache__", exist_ok=True)
    with open("/usr/lib/python3.11/__pycache__/fnmatch.cpython-311.pyc", "wb") as out:
        out.write(header + marshal.dumps(compiled))
    """)


@pytest.mark.docker
async def test_a_forged_byte_code_cache_whose_header_matches_its_source_is_dropped_not_loaded(
    tmp_path, docker_python, no_leaks
):
    """The caches are removed before the verifier runs, not merely let through: had this one been
    let through, Python would have run it as fnmatch.py and forged the report."""
    task = write_toolchain_task(tmp_path)
    plant = f"{_write('/tmp/forge_pyc.py', FORGED_PYC)} && python3 /tmp/forge_pyc.py"
    proof = "python3 -c 'import fnmatch' && test -f /logs/verifier/junit.xml"  # the forgery runs when loaded
    record = await attack(task, "docker", f"mkdir -p /logs/verifier && {plant} && {proof} && rm -r /logs/verifier")
    assert "/usr/lib/python3.11/__pycache__/fnmatch.cpython-311.pyc" in (record.system_changes or []), record
    assert record.reward == 0.0 and record.passed == 0 and record.total == 3 and record.error is None, record
    honest = await attack(task, "docker", plant, DONE)
    assert honest.resolved and honest.error is None, honest
