"""What the Daytona tests share besides fixtures: test-sized retry settings, and the local API
server started with the SDK's environment pointed at it (the ``daytona`` fixtures here and in
tests/termgym/integrations/ are made from it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from termgym.sandboxes.daytona.policy import RetryPolicy
from termgym.sandboxes.daytona.provider import DaytonaSettings, close_providers, get_provider
from tests.termgym.sandboxes.daytona.server import FakeDaytona, Faults

# Test-sized waits: the decisions are the production ones, only the delays are shorter.
FAST_RETRY = RetryPolicy(base_delay=0.05, max_delay=0.4, quota_base_delay=0.1, quota_max_delay=0.4, jitter=0.5)


def fast_settings(**overrides: Any) -> DaytonaSettings:
    values: dict[str, Any] = {"retry": FAST_RETRY, "create_timeout": 20.0, "request_timeout": 20.0, **overrides}
    return DaytonaSettings(**values)


@asynccontextmanager
async def serving_daytona(
    faults: Faults, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[FakeDaytona]:
    """A running server with the SDK's environment pointed at it; the backend's provider for this
    event loop uses ``fast_settings()``. At the end: no sandbox left on the server or on disk."""
    server = await FakeDaytona(faults=faults, workdir=tmp_path / "server").start()
    monkeypatch.setenv("DAYTONA_API_KEY", server.api_key)
    monkeypatch.setenv("DAYTONA_API_URL", server.api_url)
    for name in ("DAYTONA_TARGET", "DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID", "DAYTONA_SERVER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no stray .env file is read
    get_provider(fast_settings())
    try:
        yield server
    finally:
        await close_providers()
        leaked = [s.name for s in server.live()]
        await server.close()
    assert not leaked, f"sandboxes left on the server: {leaked}"
