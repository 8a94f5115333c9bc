"""A task's ``docker_image`` and the pull policy against a real registry (Debian's
``docker-registry``) on a free loopback port: images pushed there, removed from the engine, then
pulled by a trial; absent images, unknown refs, an unreachable registry, ``--build``, aliases and
``FROM`` bases a build pulls."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from termgym.agents import NullAgent
from termgym.episode.options import EnvOptions
from termgym.images.build import BASE_IMAGE
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import KIT_SOURCE, require_docker, write_task
from tests.registry import free_port, running_registry

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[3]
MARKER = "/etc/termgym-marker"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry on 127.0.0.1:PORT (``tests.registry``); yields ``127.0.0.1:PORT``."""
    require_docker()
    with running_registry(tmp_path_factory.mktemp("registry")) as address:
        yield address


@pytest.fixture(scope="module")
def pushed(registry: str) -> Iterator[Callable[[str], str]]:
    """``pushed(name)``: an image built FROM the offline base with ``registry-image`` in
    ``/etc/termgym-marker``, pushed as ``REGISTRY/test/NAME:1`` and removed from the engine;
    returns that ref. Every ref pushed, and whatever pulled them, is removed at the end."""
    from termgym.sandboxes.docker import docker_client

    client = docker_client()
    refs: list[str] = []
    source = f"{registry}/test/source:1"
    dockerfile = f"FROM {BASE_IMAGE}\nRUN echo registry-image > {MARKER}\nLABEL termgym=1\n"
    _build(client, source, dockerfile)

    def push(name: str) -> str:
        ref = f"{registry}/test/{name}:1"
        repository, _, tag = ref.rpartition(":")
        client.api.tag(source, repository, tag)
        for chunk in client.api.push(repository, tag, stream=True, decode=True):
            assert "error" not in chunk, chunk
        client.api.remove_image(ref)
        refs.append(ref)
        return ref

    try:
        yield push
    finally:
        for ref in [*refs, source]:
            with contextlib.suppress(Exception):
                client.api.remove_image(ref, force=True)


def _build(client, tag: str, dockerfile: str) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile.encode())
        archive.addfile(info, io.BytesIO(dockerfile.encode()))
    stream = client.api.build(
        fileobj=io.BytesIO(buffer.getvalue()), custom_context=True, tag=tag, network_mode="none", decode=True
    )
    for chunk in stream:
        assert "error" not in chunk, chunk


def _present(ref: str) -> bool:
    from termgym.images.build import _image_present
    from termgym.sandboxes.docker import docker_client

    return _image_present(docker_client(), ref)


def marker_task(root: Path, *, image: str | None, dockerfile: str, name: str = "named-image") -> Path:
    """A task whose verifier passes only when ``/etc/termgym-marker`` says ``registry-image``;
    its Dockerfile writes something else there, so a pass proves the named image ran."""
    environment = f'docker_image = "{image}"\n' if image else ""
    test_sh = (
        f"#!/bin/sh\n{KIT_SOURCE}\ntg_check_sh 'ran the named image' 'grep -qx registry-image {MARKER}'\ntg_finish\n"
    )
    return write_task(root, name, dockerfile=dockerfile, environment_toml=environment, test_sh=test_sh)


BUILT = f"FROM {BASE_IMAGE}\nRUN echo built > {MARKER}\n"


def options(**overrides) -> EnvOptions:
    return EnvOptions(backend="docker", run_id="registry", **overrides)


async def test_a_named_image_is_pulled_and_runs_even_with_a_dockerfile(tmp_path, pushed, capfd):
    ref = pushed("named")
    assert not _present(ref)
    record = await run_trial(load_task(marker_task(tmp_path, image=ref, dockerfile=BUILT)), NullAgent(), options())
    assert record.error is None and record.resolved, record
    repository = ref.rpartition(":")[0]
    assert record.image["source"] == "docker_image" and record.image["ref"] == ref
    assert record.image["digest"].startswith(f"{repository}@sha256:"), record.image
    assert _present(ref)
    assert f"pulling {ref}" in capfd.readouterr().err  # the progress line (one, off a terminal)


async def test_build_forces_the_dockerfile(tmp_path, pushed):
    ref = pushed("forced")
    task = load_task(marker_task(tmp_path, image=ref, dockerfile=BUILT))
    record = await run_trial(task, NullAgent(), options(build=True))
    assert record.error is None and not record.resolved  # the Dockerfile's marker says "built"
    assert record.image["source"] == "build" and record.image["ref"].startswith("termgym-task/")
    assert record.image["digest"].startswith("sha256:")
    assert not _present(ref)  # nothing was pulled for a build that does not need the image
    from termgym.sandboxes.docker import docker_client

    with contextlib.suppress(Exception):
        docker_client().api.remove_image(record.image["ref"], force=True)


async def test_pull_never_leaves_an_absent_image_a_one_line_build_failure(tmp_path, pushed):
    ref = pushed("never")
    record = await run_trial(
        load_task(marker_task(tmp_path, image=ref, dockerfile=BUILT)), NullAgent(), options(pull="never")
    )
    assert record.error is not None and record.error["kind"] == "build_failed"
    message = record.error["message"]
    assert ref in message and "--pull never" in message and "\n" not in message
    assert not _present(ref)


