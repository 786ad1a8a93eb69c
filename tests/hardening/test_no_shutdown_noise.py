"""No thread-shutdown noise around an error: the pool's worker threads are always waited for."""

from __future__ import annotations

import logging

import pytest

from pybatch import JobRepository
from pybatch.errors import SchemaUninitialized
from tests.conftest import plaintext_config

NOISE = "couldn't stop thread"


def test_a_refused_connect_logs_no_thread_that_could_not_be_stopped(
    blank_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(SchemaUninitialized):
        JobRepository.connect(plaintext_config(blank_database))
    assert not [r for r in caplog.records if NOISE in r.getMessage()]
