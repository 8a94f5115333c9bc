"""Task images for the Docker backend: offline base image, FROM aliases, content-hashed build cache.

Pure parts (tested with tables): ``parse_alias``, ``rewrite_from`` (a Dockerfile's ``FROM`` rewritten
to an alias when the named image is absent), ``context_digest`` (the hash of a build context's content
(``termgym.images.context``) and its Dockerfile, from which the image tag derives, so an unchanged
task never rebuilds and a changed one never runs an old image). I/O parts take a
docker-py client: ``ensure_task_image`` picks the task's ``docker_image`` or its Dockerfile
(``builds_dockerfile``), pulls per the pull policy (``termgym.images.pull``) and builds at most once
per tag per process (concurrent trials of one task wait for the same build);
``bootstrap_base_image`` makes ``termgym/base:bookworm`` with debootstrap, no registry needed.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import subprocess
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from termgym.errors import ConfigError, EnvironmentBuildError
from termgym.images import context as build_context
from termgym.images.pull import ensure_pulled, stderr_reporter

BASE_IMAGE = "termgym/base:bookworm"
# Public bases that the offline base image stands in for (it is Debian bookworm, minbase).
DEFAULT_ALIASES = {
    "debian:bookworm-slim": BASE_IMAGE,
    "debian:bookworm": BASE_IMAGE,
    "debian:12-slim": BASE_IMAGE,
    "debian:12": BASE_IMAGE,
}
CONFIG_FILES = ("termgym.toml", "~/.config/termgym/config.toml")
TASK_IMAGE_REPOSITORY = "termgym-task"
_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)


def parse_alias(text: str) -> tuple[str, str]:
    """``"debian:bookworm-slim=termgym/base:bookworm"`` to its two names."""
    name, sep, target = text.partition("=")
    if not sep or not name.strip() or not target.strip():
        raise ConfigError(f"an image alias is NAME=IMAGE, got {text!r}")
    return name.strip(), target.strip()


def read_config_file(config_files: Sequence[str] = CONFIG_FILES) -> tuple[Path, dict[str, Any]] | None:
    """The first of ``config_files`` that exists and its TOML, or None when there is none; a file
    that is not TOML is one line (``ConfigError``). Image aliases and the command line's defaults
    both read it."""
    for candidate in config_files:
        path = Path(os.path.expanduser(candidate))
        if path.is_file():
            try:
                return path, tomllib.loads(path.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return None


def load_aliases(cli: Sequence[str] = (), config_files: Sequence[str] = CONFIG_FILES) -> dict[str, str]:
    """Defaults, then ``[images.aliases]`` of the first config file found, then ``--image-alias``."""
    aliases = dict(DEFAULT_ALIASES)
    found = read_config_file(config_files)
    if found is not None:
        path, data = found
        table = data.get("images", {}).get("aliases", {})
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise ConfigError(f"{path}: [images.aliases] must map image names to image names")
        aliases.update(table)
    aliases.update(parse_alias(item) for item in cli)
    return aliases


def rewrite_from(dockerfile: str, aliases: Mapping[str, str], present: Callable[[str], bool]) -> str:
    """Rewrite each ``FROM image`` whose image is absent (``present`` says) and has an alias.

    Stage names (``FROM build``, where ``build`` is an earlier ``AS build``) and images that are
    present are left alone; flags such as ``--platform`` and the ``AS name`` suffix are kept."""
    stages: set[str] = set()
    lines = []
    for line in dockerfile.splitlines(keepends=True):
        match = _FROM.match(line)
        if match:
            head, flags, image, rest = match.groups()
            stage = re.search(r"\bAS\s+(\S+)", rest, re.IGNORECASE)
            if image.lower() not in stages and image in aliases and not present(image):
                line = f"{head}{flags}{aliases[image]}{rest}" + ("\n" if line.endswith("\n") else "")
            if stage:
                stages.add(stage.group(1).lower())
        lines.append(line)
    return "".join(lines)


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile's stages start FROM, in order: not earlier stage names, not scratch."""
    stages: set[str] = set()
    found: list[str] = []
    for line in dockerfile.splitlines():
        match = _FROM.match(line)
        if not match:
            continue
        image, rest = match.group(3), match.group(4)
        if image.lower() not in stages and image != "scratch" and image not in found:
            found.append(image)
        stage = re.search(r"\bAS\s+(\S+)", rest, re.IGNORECASE)
        if stage:
            stages.add(stage.group(1).lower())
    return found


