"""Every value constructor of `pybatch.values`: whatever it is given, no stray exception.

Each attrs value class is built from arbitrary arguments, of any Python type, for each of
its fields. The only ways out are a value (valid by construction), the contract's typed
error (a PyBatchError), or TypeError / ValueError for a programmer's wrong Python type
(style: attrs validators). An AttributeError, KeyError, OverflowError, RecursionError, ...
would mean a check that crashes instead of refusing.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pybatch.values
from pybatch.errors import PyBatchError
from tests.properties.strategies import anything


def _value_classes() -> list[type[Any]]:
    found: dict[str, type[Any]] = {}
    for module_info in pkgutil.iter_modules(pybatch.values.__path__):
        module = importlib.import_module(f"pybatch.values.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            public = not cls.__name__.startswith("_")  # private bases are never built alone
            if cls.__module__ == module.__name__ and attrs.has(cls) and public:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found)]


VALUE_CLASSES = _value_classes()


def test_the_values_package_has_value_classes() -> None:
    assert len(VALUE_CLASSES) > 40


@pytest.mark.parametrize("cls", VALUE_CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
@given(data=st.data())
def test_a_value_is_built_or_refused_with_a_typed_error(
    cls: type[Any], data: st.DataObject
) -> None:
    fields = [field for field in attrs.fields(cls) if field.init]
    kwargs = {
        (field.alias or field.name): data.draw(anything, label=field.name) for field in fields
    }
    try:
        cls(**kwargs)
    except (PyBatchError, TypeError, ValueError):
        pass
