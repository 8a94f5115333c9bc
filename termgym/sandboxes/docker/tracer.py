"""The tracer a container runs its verifier under: this host's ``strace`` with the libraries it
needs and its own dynamic loader (``termgym.sandboxes.host_kit``), as one archive put into each
container (``bundle``), run by that loader so that nothing of the container's is loaded into the
tracer (``tracer_argv``). None where the host has no ``strace`` (the verification then assumes
the worst of every change, and says so).
"""

from __future__ import annotations

from termgym.sandboxes import host_kit
from termgym.sandboxes.host_kit import UNTRACED

__all__ = ["UNTRACED", "bundle", "tracer_argv"]


def bundle() -> bytes | None:
    """A tar archive of ``strace``, ``ld.so`` and ``lib/*`` (root's, mode 0755), or None."""
    return host_kit.bundle(("strace",))


def tracer_argv(directory: str) -> list[str]:
    """The tracer's command line up to its options, for a bundle unpacked at ``directory``."""
    return host_kit.kit_argv(directory, "strace")