def context_files(context_dir: Path) -> list[Path]:
    """Every file and directory of a build context, sorted, honouring no ignore file but .git."""
    return build_context.context_files(context_dir, skip_git=True)


def _context_entries(context_dir: Path | None) -> list[tuple[Path, str]]:
    """Each context path with its path relative to the context (POSIX); none without a context."""
    if context_dir is None:
        return []
    return [(path, path.relative_to(context_dir).as_posix()) for path in context_files(context_dir)]


def context_digest(context_dir: Path | None, dockerfile_text: str) -> str:
    """SHA-256 (hex, 64 chars) over the Dockerfile's text and the content of the context that is
    sent to the engine (``termgym.images.context.context_digest``, ``.git`` left out)."""
    return dockerfile_digest(build_context.context_digest(context_dir, skip_git=True), dockerfile_text)


def dockerfile_digest(context_sha256: str, dockerfile_text: str) -> str:
    """``context_digest`` from a context's digest, already computed, and a Dockerfile's text."""
    digest = hashlib.sha256(b"termgym-build-1\0")
    for field in (context_sha256.encode(), dockerfile_text.encode()):
        digest.update(len(field).to_bytes(8, "little") + field)
    return digest.hexdigest()


def build_context_tar(context_dir: Path | None, dockerfile_text: str) -> bytes:
    """The build context as a tar, with the (possibly rewritten) Dockerfile at its root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, relative in _context_entries(context_dir):
            if relative == "Dockerfile":
                continue
            archive.add(str(path), arcname=relative, recursive=False)
        data = dockerfile_text.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def task_image_tag(task_name: str, digest: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", task_name.lower()).strip("-._")[-60:] or "task"
    return f"{TASK_IMAGE_REPOSITORY}/{slug}:{digest[:16]}"


@dataclass(frozen=True)
class ImageConfig:
    """The image a container is created from (``tag``) with the environment and working directory
    it defines; ``source`` says where it came from (``docker_image``: the task's named image, or an
    alias of it; ``build``: its Dockerfile, built), ``ref`` the name the task gave or the built tag,
    ``digest`` the image's registry digest (``repo@sha256:...``) when it has one, else its Id;
    ``id`` the engine's image id (``sha256:...``) as inspected, which a re-tag or rebuild changes."""

    tag: str
    env: dict[str, str]
    workdir: str
    source: str = "build"
    ref: str = ""
    digest: str = ""
    id: str = ""
    entrypoint: tuple[str, ...] = ()  # the image's ENTRYPOINT, which every (re)start of its container runs
    user: str = ""  # the image's USER: who the engine's exec runs as unless told otherwise

    def record(self) -> dict[str, str]:
        """What a trial's record says of its image (``Sandbox.image``)."""
        return {"ref": self.ref or self.tag, "source": self.source, "digest": self.digest}


def builds_dockerfile(dockerfile: Path | None, image: str | None, prefer_build: bool) -> bool:
    """Whether a task's environment is built from its Dockerfile rather than run from its
    ``docker_image``: the named image wins, as in Harbor, unless ``--build`` (``prefer_build``)
    asks for the Dockerfile or there is no image; without a Dockerfile nothing is built."""
    return dockerfile is not None and (prefer_build or not image)


