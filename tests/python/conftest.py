"""pytest setup of the Python tests: the binding from this repository's python/ directory, and
one clattn.Context for the session (CLATTN_DEVICE picks the device, CLATTN_LIBRARY the library;
ci/test.sh sets both).

    /usr/bin/python3 -m pytest tests/python [-k NAME]"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import clattn  # noqa: E402  (needs the path above)


@pytest.fixture(scope="session")
def ctx():
    """The device context every parity test shares, closed when the session ends."""
    context = clattn.Context()
    yield context
    context.close()
