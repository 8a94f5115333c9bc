"""Images for the embedded backend, without a daemon: a task's ``docker_image`` or ``FROM`` as a
root file system every sandbox of it starts from.

An image (``termgym.images.refs``) is copied by ``skopeo`` and unpacked by ``umoci``, rootless, as
the unprivileged host user its sandboxes run as. Guarantees: an image is visible only once
unpacked completely (a failure leaves no entry); it is copied and unpacked once per digest, across
trials and processes; the pull policy (``missing``, ``always``, ``never``) is Docker's, and so are
the credentials; errors are one line naming the image (``EnvironmentBuildError``); an image in use
(its ``use-`` lock held, or a lower layer of any mount) is never removed.

Layout under ``cache_root() / "images"``, and the guarantees in full:
docs/guides/backends.md#task-images-without-a-daemon."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from termgym.errors import BackendUnavailable, ConfigError, EnvironmentBuildError
from termgym.images.build import BASE_IMAGE, DEFAULT_ALIASES, builds_dockerfile
from termgym.images.dockerfile import EnvironmentPlan
from termgym.images.pull import absent_error, pull_error, pull_needed
from termgym.images.refs import ImageConfig, ImageRefError, ImageSource, image_config, parse_image
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.host_processes import end_process, spawn
from termgym.sandboxes.local.env_cache import (
    cache_root,
    disk_bytes,
    mounted_lower_dirs,
    mtime_ns,
    remove_stale_staging,
)
from termgym.sandboxes.local.host import require_searchable, sandbox_uid
from termgym.sandboxes.local.locks import file_lock
from termgym.sandboxes.tools import host_tool

FORMAT = 1  # bump when what an unpacked image holds or how it is unpacked changes
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Docker's, where an image sets none
_HEX = re.compile(r"sha256:([0-9a-f]{64})")
_pulled: set[str] = set()  # references this process asked their registry for (``always`` asks once)


@dataclass(frozen=True)
class LocalImage:
    """An unpacked image: its ``rootfs``, owned by the host uid ``owner`` (its sandboxes' root),
    and what its configuration says (``config``); ``digest`` is its manifest's."""

    ref: str
    digest: str
    rootfs: Path
    owner: int
    config: ImageConfig

    def record(self, source: str) -> dict[str, str]:
        """What a trial's record says of its image (``Sandbox.image``)."""
        return {"ref": self.ref, "source": source, "digest": self.digest}


def image_to_run(spec: SandboxSpec, plan: EnvironmentPlan | None, store: ImageStore) -> tuple[str | None, str]:
    """The image a sandbox of ``spec`` runs on this backend and where it comes from
    (``docker_image`` or ``build``): the task's ``docker_image`` unless its Dockerfile is built
    (``builds_dockerfile``, as on Docker), else the Dockerfile's ``FROM``; an alias stands in for an
    image this store does not hold, as an alias stands in for an image the engine lacks on Docker
    (``DEFAULT_ALIASES`` under the spec's own).
    None for the host's system: ``BASE_IMAGE`` (which the default aliases name for Debian bookworm,
    the host's release) or no image at all."""
    if builds_dockerfile(spec.dockerfile, spec.image, spec.prefer_build):
        ref, source = (plan.base_image if plan is not None else None), "build"
    else:
        ref, source = spec.image, "docker_image"
    aliases = {**DEFAULT_ALIASES, **spec.image_aliases}
    if ref is not None and ref in aliases and not store.holds(ref):
        ref = aliases[ref]
    return (None if ref in (None, BASE_IMAGE) else ref), source


def image_store_root() -> Path:
    """``cache_root() / "images"`` (``TERMGYM_ENV_CACHE_DIR`` moves both caches)."""
    return cache_root() / "images"


def require_image_tools() -> None:
    """``BackendUnavailable`` (one line) unless skopeo and umoci are here."""
    for name, package in (("skopeo", "skopeo"), ("umoci", "umoci")):
        try:
            host_tool(name)
        except BackendUnavailable:
            raise BackendUnavailable(
                f"the embedded backend runs task images with {name}, which is not installed "
                f"(apt-get install {package}); or alias the image to the host's system "
                "(--image-alias IMAGE=termgym/base:bookworm)"
            ) from None


class ImageStore:
    """The unpacked images under ``root`` (see the module's guarantees)."""

    def __init__(self, root: Path, *, max_bytes: int = 0) -> None:
        self.root = root
        self.max_bytes = max_bytes  # 0: no bound

    @classmethod
    def from_environment(cls) -> ImageStore:
        """The store under ``image_store_root()``, bounded by ``TERMGYM_IMAGE_STORE_MB`` when set;
        ``ConfigError`` in one line for a size that is not a count of megabytes."""
        raw = os.environ.get("TERMGYM_IMAGE_STORE_MB", "").strip() or "0"
        if not raw.isdigit():
            raise ConfigError(f"TERMGYM_IMAGE_STORE_MB must be a number of megabytes (0: no bound), got {raw!r}")
        return cls(image_store_root(), max_bytes=int(raw) << 20)

    async def resolve(self, ref: str, *, policy: str, what: str, timeout: float) -> LocalImage:
        """The unpacked image ``ref`` names, copied and unpacked first where ``policy`` says
        (the module's guarantees). ``EnvironmentBuildError`` in one line when it cannot be had."""
        try:
            source = parse_image(ref)
        except ImageRefError as exc:
            raise EnvironmentBuildError(f"{what}: {exc}") from None
        require_image_tools()
        for directory in ("images", "refs", "locks"):
            (self.root / directory).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # the images' unprivileged owners reach their root file systems
        name = _ref_name(ref)
        async with file_lock(self.root / "locks" / f"ref-{name}.lock", fcntl.LOCK_EX, timeout, f"image {ref}"):
            known = self._known(name)
            image = self._image(known, ref) if known else None
            if source.transport == "docker":
                if policy == "never" and image is None:
                    raise absent_error(ref, what)
                if not pull_needed(policy, image is not None, ref in _pulled):
                    assert image is not None  # "never" without a copy was refused above
                    return _used(image)
                local = await _engine_source(ref) if policy == "missing" else None
                if local is not None:
                    source = local
                else:
                    _pulled.add(ref)
            digest = await self._digest(source, ref, what)
            image = self._image(digest, ref)
            if image is None:
                image = await self._unpack(source, digest, ref, what, timeout)
                await asyncio.to_thread(self.evict, keep=digest)
            self._remember(name, ref, digest)
            return _used(image)

    def use_lock(self, digest: str) -> Path:
        """The lock every sandbox over the image ``digest`` holds shared while it runs."""
        return self.root / "locks" / f"use-{digest.split(':', 1)[-1]}.lock"

    def hold(self, image: LocalImage) -> int | None:
        """Take the image's ``use_lock`` shared: a descriptor to close when the sandbox is gone,
        or None when the image was removed before it was taken (resolve it again)."""
        fd = os.open(self.use_lock(image.digest), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        if self._image(image.digest, image.ref) is None:
            os.close(fd)
            return None
        return fd

    def clear(self) -> tuple[int, int]:
        """``termgym gc --images``: remove every unpacked image no sandbox uses, and what a dead
        copy left; (images removed, images kept because in use). Blocking."""
        remove_stale_staging(self.root)
        removed = kept = 0
        for entry in self._entries():
            if self._remove_unused(entry):
                removed += 1
            else:
                kept += 1
        return removed, kept

    def evict(self, *, keep: str = "") -> list[str]:
        """Remove the least recently used images no sandbox uses (never ``keep``, a digest) until
        the store is within ``max_bytes`` (0: no bound); the digests removed. Blocking."""
        if not self.max_bytes:
            return []
        entries = self._entries()
        sizes = {entry: _meta(entry).get("bytes", 0) for entry in entries}
        total, removed = sum(sizes.values()), []
        for entry in entries:
            if total <= self.max_bytes:
                break
            if f"sha256:{entry.name}" != keep and self._remove_unused(entry):
                total -= sizes[entry]
                removed.append(f"sha256:{entry.name}")
        return removed

    def _entries(self) -> list[Path]:
        """The unpacked images' directories, least recently used first."""
        try:
            found = [path for path in (self.root / "images").iterdir() if path.is_dir()]
        except OSError:
            return []
        return sorted(found, key=lambda path: mtime_ns(path / "meta.json"))

    def _remove_unused(self, entry: Path) -> bool:
        """Remove the image at ``entry`` unless a sandbox uses it; True when it went."""
        fd = os.open(self.use_lock(f"sha256:{entry.name}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            rootfs = str(entry / "rootfs")
            if any(lower == rootfs or lower.startswith(f"{rootfs}/") for lower in mounted_lower_dirs()):
                return False
            doomed = self.root / f".staging-{os.getpid()}-doomed-{uuid.uuid4().hex[:8]}"
            try:
                entry.rename(doomed)  # gone at once for every reader
            except OSError:
                return False
            shutil.rmtree(doomed, ignore_errors=True)
            return True
        finally:
            os.close(fd)

    def holds(self, ref: str) -> bool:
        """Whether ``ref`` was copied here before and is still unpacked (no lock, no network)."""
        digest = self._known(_ref_name(ref))
        return digest is not None and self._image(digest, ref) is not None

    # -- reading -------------------------------------------------------------------------------

    def _known(self, name: str) -> str | None:
        try:
            return json.loads((self.root / "refs" / f"{name}.json").read_text())["digest"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _remember(self, name: str, ref: str, digest: str) -> None:
        path = self.root / "refs" / f"{name}.json"
        staging = path.with_suffix(f".{uuid.uuid4().hex}")
        staging.write_text(json.dumps({"ref": ref, "digest": digest}))
        staging.replace(path)

    def _image(self, digest: str, ref: str) -> LocalImage | None:
        """The unpacked image ``digest``, if it is here whole and of this ``FORMAT``."""
        match = _HEX.fullmatch(digest)
        if match is None:
            return None
        entry = self.root / "images" / match.group(1)
        try:
            meta = json.loads((entry / "meta.json").read_text())
            if meta.get("format") != FORMAT:
                return None
            return LocalImage(ref, digest, entry / "rootfs", int(meta["owner"]), ImageConfig.from_json(meta["config"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    async def _digest(self, source: ImageSource, ref: str, what: str) -> str:
        """The manifest digest of the image at ``source`` as its registry (or file) serves it."""
        raw = await _skopeo(["inspect", "--raw", *_source_options(source), source.skopeo], ref, what, 120)
        return "sha256:" + hashlib.sha256(raw).hexdigest()

    # -- writing -------------------------------------------------------------------------------

    async def _unpack(self, source: ImageSource, digest: str, ref: str, what: str, timeout: float) -> LocalImage:
        """Copy the image at ``source`` (its manifest ``digest``) into a staging directory,
        unpack it there as its owner and rename it into place."""
        hex_digest = digest.split(":", 1)[1]
        async with file_lock(self.root / "locks" / f"image-{hex_digest}.lock", fcntl.LOCK_EX, timeout, f"image {ref}"):
            image = self._image(digest, ref)
            if image is not None:
                return image
            remove_stale_staging(self.root)
            staging = self.root / f".staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            staging.mkdir(mode=0o755)
            try:
                owner = sandbox_uid()
                if owner is None:
                    owner = os.getuid()
                else:  # umoci runs as the image's unprivileged owner, who must reach the staging directory
                    require_searchable(self.root.resolve())
                layout = staging / "layout"
                pinned = source.pinned(digest)
                copy = ["copy", "--quiet", *_source_options(source, "src-"), pinned, f"oci:{layout}:image"]
                await _skopeo(copy, ref, what, timeout)
                config = _layout_config(layout)
                unpack_dir = staging / "unpack"
                unpack_dir.mkdir(mode=0o700)
                if owner != os.getuid():  # without root it is this user's, whose group need not be its uid
                    os.chown(unpack_dir, owner, owner)
                await _umoci_unpack(layout, unpack_dir / "rootfs", owner, ref, what, timeout)
                shutil.rmtree(layout)
                (unpack_dir / "rootfs").rename(staging / "rootfs")
                unpack_dir.rmdir()
                meta = {
                    "format": FORMAT,
                    "digest": digest,
                    "ref": ref,
                    "owner": owner,
                    "config": config.to_json(),
                    "bytes": await asyncio.to_thread(disk_bytes, staging / "rootfs"),
                }
                (staging / "meta.json").write_text(json.dumps(meta))
                entry = self.root / "images" / hex_digest
                staging.rename(entry)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, staging, True)
                raise
        image = self._image(digest, ref)
        assert image is not None
        return image


def _used(image: LocalImage) -> LocalImage:
    """``image``, its last use now (the eviction's order)."""
    with contextlib.suppress(OSError):
        os.utime(image.rootfs.parent / "meta.json")
    return image


def _meta(entry: Path) -> dict:
    try:
        meta = json.loads((entry / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _ref_name(ref: str) -> str:
    """The file name under ``refs/`` (and the lock) of a reference."""
    return hashlib.sha256(ref.encode()).hexdigest()[:32]


def _source_options(source: ImageSource, prefix: str = "") -> list[str]:
    """skopeo's options for reading ``source``: plain HTTP for a loopback registry, Docker's
    credentials file where there is one. ``prefix`` is ``src-`` for ``copy``."""
    options: list[str] = []
    if source.transport == "docker":
        if source.plain_http:
            options.append(f"--{prefix}tls-verify=false")
        config = _docker_config()
        if config is not None:
            options.append(f"--{prefix}authfile={config}")
    return options


def _docker_config() -> Path | None:
    base = os.environ.get("DOCKER_CONFIG")
    path = Path(base) / "config.json" if base else Path.home() / ".docker" / "config.json"
    return path if path.is_file() else None


def _layout_config(layout: Path) -> ImageConfig:
    """The configuration of the one image in the OCI ``layout`` skopeo wrote."""
    try:
        index = json.loads((layout / "index.json").read_text())
        manifest = json.loads(_blob(layout, index["manifests"][0]["digest"]))
        return image_config(_blob(layout, manifest["config"]["digest"]))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise EnvironmentBuildError(f"the copied image has no readable configuration: {exc}") from None


def _blob(layout: Path, digest: str) -> bytes:
    match = _HEX.fullmatch(str(digest))
    if match is None:
        raise ValueError(f"{digest!r} is not a sha256 digest")
    return (layout / "blobs" / "sha256" / match.group(1)).read_bytes()


async def _engine_source(ref: str) -> ImageSource | None:
    """The local Docker engine's copy of ``ref``, where an engine answers and has it."""
    socket = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not socket.startswith("unix://") or not Path(socket.removeprefix("unix://")).exists():
        return None

    def present() -> bool:
        try:
            import docker

            client = docker.DockerClient(base_url=socket, timeout=10)
            try:
                client.api.inspect_image(ref)
                return True
            finally:
                client.close()
        except Exception:  # no engine, no such image: the registry is asked instead
            return False

    return ImageSource("docker-daemon", ref) if await asyncio.to_thread(present) else None


async def _skopeo(args: list[str], ref: str, what: str, timeout: float) -> bytes:
    """Run skopeo; its standard output, or ``pull_error`` with the last line it printed."""
    policy = [] if _has_policy() else ["--insecure-policy"]
    return await _tool([host_tool("skopeo"), *policy, *args], ref, what, timeout)


def _has_policy() -> bool:
    return Path("/etc/containers/policy.json").is_file() or (Path.home() / ".config/containers/policy.json").is_file()


async def _umoci_unpack(layout: Path, rootfs: Path, owner: int, ref: str, what: str, timeout: float) -> None:
    """``umoci raw unpack --rootless`` as ``owner`` (by ``setpriv`` when that is not this user)."""
    argv = [host_tool("umoci"), "raw", "unpack", "--rootless", "--image", f"{layout}:image", str(rootfs)]
    if owner != os.getuid():
        argv = [host_tool("setpriv"), f"--reuid={owner}", f"--regid={owner}", "--clear-groups", "--", *argv]
    await _tool(argv, ref, what, timeout)


async def _tool(argv: list[str], ref: str, what: str, timeout: float) -> bytes:
    """Run a host tool (``HOST_ENV``); its standard output, or ``pull_error`` with the last line
    of its standard error."""
    process = await spawn(argv, end_process, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        raise pull_error(ref, what, f"{Path(argv[0]).name} took longer than {timeout:g}s") from None
    finally:
        await end_process(process)
    if process.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines() or [f"exit {process.returncode}"]
        raise pull_error(ref, what, _reason(lines[-1]))
    return out


def _reason(line: str) -> str:
    """A tool's error line without its log prefix (``time="..." level=fatal msg="..."``) and
    without skopeo's misleading ``Error parsing image name "...":`` before a registry's answer."""
    match = re.search(r'msg="(.*)"\s*$', line)
    reason = match.group(1).replace('\\"', '"') if match else line
    return re.sub(r'^Error parsing image name "[^"]*": ', "", reason)
