"""Tokenizers of the three families, trained once per session (small vocabularies: under a second
each); the corpus and the renderer configurations the tests run over are in helpers.py."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

from termgym.trainer.tokenizer import train_family_tokenizer
from tests.termgym.agents.renderers.helpers import CORPUS, FORMAT_NAMES


@pytest.fixture(scope="session")
def tokenizers() -> dict[str, Any]:
    return {family: train_family_tokenizer(CORPUS, family, vocab_size=600) for family in FORMAT_NAMES}
