"""The harness tests the PostgreSQL major its tox environment names."""

from __future__ import annotations

import os
from typing import Any

from tests.support import pg_harness


def test_server_is_the_major_this_environment_names(postgresql_proc: Any) -> None:
    """A wrong PG_BINDIR must fail the run instead of testing PostgreSQL 15 six times."""
    major = pg_harness.check_executor_major(postgresql_proc)
    expected = os.environ.get("PYBATCH_EXPECTED_PG_MAJOR")
    if expected:
        assert major == int(expected)
    assert 13 <= major <= 18
