"""`broken_rule(family, rule)`: pytest.raises for a text-rule error that also checks the rule."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest

from pybatch.errors import PyBatchError, TextRule

E = TypeVar("E", bound=PyBatchError)


@contextmanager
def broken_rule(family: type[E], rule: TextRule) -> Iterator[pytest.ExceptionInfo[E]]:
    """Expect `family` raised for exactly `rule` (every text-rule error has a `rule` field)."""
    with pytest.raises(family) as caught:
        yield caught
    assert getattr(caught.value, "rule", None) is rule, caught.value