async def test_an_image_the_registry_lacks_is_a_one_line_build_failure(tmp_path, registry):
    ref = f"{registry}/test/does-not-exist:1"
    record = await run_trial(load_task(marker_task(tmp_path, image=ref, dockerfile=BUILT)), NullAgent(), options())
    assert record.error is not None and record.error["kind"] == "build_failed"
    message = record.error["message"]
    assert f"could not pull image {ref}" in message and "\n" not in message
    assert f"--image-alias {ref}=LOCAL" in message and "--pull never" in message
    assert message.endswith("or build the task's Dockerfile (--build)")  # the task has one


async def test_an_unreachable_registry_is_a_one_line_build_failure(tmp_path):
    ref = f"127.0.0.1:{free_port()}/test/img:1"  # nothing listens there
    record = await run_trial(load_task(marker_task(tmp_path, image=ref, dockerfile=BUILT)), NullAgent(), options())
    assert record.error is not None and record.error["kind"] == "build_failed"
    assert f"could not pull image {ref}" in record.error["message"] and "\n" not in record.error["message"]


async def test_an_alias_for_the_named_image_is_used_and_nothing_is_pulled(tmp_path):
    ref = f"127.0.0.1:{free_port()}/test/aliased:1"  # unreachable: a pull would fail the trial
    task = load_task(marker_task(tmp_path, image=ref, dockerfile=BUILT))
    record = await run_trial(task, NullAgent(), options(image_aliases={ref: BASE_IMAGE}))
    assert record.error is None and not record.resolved  # ran the base image: no marker there
    assert record.image["source"] == "docker_image" and record.image["ref"] == ref


async def test_a_builds_from_base_is_pulled_before_the_build(tmp_path, pushed):
    ref = pushed("base")
    dockerfile = f"FROM {ref}\nRUN echo extra > /etc/termgym-extra\n"
    record = await run_trial(
        load_task(marker_task(tmp_path, image=None, dockerfile=dockerfile, name="pulled-base")), NullAgent(), options()
    )
    assert record.error is None and record.resolved, record  # the marker comes from the pulled base
    assert record.image["source"] == "build"
    assert _present(ref)
    from termgym.sandboxes.docker import docker_client

    with contextlib.suppress(Exception):
        docker_client().api.remove_image(record.image["ref"], force=True)


def test_check_with_pull_never_reports_the_absent_image_in_its_record(tmp_path, pushed):
    import json
    import sys

    ref = pushed("cli-never")
    task = marker_task(tmp_path, image=ref, dockerfile=BUILT)
    command = [sys.executable, "-m", "termgym", "check", str(task), "--backend", "docker", "--json", "--pull", "never"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    record = json.loads(result.stdout)
    assert record["error"]["kind"] == "build_failed" and ref in record["error"]["message"]
    assert "Traceback" not in result.stderr and not _present(ref)


async def test_pull_always_pulls_a_present_image_and_missing_does_not(tmp_path, pushed, capfd):
    from termgym.sandboxes.docker import docker_client

    ref = pushed("always")
    docker_client().api.pull(ref)  # present, pulled outside termgym
    capfd.readouterr()
    task = load_task(marker_task(tmp_path, image=ref, dockerfile=BUILT))
    record = await run_trial(task, NullAgent(), options())
    assert record.resolved and f"pulling {ref}" not in capfd.readouterr().err
    record = await run_trial(task, NullAgent(), options(pull="always"))
    assert record.resolved and f"pulling {ref}" in capfd.readouterr().err


# -- the same registry, on the embedded backend (no daemon: skopeo and umoci) -------------------


def embedded(**overrides) -> EnvOptions:
    return EnvOptions(backend="local", run_id="registry-embedded", **overrides)


async def test_on_the_embedded_backend_a_from_in_a_loopback_registry_runs_that_image(tmp_path, pushed, no_leaks):
    ref = pushed("embedded-from")
    dockerfile = f"FROM {ref}\nWORKDIR /app\nRUN echo extra > /etc/termgym-extra\n"
    task = load_task(marker_task(tmp_path, image=None, dockerfile=dockerfile, name="embedded-from"))
    record = await run_trial(task, NullAgent(), embedded())
    assert record.error is None and record.resolved, record  # the marker is the pulled image's, not the host's
    assert record.image["source"] == "build" and record.image["ref"] == ref
    assert record.image["digest"].startswith("sha256:") and not _present(ref)  # no engine involved
    again = await run_trial(task, NullAgent(), embedded())  # the prepared layer over the image, kept
    assert again.resolved and again.image["digest"] == record.image["digest"] and "prepared" in again.image


async def test_on_the_embedded_backend_a_named_image_wins_over_the_dockerfile(tmp_path, pushed, no_leaks):
    ref = pushed("embedded-named")
    record = await run_trial(load_task(marker_task(tmp_path, image=ref, dockerfile=BUILT)), NullAgent(), embedded())
    assert record.error is None and record.resolved, record
    assert record.image["source"] == "docker_image" and record.image["ref"] == ref


async def test_on_the_embedded_backend_pull_never_and_an_absent_image_are_one_line(tmp_path, registry, no_leaks):
    ref = f"{registry}/test/embedded-absent:1"
    task = load_task(marker_task(tmp_path, image=ref, dockerfile=BUILT))
    for pull, expected in (("never", "--pull never forbids pulling it"), ("missing", f"could not pull image {ref}")):
        record = await run_trial(task, NullAgent(), embedded(pull=pull))
        assert record.error is not None and record.error["kind"] == "build_failed", record
        assert expected in record.error["message"] and "\n" not in record.error["message"]
