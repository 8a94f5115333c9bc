"""The embedded backend's image store against real parts, no Docker engine: images made with
``umoci``, pushed with ``skopeo`` to a real registry (Debian's ``docker-registry``) on loopback,
then copied and unpacked by ``ImageStore``: the pull policies, credentials-free plain HTTP on
loopback, OCI layouts, an unreachable registry, a corrupt layer, and two copies of one image at
once. The references themselves are tested as a table (``termgym.images.refs``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from termgym.errors import ConfigError, EnvironmentBuildError
from termgym.images.refs import ImageRefError, image_config, parse_image, split_docker_ref
from termgym.sandboxes.local import images as images_module
from termgym.sandboxes.local.images import ImageStore
from tests.registry import free_port, running_registry

pytestmark = [pytest.mark.slow]


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("ubuntu", ("docker.io", "library/ubuntu", "latest", "")),
        ("ubuntu:24.04", ("docker.io", "library/ubuntu", "24.04", "")),
        ("team/tool:1", ("docker.io", "team/tool", "1", "")),
        ("ghcr.io/org/img:v2", ("ghcr.io", "org/img", "v2", "")),
        ("localhost/img", ("localhost", "img", "latest", "")),
        ("127.0.0.1:5000/a/b:c", ("127.0.0.1:5000", "a/b", "c", "")),
        ("reg:5000/img@sha256:" + "a" * 64, ("reg:5000", "img", "", "sha256:" + "a" * 64)),
        ("img:tag@sha256:" + "b" * 64, ("docker.io", "library/img", "tag", "sha256:" + "b" * 64)),
    ],
)
def test_a_docker_name_is_normalized_as_docker_does(ref, expected):
    assert split_docker_ref(ref) == expected


@pytest.mark.parametrize("ref", ["", "Ubuntu", "img@sha256:abc", "a b", "img:tag:more", "reg.io/", "img:"])
def test_a_name_docker_would_refuse_is_one_line(ref):
    with pytest.raises(ImageRefError) as caught:
        parse_image(ref)
    assert "\n" not in str(caught.value)


def test_transports_pass_through_and_loopback_registries_are_plain_http():
    assert parse_image("oci:/srv/layout:1").skopeo == "oci:/srv/layout:1"
    assert parse_image("docker-archive:/tmp/a.tar").skopeo == "docker-archive:/tmp/a.tar"
    local = parse_image("127.0.0.1:5000/a:1")
    assert local.skopeo == "docker://127.0.0.1:5000/a:1" and local.plain_http
    assert parse_image("localhost:5000/a").plain_http and parse_image("[::1]:5000/a").plain_http
    remote = parse_image("ubuntu:24.04")
    assert remote.skopeo == "docker://docker.io/library/ubuntu:24.04" and not remote.plain_http
    assert remote.pinned("sha256:" + "c" * 64) == "docker://docker.io/library/ubuntu@sha256:" + "c" * 64


def test_an_image_configuration_gives_env_workdir_user_and_command():
    blob = json.dumps(
        {"config": {"Env": ["PATH=/x", "A=b=c"], "WorkingDir": "/w", "User": "app", "Cmd": ["sh"], "Entrypoint": None}}
    )
    config = image_config(blob.encode())
    assert config.env == {"PATH": "/x", "A": "b=c"} and config.workdir == "/w" and config.user == "app"
    assert config.cmd == ("sh",) and config.entrypoint == ()
    assert image_config(b'{"config": {}}').workdir == "/"
    with pytest.raises(ValueError, match="not JSON"):
        image_config(b"not json")


# -- real images ---------------------------------------------------------------------------------


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def make_layout(root: Path, files: dict[str, str], *, env: str = "FOO=bar", tag: str = "1") -> Path:
    """An OCI layout at ``root`` holding one image (tag ``tag``) whose only layer has ``files``."""
    layout = root / "layout"
    if not layout.exists():
        _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", f"{layout}:{tag}")
    bundle = root / f"bundle-{tag}"
    _run("umoci", "unpack", "--rootless", "--image", f"{layout}:{tag}", str(bundle))
    for name, text in files.items():
        path = bundle / "rootfs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _run("umoci", "repack", "--image", f"{layout}:{tag}", str(bundle))
    _run("umoci", "config", "--image", f"{layout}:{tag}", "--config.env", env, "--config.workingdir", "/work")
    shutil.rmtree(bundle)
    return layout


def push(layout: Path, tag: str, ref: str) -> None:
    _run("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:{tag}", f"docker://{ref}")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A loopback registry: ``(address, its storage)``."""
    root = tmp_path_factory.mktemp("registry")
    with running_registry(root) as address:
        yield address, root / "data"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ImageStore]:
    """A store of this test's own under /tmp (an image's unprivileged owner must reach it)."""
    root = Path("/tmp") / f"termgym-test-images-{tmp_path.name}"
    yield ImageStore(root)
    shutil.rmtree(root, ignore_errors=True)


