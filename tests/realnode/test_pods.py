"""Every scenario of the pod-level tier (tests/e2e/test_pods.py) on the real node: the same test functions, with
this directory's `e2e` fixture (conftest.py) in place of the emulated node's."""
from __future__ import annotations

import pytest

from tests.e2e.test_pods import *  # noqa: F403  (the scenarios and their module-scoped `demo` fixture)

pytestmark = [pytest.mark.realnode, pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(300)]