def local_only(aliases: Mapping[str, str]) -> set[str]:
    """Images never pulled: the names aliases stand in for and the local images they name."""
    return set(aliases) | set(aliases.values())


_build_locks: dict[str, asyncio.Lock] = {}
_ready: dict[tuple, ImageConfig] = {}


async def ensure_task_image(
    client,
    *,
    name: str,
    context_dir: Path | None,
    dockerfile: Path | None,
    image: str | None,
    aliases: Mapping[str, str],
    timeout: float,
    run: Callable,
    network: bool = False,
    pull: str = "missing",
    prefer_build: bool = False,
    reporter: Callable[[str], Callable[[str | None], None]] = stderr_reporter,
) -> ImageConfig:
    """The image a trial runs (``builds_dockerfile`` decides which): the task's ``docker_image``,
    pulled per the ``pull`` policy (``termgym.images.pull``), or the local image an alias names for
    it (then nothing is pulled); else its Dockerfile built once (tag from the context digest), its
    ``FROM`` bases pulled per the same policy first (never an alias's), with network only when the
    task allows it (``network``), and never the host's. ``run(fn, *args)`` runs a blocking docker-py
    call off the loop. Raises ``EnvironmentBuildError`` in one line naming the image when an image
    is absent and cannot be pulled, with the build output when the build fails."""
    if not builds_dockerfile(dockerfile, image, prefer_build):
        if image is None:
            raise EnvironmentBuildError(f"{name}: the task has neither a Dockerfile nor a docker_image")
        try:
            return await _named_image(client, name, image, aliases, run, pull, reporter)
        except EnvironmentBuildError as exc:
            if dockerfile is None:
                raise
            # The task ships a Dockerfile too: building it is the third way out.
            raise EnvironmentBuildError(f"{exc}, or build the task's Dockerfile (--build)", log=exc.log) from None
    assert dockerfile is not None
    original = dockerfile.read_text(encoding="utf-8", errors="replace")
    contents = build_context.context_digest(context_dir, skip_git=True)  # read once per trial
    key = (dockerfile_digest(contents, original), tuple(sorted(aliases.items())))
    if key in _ready:  # built or found earlier in this process: no engine round trips
        return _ready[key]
    text = rewrite_from(original, aliases, lambda ref: _image_present(client, ref))
    tag = task_image_tag(name, dockerfile_digest(contents, text))
    lock = _build_locks.setdefault(tag, asyncio.Lock())
    async with lock:
        if not await run(_image_present, client, tag):
            # The build itself never pulls: its bases are made present here, per the policy.
            for base in base_images(text):
                if base in local_only(aliases):
                    if not await run(_image_present, client, base):
                        raise EnvironmentBuildError(
                            f"{dockerfile}: base image {base} is not present (it is a local image an alias names); "
                            f"build it first or change the alias (--image-alias NAME={base})"
                        )
                    continue
                await ensure_pulled(
                    client, base, policy=pull, what=str(dockerfile), present=_image_present, run=run, reporter=reporter
                )
            mode = await run(build_network, client, network)
            await run(_build, client, tag, build_context_tar(context_dir, text), timeout, dockerfile, mode)
        _ready[key] = await run(_image_config, client, tag, "build", tag)
    return _ready[key]


async def _named_image(
    client,
    name: str,
    image: str,
    aliases: Mapping[str, str],
    run: Callable,
    pull: str,
    reporter: Callable[[str], Callable[[str | None], None]],
) -> ImageConfig:
    """A task's ``docker_image``: when an alias names a stand-in, the image itself if present, else
    the stand-in, never pulled; otherwise the image per the pull policy."""
    if image in aliases:
        tag = image if await run(_image_present, client, image) else aliases[image]
        if not await run(_image_present, client, tag):
            raise EnvironmentBuildError(
                f"{name}: image {image} and its alias {tag} are not present (an alias is never pulled); "
                f"build or load {tag} first"
            )
        return await run(_image_config, client, tag, "docker_image", image)
    await ensure_pulled(client, image, policy=pull, what=name, present=_image_present, run=run, reporter=reporter)
    return await run(_image_config, client, image, "docker_image", image)