def entries(store: ImageStore) -> list[str]:
    """The unpacked images and the staging directories left in ``store``."""
    found = sorted(p.name for p in (store.root / "images").iterdir()) if (store.root / "images").is_dir() else []
    return found + sorted(p.name for p in store.root.glob(".staging-*"))


async def test_an_image_from_a_loopback_registry_is_unpacked_once_as_its_unprivileged_owner(registry, store, tmp_path):
    address, _ = registry
    ref = f"{address}/test/tiny:1"
    push(make_layout(tmp_path, {"etc/marker": "from-the-registry\n", "usr/bin/tool": "#!/bin/sh\n"}), "1", ref)
    image = await store.resolve(ref, policy="missing", what="task", timeout=120)
    assert (image.rootfs / "etc/marker").read_text() == "from-the-registry\n"
    assert image.config.env["FOO"] == "bar" and image.config.workdir == "/work"
    assert image.digest.startswith("sha256:") and image.record("docker_image")["digest"] == image.digest
    owners = {path.lstat().st_uid for path in [image.rootfs, *image.rootfs.rglob("*")]}
    assert owners == {image.owner} and (image.owner != 0 or os.geteuid() != 0)  # never host root's files
    # the name is known now: asked again with the registry's tag moved, "missing" keeps the copy
    push(make_layout(tmp_path, {"etc/marker": "moved\n"}, tag="2"), "2", ref)
    again = await store.resolve(ref, policy="missing", what="task", timeout=120)
    assert again.digest == image.digest and (again.rootfs / "etc/marker").read_text() == "from-the-registry\n"
    assert store.holds(ref) and not store.holds(f"{address}/test/other:1")
    # "always" asks the registry (once per process) and gets the moved tag
    images_module._pulled.discard(ref)
    moved = await store.resolve(ref, policy="always", what="task", timeout=120)
    assert moved.digest != image.digest and (moved.rootfs / "etc/marker").read_text() == "moved\n"
    assert len(entries(store)) == 2  # both unpacked, nothing half-written


async def test_never_without_a_copy_and_an_unreachable_registry_are_one_line_and_leave_nothing(store):
    ref = f"127.0.0.1:{free_port()}/test/absent:1"  # nothing listens there
    with pytest.raises(EnvironmentBuildError) as never:
        await store.resolve(ref, policy="never", what="task-a", timeout=30)
    assert "--pull never" in str(never.value) and ref in str(never.value)
    with pytest.raises(EnvironmentBuildError) as unreachable:
        await store.resolve(ref, policy="missing", what="task-a", timeout=30)
    message = str(unreachable.value)
    assert "\n" not in message and message.startswith(f"task-a: could not pull image {ref}: ")
    assert "connection refused" in message
    assert entries(store) == []


async def test_an_unknown_name_is_the_registrys_answer(registry, store):
    address, _ = registry
    with pytest.raises(EnvironmentBuildError) as caught:
        await store.resolve(f"{address}/test/never-pushed:1", policy="missing", what="t", timeout=60)
    assert "manifest unknown" in str(caught.value) or "not found" in str(caught.value).lower()


async def test_a_corrupt_layer_fails_the_copy_and_leaves_no_entry(registry, store, tmp_path):
    address, data = registry
    ref = f"{address}/test/corrupt:1"
    layout = make_layout(tmp_path, {"etc/big": "x" * 100_000})
    push(layout, "1", ref)
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((layout / "blobs/sha256" / index["manifests"][0]["digest"].split(":")[1]).read_text())
    layer = manifest["layers"][-1]["digest"].split(":")[1]
    blob = data / "docker/registry/v2/blobs/sha256" / layer[:2] / layer / "data"
    blob.write_bytes(blob.read_bytes()[:-100])  # truncated in the registry's own storage
    with pytest.raises(EnvironmentBuildError) as caught:
        await store.resolve(ref, policy="missing", what="t", timeout=60)
    assert "\n" not in str(caught.value)
    assert entries(store) == [] and not store.holds(ref)


