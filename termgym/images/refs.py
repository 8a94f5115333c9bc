"""Image references as the embedded backend reads them, and OCI image configurations. Pure.

A task names an image the way Docker does (``ubuntu:24.04``, ``ghcr.io/org/tool@sha256:...``,
``127.0.0.1:5000/team/base:1``), or, for an image that is not in a registry, with one of
skopeo's transports: ``oci:DIR[:TAG]`` (an OCI layout), ``oci-archive:FILE[:TAG]``,
``docker-archive:FILE[:REF]`` (what ``docker save`` writes) or ``docker-daemon:REF`` (a local
Docker engine). ``parse_image`` turns either into an ``ImageSource``; a Docker name is normalized
as Docker normalizes it (no registry: ``docker.io``, no namespace there: ``library/``, no tag:
``latest``), so the same name means the same image on every backend.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_REGISTRY = "docker.io"
TRANSPORTS = ("oci", "oci-archive", "docker-archive", "docker-daemon")
# Docker's grammar (distribution/reference), the parts a name is made of.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_DOMAIN = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?")


class ImageRefError(ValueError):
    """A reference that names no image (the message is one line, saying why)."""


@dataclass(frozen=True)
class ImageSource:
    """Where an image comes from: ``transport`` is ``docker`` (a registry) or one of
    ``TRANSPORTS``; ``location`` is what follows the transport in skopeo's syntax; ``registry``
    the registry's host (and port) and ``repository`` the name without tag or digest, for
    ``docker``."""

    transport: str
    location: str
    registry: str = ""
    repository: str = ""  # ``registry/path``, for ``docker``

    @property
    def skopeo(self) -> str:
        """The reference as skopeo takes it."""
        return f"docker://{self.location}" if self.transport == "docker" else f"{self.transport}:{self.location}"

    def pinned(self, digest: str) -> str:
        """The reference as skopeo takes it, naming exactly the manifest ``digest`` (a registry's
        tag may move between two requests); other transports as they are."""
        return f"docker://{self.repository}@{digest}" if self.transport == "docker" else self.skopeo

    @property
    def plain_http(self) -> bool:
        """Whether the registry is on loopback, which Docker reaches without TLS by default (as
        its engine treats 127.0.0.0/8 as an insecure registry): skopeo is told the same."""
        return self.transport == "docker" and is_loopback(self.registry)


def is_loopback(registry: str) -> bool:
    """Whether a registry's ``host[:port]`` is this machine's loopback (``localhost`` included)."""
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 or registry.startswith("[") else registry
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_image(ref: str) -> ImageSource:
    """The source of the image ``ref`` names (the module docstring); ``ImageRefError`` when it
    names none."""
    ref = ref.strip()
    transport, sep, rest = ref.partition(":")
    if sep and transport in TRANSPORTS:
        if not rest:
            raise ImageRefError(f"image {ref!r}: nothing after {transport}:")
        return ImageSource(transport, rest)
    if ref.startswith("docker://"):
        ref = ref.removeprefix("docker://")
    registry, path, tag, digest = split_docker_ref(ref)
    suffix = f"@{digest}" if digest else f":{tag}"
    return ImageSource("docker", f"{registry}/{path}{suffix}", registry, f"{registry}/{path}")


def split_docker_ref(ref: str) -> tuple[str, str, str, str]:
    """``(registry, repository path, tag, digest)`` of a Docker image name, normalized as Docker
    does; the tag is ``latest`` where neither a tag nor a digest is given, "" beside a digest
    without one. ``ImageRefError`` for a name Docker would refuse."""
    if not ref or any(c.isspace() for c in ref):
        raise ImageRefError(f"image {ref!r} is not an image name")
    name, _, digest = ref.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise ImageRefError(f"image {ref!r}: the digest must be sha256: and 64 hex digits")
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise ImageRefError(f"image {ref!r}: {tag!r} is not a tag")
    first, slash, remainder = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        if not _DOMAIN.fullmatch(first):
            raise ImageRefError(f"image {ref!r}: {first!r} is not a registry")
        registry, path = first, remainder
    else:
        registry, path = DEFAULT_REGISTRY, name
        if "/" not in path:
            path = f"library/{path}"
    if not _PATH.fullmatch(path):
        raise ImageRefError(f"image {ref!r}: {path!r} is not a repository name (lower-case letters, digits, . _ - /)")
    if not tag and not digest:
        tag = "latest"
    return registry, path, tag, digest


@dataclass(frozen=True)
class ImageConfig:
    """What an OCI image's configuration says a container runs with: its environment, working
    directory (``/`` when it names none), user, entrypoint and command."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "workdir": self.workdir,
            "user": self.user,
            "entrypoint": list(self.entrypoint),
            "cmd": list(self.cmd),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageConfig:
        return cls(
            env=dict(data.get("env") or {}),
            workdir=str(data.get("workdir") or "/"),
            user=str(data.get("user") or ""),
            entrypoint=tuple(data.get("entrypoint") or ()),
            cmd=tuple(data.get("cmd") or ()),
        )


def image_config(blob: bytes) -> ImageConfig:
    """The ``config`` section of an OCI (or Docker) image configuration blob. ``ValueError`` when
    it is not one."""
    try:
        data = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the image's configuration is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("the image's configuration is not a JSON object")
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ValueError("the image's configuration has no config object")
    env: dict[str, str] = {}
    for item in config.get("Env") or []:
        if isinstance(item, str) and "=" in item:
            key, _, value = item.partition("=")
            env[key] = value
    return ImageConfig(
        env=env,
        workdir=str(config.get("WorkingDir") or "/"),
        user=str(config.get("User") or ""),
        entrypoint=_strings(config.get("Entrypoint")),
        cmd=_strings(config.get("Cmd")),
    )


def _strings(value: object) -> tuple[str, ...]:
    return tuple(str(item) for item in value) if isinstance(value, list) else ()
