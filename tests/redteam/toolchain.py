"""Tasks whose verifier runs the task's own toolchain, as public Terminal-Bench images do: a venv
outside the work directory with real pytest in it (copied from this project's ``.venv``), which
``tests/test.sh`` runs by absolute path or after sourcing ``bin/activate``.

The image is ``PYTHON_IMAGE``: the offline base image with this machine's Debian ``python3.11``
(binary, standard library, the two libraries the base lacks) put in, built once on the Docker
engine (``python_image``); the embedded backend copies it from there and runs the same task over
it, so one task directory serves both backends.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import sys
import tarfile
import textwrap
from pathlib import Path

from termgym.images import build as images

SITE_PACKAGES = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
PYTEST_DISTS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments", "pip")  # each with its dist-info
PYTEST_MODULES = ("_pytest", "py.py")
STDLIB = Path("/usr/lib/python3.11")
STDLIB_SKIPPED = {"test", "__pycache__", "idlelib", "tkinter", "lib2to3", "ensurepip", "turtledemo", "pydoc_data"}
HOST_LIBRARIES = ("/lib/x86_64-linux-gnu/libexpat.so.1",)
_TAG_INPUTS = (Path("/usr/bin/python3.11"), *(SITE_PACKAGES / name for name in ("pytest", "pluggy")))
PYTHON_IMAGE = (
    "termgym/redteam-python:"
    + hashlib.sha256(
        "\0".join(f"{p}:{p.stat().st_mtime_ns if p.exists() else 0}" for p in _TAG_INPUTS).encode()
    ).hexdigest()[:12]
)

TEST_SH = """#!/bin/sh
{activate}
{runner} -m pytest /tests/test_outputs.py -rA -p no:cacheprovider --junitxml=/logs/verifier/junit.xml
"""
TEST_PY = """
from pathlib import Path

def test_result_exists():
    assert Path("/app/result.txt").exists()

def test_result_says_done():
    assert Path("/app/result.txt").read_text().strip() == "done"

def test_no_extra_lines():
    assert len(Path("/app/result.txt").read_text().splitlines()) == 1
"""


def python_image() -> str:
    """``PYTHON_IMAGE``, built if the engine does not have it (about 10 s)."""
    import docker
    import docker.errors

    client = docker.from_env()
    try:
        client.images.get(PYTHON_IMAGE)
    except docker.errors.ImageNotFound:
        _build(client)
    finally:
        client.close()
    return PYTHON_IMAGE


def _build(client) -> None:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as archive:
        dockerfile = textwrap.dedent(f"""\
            FROM {images.BASE_IMAGE}
            COPY python/ /
            """).encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        archive.addfile(info, io.BytesIO(dockerfile))
        archive.add("/usr/bin/python3.11", "python/usr/bin/python3.11")
        link = tarfile.TarInfo("python/usr/bin/python3")
        link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
        archive.addfile(link)
        for library in HOST_LIBRARIES:
            archive.add(str(Path(library).resolve()), f"python/usr{library}")  # /lib is a link to usr/lib
        archive.add(
            str(STDLIB),
            f"python{STDLIB}",
            filter=lambda member: None if set(Path(member.name).parts) & STDLIB_SKIPPED else member,
        )
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=PYTHON_IMAGE, network_mode="none", rm=True)


def write_toolchain_task(
    root: Path,
    name: str = "toolchain",
    *,
    venv: str = "/opt/venv",
    activate: bool = False,
    solve_sh: str = "#!/bin/sh\necho done > /app/result.txt\n",
    verifier_toml: str = "",
) -> Path:
    """A task whose verifier is real pytest in the venv ``venv`` (made by the Dockerfile, outside
    the work directory ``/app``), run by absolute path or after ``. bin/activate``; three
    assertions on ``/app/result.txt``."""
    task = root / name
    (task / "environment" / "site").mkdir(parents=True)
    copied = [*(SITE_PACKAGES / name for name in (*PYTEST_DISTS, *PYTEST_MODULES))]
    copied += [found for name in PYTEST_DISTS for found in SITE_PACKAGES.glob(f"{name}-*.dist-info")]
    for path in copied:
        if path.is_dir():
            ignored = shutil.ignore_patterns("__pycache__")
            shutil.copytree(path, task / "environment" / "site" / path.name, ignore=ignored)
        elif path.is_file():
            shutil.copy(path, task / "environment" / "site" / path.name)
    site = f"{venv}/lib/python3.11/site-packages"
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {PYTHON_IMAGE}\nWORKDIR /app\nCOPY site/ /opt/pytest-site/\n"
        f"RUN python3 -m venv --without-pip {venv} && cp -a /opt/pytest-site/. {site}/ && rm -rf /opt/pytest-site\n"
    )
    (task / "tests").mkdir()
    test_sh = TEST_SH.format(
        activate=f". {venv}/bin/activate" if activate else "", runner="python" if activate else f"{venv}/bin/python"
    )
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "tests" / "test_outputs.py").write_text(TEST_PY)
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text(solve_sh)
    (task / "instruction.md").write_text("Write done to /app/result.txt.\n")
    (task / "task.toml").write_text(
        '[verifier]\ntimeout_sec = 120\nreport_format = "junit"\nassertions = 3\n'
        + verifier_toml
        + '\n[agent]\ntimeout_sec = 120\n[environment]\nnetwork_mode = "no-network"\n'
    )
    return task