async def test_two_trials_wanting_one_image_at_once_unpack_it_once(registry, store, tmp_path, monkeypatch):
    address, _ = registry
    ref = f"{address}/test/shared:1"
    push(make_layout(tmp_path, {"etc/marker": "shared\n"}), "1", ref)
    unpacks = []
    real = images_module._umoci_unpack

    async def counted(*args, **kwargs):
        unpacks.append(args[0])
        return await real(*args, **kwargs)

    monkeypatch.setattr(images_module, "_umoci_unpack", counted)
    first, second = await asyncio.gather(
        store.resolve(ref, policy="missing", what="a", timeout=120),
        ImageStore(store.root).resolve(ref, policy="missing", what="b", timeout=120),
    )
    assert first.rootfs == second.rootfs and len(unpacks) == 1


async def test_an_oci_layout_is_read_again_when_its_image_changes(store, tmp_path):
    layout = make_layout(tmp_path, {"etc/marker": "first\n"})
    ref = f"oci:{layout}:1"
    first = await store.resolve(ref, policy="missing", what="t", timeout=60)
    assert (first.rootfs / "etc/marker").read_text() == "first\n"
    make_layout(tmp_path, {"etc/marker": "second\n"})  # the same tag, a new image
    second = await store.resolve(ref, policy="missing", what="t", timeout=60)
    assert second.digest != first.digest and (second.rootfs / "etc/marker").read_text() == "second\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="a small file system of its own needs a mount")
async def test_a_full_disk_while_unpacking_is_one_line_and_leaves_no_entry(tmp_path):
    """The store on a 2 MB tmpfs; the image's one file is 4 MB: the copy or the unpacking fails
    for space, the error is one line naming the image, and nothing is left that a later sandbox
    could start from."""
    layout = make_layout(tmp_path, {"etc/big": os.urandom(4 << 20).hex()[: 4 << 20]})
    root = Path(tempfile.mkdtemp(prefix="termgym-test-full-", dir="/tmp"))
    root.chmod(0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "termgym-test", str(root)], check=True)
    try:
        store = ImageStore(root / "store")
        with pytest.raises(EnvironmentBuildError) as caught:
            await store.resolve(f"oci:{layout}:1", policy="missing", what="task-full", timeout=60)
        assert "\n" not in str(caught.value) and f"oci:{layout}:1" in str(caught.value)
        assert "no space left on device" in str(caught.value).lower()
        assert entries(store) == []
    finally:
        subprocess.run(["umount", str(root)], check=False)
        shutil.rmtree(root, ignore_errors=True)


async def test_a_docker_save_archive_is_an_image_source(store, tmp_path):
    """What ``docker save`` writes (made here by skopeo from an OCI layout, no engine)."""
    layout = make_layout(tmp_path, {"etc/marker": "from-an-archive\n"})
    archive = tmp_path / "saved.tar"
    _run("skopeo", "copy", "--quiet", f"oci:{layout}:1", f"docker-archive:{archive}:saved/image:1")
    image = await store.resolve(f"docker-archive:{archive}", policy="never", what="t", timeout=60)
    assert (image.rootfs / "etc/marker").read_text() == "from-an-archive\n" and image.config.env["FOO"] == "bar"


@pytest.mark.parametrize(
    ("dockerfile", "image", "aliases", "prefer_build", "expected"),
    [
        ("FROM debian:bookworm-slim\n", None, {}, False, (None, "build")),  # the default alias: the host's
        ("FROM ubuntu:24.04\n", None, {}, False, ("ubuntu:24.04", "build")),
        ("FROM ubuntu:24.04\n", None, {"ubuntu:24.04": "termgym/base:bookworm"}, False, (None, "build")),
        ("FROM ubuntu:24.04\n", None, {"ubuntu:24.04": "mine:1"}, False, ("mine:1", "build")),
        ("FROM ubuntu:24.04\n", "team/tool:2", {}, False, ("team/tool:2", "docker_image")),  # the named image wins
        ("FROM ubuntu:24.04\n", "team/tool:2", {}, True, ("ubuntu:24.04", "build")),  # --build
        (None, "team/tool:2", {}, False, ("team/tool:2", "docker_image")),
        (None, None, {}, False, (None, "docker_image")),
    ],
)
def test_which_image_a_sandbox_runs(tmp_path, dockerfile, image, aliases, prefer_build, expected):
    from termgym.images.dockerfile import parse_dockerfile
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local.images import image_to_run

    path = None
    if dockerfile is not None:
        path = tmp_path / "Dockerfile"
        path.write_text(dockerfile)
    spec = SandboxSpec("t", tmp_path, path, image=image, image_aliases=aliases, prefer_build=prefer_build)
    plan = parse_dockerfile(dockerfile) if dockerfile is not None else None
    assert image_to_run(spec, plan, ImageStore(tmp_path / "store")) == expected


