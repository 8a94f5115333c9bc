"""The trained chat model, built once per session for every test that serves or decodes it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def trained_chat_model(tmp_path_factory) -> Path:
    """``build_chat_model`` with training (6 to 12 minutes on two cores); ``TERMGYM_TEST_CHAT_MODEL=DIR``
    reuses a directory it wrote, for a developer rerunning the tests."""
    prebuilt = os.environ.get("TERMGYM_TEST_CHAT_MODEL")
    if prebuilt:
        return Path(prebuilt)
    from tests.termgym.agents.chat_model import build_chat_model

    return build_chat_model(tmp_path_factory.mktemp("chat-model"))
