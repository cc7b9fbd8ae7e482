"""The pod-field scenarios of tests/e2e/test_podfields.py on the real node, with this directory's `e2e` fixture;
all but the /dev/shm size, which the 1.20 kubelet does not apply (SizeMemoryBackedVolumes is alpha there)."""
from __future__ import annotations

import pytest

from tests.e2e.test_podfields import (  # noqa: F401  (the scenarios and their module-scoped fixture)
    ran, test_init_is_refused_where_restricted_is_enforced, test_init_pre_post_and_the_pods_own_fields_run,
)

pytestmark = [pytest.mark.realnode, pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(300)]
