"""What the Docker backend reads from an engine's reports (pure parts of ``docker.engine``)."""

from __future__ import annotations

import pytest

from termgym.sandboxes.docker.engine import Dialect, unenforced_limits

ROOTLESS = {"rootless": True}


@pytest.mark.parametrize(
    ("host", "unenforced"),
    [
        ({"security": {"rootless": False}, "cgroupVersion": "v1", "cgroupControllers": []}, ()),
        ({"security": {"rootless": False}, "cgroupVersion": "v2", "cgroupControllers": []}, ()),
        ({}, ()),  # no report: taken to enforce what it is given
        ({"security": ROOTLESS, "cgroupVersion": "v1", "cgroupControllers": []}, ("memory", "pids", "cpu", "storage")),
        (
            {"security": ROOTLESS, "cgroupVersion": "v1", "cgroupControllers": ["memory"]},
            ("memory", "pids", "cpu", "storage"),
        ),
        ({"security": ROOTLESS, "cgroupVersion": "v2", "cgroupControllers": ["memory", "pids", "cpu"]}, ("storage",)),
        ({"security": ROOTLESS, "cgroupVersion": "v2", "cgroupControllers": ["memory", "pids"]}, ("cpu", "storage")),
        ({"security": ROOTLESS, "cgroupVersion": "v2"}, ("memory", "pids", "cpu", "storage")),
    ],
)
def test_the_limits_a_podman_host_ignores(host, unenforced):
    assert unenforced_limits(host) == unenforced


def test_each_ignored_limit_is_one_warning_in_the_embedded_backends_words():
    warnings = Dialect(podman=True, unenforced=("storage", "memory", "cpu")).limit_warnings()
    assert [warning.split(":")[0] for warning in warnings] == [
        "memory limit not enforced",
        "CPU limit not enforced",
        "storage limit not enforced",
    ]
    assert Dialect().limit_warnings() == []
