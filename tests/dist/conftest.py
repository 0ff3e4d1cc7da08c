"""Every test under tests/dist spawns gloo ranks: mark them `dist` (select or skip with -m)."""

import os
import sys

import pytest

# the spawned ranks import `_spawn` and the test modules by name.
sys.path.insert(0, os.path.dirname(__file__))


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.dist)
