"""Fixtures for the topology tests: a primary with a streaming hot standby (PostgreSQL 15)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pybatch import migrate
from tests.conftest import plaintext_config
from tests.support.standby import StreamingPair, streaming_pair


def migrated_pair(base: Path) -> Iterator[StreamingPair]:
    with streaming_pair(base) as pair:
        migrate(plaintext_config(pair.primary.dsn()))
        pair.wait_for_replay()
        yield pair


@pytest.fixture
def fresh_standby_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamingPair]:
    """A migrated pair of this test's own, for a test that kills or promotes a server."""
    yield from migrated_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def standby_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamingPair]:
    """A migrated pair shared by a module's tests, which must leave both servers running."""
    yield from migrated_pair(tmp_path_factory.mktemp("pair"))
