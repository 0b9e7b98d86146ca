"""Fixtures of the benchmark tests: the bundled model's tokenizer (the root conftest opens the model source)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer(smol_source):  # type: ignore[no-untyped-def]
    return smol_source.tokenizer
