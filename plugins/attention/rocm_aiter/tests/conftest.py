"""Puts the AITER test double in place of ``aiter`` when the real library does not import (any non-ROCm machine).

The double is loaded from this folder's ``aiter_double.py`` and set into ``sys.modules["aiter"]`` for each test
module, then removed, so nothing outside these tests ever sees it. Where real AITER imports, it is used as is.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from frame_attention_rocm_aiter.plugin import aiter_import_error

REAL_AITER_ERROR = aiter_import_error()


def _load_double() -> ModuleType:
    spec = importlib.util.spec_from_file_location("aiter_test_double", Path(__file__).with_name("aiter_double.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def aiter_module():
    """The ``aiter`` the tests run against: the real library, or the test double while these tests run."""
    if REAL_AITER_ERROR is None:
        yield importlib.import_module("aiter")
        return
    with pytest.MonkeyPatch.context() as patch:
        double = _load_double()
        patch.setitem(sys.modules, "aiter", double)
        yield double
