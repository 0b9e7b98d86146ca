"""Registers this folder's plugin with frame for the test session, so its tests run before it is built."""

from pathlib import Path

import pytest
from frame.testing.registration import register_source_tree


def pytest_configure(config: pytest.Config) -> None:
    config.add_cleanup(register_source_tree(Path(__file__).resolve().parents[1]))
