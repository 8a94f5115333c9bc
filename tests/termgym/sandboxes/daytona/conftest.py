"""Fixtures for the Daytona backend: the local API server with the SDK pointed at it and fast
retries (tests/termgym/sandboxes/daytona/helpers.py), and the faults it injects."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.termgym.sandboxes.daytona.helpers import serving_daytona
from tests.termgym.sandboxes.daytona.server import FakeDaytona, Faults


@pytest.fixture
def faults() -> Faults:
    return Faults()


@pytest.fixture
async def daytona(faults: Faults, no_leaks, monkeypatch: pytest.MonkeyPatch, tmp_path) -> AsyncIterator[FakeDaytona]:
    """A running server with the SDK's environment pointed at it; the backend's provider for this
    event loop uses ``fast_settings()``. At the end: no sandbox left on the server or on disk."""
    async with serving_daytona(faults, monkeypatch, tmp_path) as server:
        yield server