def _image_present(client, ref: str) -> bool:
    import docker.errors

    try:
        client.api.inspect_image(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def _image_config(client, tag: str, source: str = "build", ref: str = "") -> ImageConfig:
    info = client.api.inspect_image(tag)
    config = info.get("Config") or {}
    env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
    return ImageConfig(
        tag=tag,
        env=env,
        workdir=config.get("WorkingDir") or "/",
        source=source,
        ref=ref or tag,
        digest=image_digest(info, ref or tag),
        id=str(info.get("Id") or ""),
        entrypoint=tuple(str(word) for word in config.get("Entrypoint") or ()),
        user=str(config.get("User") or ""),
    )


def image_digest(info: Mapping[str, Any], ref: str) -> str:
    """An inspected image's registry digest for ``ref``'s repository (``repo@sha256:...``), else
    its first registry digest, else its Id (a local build has no registry digest)."""
    digests = [str(d) for d in info.get("RepoDigests") or []]
    repository = _repository(ref)
    for digest in digests:
        if digest.partition("@")[0] == repository:
            return digest
    return digests[0] if digests else str(info.get("Id") or "")


def _repository(ref: str) -> str:
    """``host:port/name:tag`` or ``name@sha256:...`` to its repository (``host:port/name``)."""
    ref = ref.partition("@")[0]
    head, sep, tail = ref.rpartition(":")
    return head if sep and "/" not in tail else ref


def build_network(client, network: bool) -> str:
    """The network a build's RUN steps get: ``none`` unless the task allows network, then the
    engine's bridge (``none`` when it has no bridge: such a step then fails in the build log)."""
    if network and client.api.networks(names=["bridge"]):
        return "bridge"
    return "none"


def _build(client, tag: str, context: bytes, timeout: float, dockerfile: Path, network_mode: str) -> None:
    import docker.errors

    log: list[str] = []
    try:
        stream = client.api.build(
            fileobj=io.BytesIO(context),
            custom_context=True,
            tag=tag,
            rm=True,
            forcerm=True,
            pull=False,
            network_mode=network_mode,
            decode=True,
            timeout=timeout,
            labels={"termgym": "1"},
        )
        for chunk in stream:
            if "stream" in chunk:
                log.append(chunk["stream"])
            if "error" in chunk:
                log.append(chunk["error"] + "\n")
                last = " ".join(chunk["error"].split())[-300:] or "build failed"
                raise EnvironmentBuildError(f"{dockerfile}: docker build failed: {last}", log="".join(log))
    except docker.errors.DockerException as exc:
        raise EnvironmentBuildError(
            f"{dockerfile}: docker build failed: {' '.join(str(exc).split())[:300]}", log="".join(log)
        ) from exc


def bootstrap_base_image(client, *, tag: str = BASE_IMAGE, suite: str = "bookworm", force: bool = False) -> bool:
    """Build ``tag`` from ``debootstrap --variant=minbase SUITE`` and import it; False if it was
    already there (and not ``force``). Needs root and debootstrap, and the Debian mirror."""
    if not force and _image_present(client, tag):
        return False
    with tempfile.TemporaryDirectory(prefix="termgym-rootfs-") as scratch:
        root = Path(scratch) / "rootfs"
        result = subprocess.run(["debootstrap", "--variant=minbase", suite, str(root)], capture_output=True, text=True)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise EnvironmentBuildError(f"debootstrap {suite} failed: {tail[0]}", log=result.stdout + result.stderr)
        archive = Path(scratch) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(archive), "."], check=True)
        repository, _, version = tag.rpartition(":")
        client.api.import_image_from_file(str(archive), repository=repository, tag=version)
    return True
