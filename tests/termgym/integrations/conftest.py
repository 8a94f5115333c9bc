"""Fixtures for the integrations' tests: the local Daytona API server the inspect provider's
Daytona test runs against (made as the Daytona backend's own tests make theirs)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.termgym.sandboxes.daytona.server import FakeDaytona


@pytest.fixture
async def daytona(no_leaks: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[FakeDaytona]:
    """A running local Daytona server, no faults injected, with the SDK's environment pointed at it
    (tests/termgym/sandboxes/daytona/helpers.py's ``serving_daytona``); imported here, not at the
    top, so that only the test that asks for it needs the Daytona SDK."""
    from tests.termgym.sandboxes.daytona.helpers import serving_daytona
    from tests.termgym.sandboxes.daytona.server import Faults

    async with serving_daytona(Faults(), monkeypatch, tmp_path) as server:
        yield server