async def test_an_alias_stands_in_only_for_an_image_the_store_lacks(store, tmp_path):
    from termgym.images.dockerfile import parse_dockerfile
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local.images import image_to_run

    ref = f"oci:{make_layout(tmp_path, {'etc/marker': 'x'})}:1"
    spec = SandboxSpec("t", None, None, image=ref, image_aliases={ref: "termgym/base:bookworm"})
    assert image_to_run(spec, parse_dockerfile("FROM x\n"), store) == (None, "docker_image")
    await store.resolve(ref, policy="missing", what="t", timeout=60)
    assert image_to_run(spec, None, store) == (ref, "docker_image")  # held now: the image itself
    assert store.clear() == (1, 0) and not store.holds(ref) and store.clear() == (0, 0)
    assert image_to_run(spec, None, store) == (None, "docker_image")  # gone: the alias again


async def test_a_staging_directory_a_dead_process_left_is_removed_by_the_next_copy(store, tmp_path):
    ref = f"oci:{make_layout(tmp_path, {'etc/marker': 'x'})}:1"
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = store.root / f".staging-{dead.pid}-deadbeef"
    (left / "layout").mkdir(parents=True)
    alive = store.root / f".staging-{os.getpid()}-cafecafe"  # a copy still under way in this process
    alive.mkdir()
    await store.resolve(ref, policy="missing", what="t", timeout=60)
    assert not left.exists() and alive.exists()


# -- removal: termgym gc --images and the store's bound ------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox over an image mounts its overlay as root here")
async def test_gc_removes_the_images_no_sandbox_uses_and_keeps_the_one_a_sandbox_runs_on(cache_dir, tmp_path):
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local import LocalSandbox
    from termgym.sandboxes.local.leftovers import remove_leftovers

    store = ImageStore.from_environment()
    used = f"oci:{make_layout(tmp_path / 'a', {'etc/marker': 'used'})}:1"
    unused = f"oci:{make_layout(tmp_path / 'b', {'etc/marker': 'unused'})}:1"
    held = await store.resolve(unused, policy="missing", what="t", timeout=60)
    fd = store.hold(held)  # what a sandbox takes between its image's resolution and its mount
    assert fd is not None
    try:
        assert store.clear() == (0, 1) and store.holds(unused)
    finally:
        os.close(fd)
    image = await store.resolve(used, policy="missing", what="t", timeout=60)
    async with LocalSandbox(SandboxSpec("gc-images", None, None, image=used)) as sandbox:
        line = await remove_leftovers(images=True)
        assert line.endswith("; 1 unpacked image(s), 1 in use kept"), line
        assert store.holds(used) and not store.holds(unused)
        assert (image.rootfs / "etc/marker").read_text() == "used"  # whole under the running sandbox
        await sandbox.check_alive()
    assert store.clear() == (1, 0) and not store.holds(used)
    assert not list(store.root.glob(".staging-*"))  # nothing half-removed left behind


@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox over an image mounts its overlay as root here")
async def test_a_bounded_store_evicts_the_least_recently_used_images_but_never_one_in_use(
    cache_dir, tmp_path, monkeypatch
):
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local import LocalSandbox

    big = "x" * (600 << 10)  # each image takes a bit over 600 KiB on disk
    refs = [f"oci:{make_layout(tmp_path / n, {'etc/marker': n, 'data': big})}:1" for n in "abcd"]
    monkeypatch.setenv("TERMGYM_IMAGE_STORE_MB", "2")  # room for three of them
    store = ImageStore.from_environment()
    a, b, c, d = refs
    for ref in (a, b, c):
        await store.resolve(ref, policy="missing", what="t", timeout=60)
    await store.resolve(a, policy="missing", what="t", timeout=60)  # a used again: b is the oldest now
    async with LocalSandbox(SandboxSpec("bounded", None, None, image=b)):
        await store.resolve(d, policy="missing", what="t", timeout=60)
        # over the bound: b is the least recently used but in use, so c goes
        assert [store.holds(ref) for ref in refs] == [True, True, False, True]
    monkeypatch.setenv("TERMGYM_IMAGE_STORE_MB", "1.5")
    with pytest.raises(ConfigError, match="TERMGYM_IMAGE_STORE_MB must be a number of megabytes"):
        ImageStore.from_environment()
