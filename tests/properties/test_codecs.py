"""Codecs: whatever a row holds, a decoder returns a valid value or raises DecodeError.

DecodeError (mapped to Unavailable in one place) is the only way a decoder may fail: a
corrupt row must fail closed, never leak as TypeError, ValueError or KeyError.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pybatch._codecs import _primitives as p
from pybatch._codecs.steps import decode_checkpoint, decode_context, decode_counts
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import INT64_MAX
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus
from tests.properties.strategies import cells, json_objects


def decodes_or_refuses(decode: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return decode(*args, **kwargs)
    except p.DecodeError as error:
        assert error.column
        return None


@given(cells)
def test_primitive_decoders_return_a_valid_value_or_a_decode_error(cell: Any) -> None:
    status = decodes_or_refuses(p.decode_enum, BatchStatus, cell, column="status")
    assert status is None or isinstance(status, BatchStatus)
    number = decodes_or_refuses(p.decode_int64, cell, column="n", minimum=0)
    assert number is None or (type(number) is int and 0 <= number <= INT64_MAX)
    moment = decodes_or_refuses(p.decode_aware, cell, column="t")
    assert moment is None or (isinstance(moment, dt.datetime) and moment.tzinfo is not None)
    digest = decodes_or_refuses(p.decode_digest, cell, column="d")
    assert digest is None or (isinstance(digest, bytes) and len(digest) == 32)
    text = decodes_or_refuses(p.decode_text, cell, column="s")
    assert text is None or isinstance(text, str)
    document = decodes_or_refuses(p.decode_json_object, cell, column="j")
    assert document is None or isinstance(document, dict)


STATE_COLUMNS = ("format", "schema", "schema_version", "payload")


@given(
    st.fixed_dictionaries(
        {
            "format": st.one_of(st.just(1), cells),
            "schema": st.one_of(st.just("app.v1"), cells),
            "schema_version": st.one_of(st.just(1), cells),
            "payload": st.one_of(json_objects, cells),
        }
    )
)
def test_state_columns_decode_to_a_state_or_a_decode_error(columns: dict[str, Any]) -> None:
    for prefix, decode, cls in (
        ("checkpoint", decode_checkpoint, Checkpoint),
        ("context", decode_context, ExecutionContext),
    ):
        row = {f"{prefix}_{name}": value for name, value in columns.items()}
        state = decodes_or_refuses(decode, row)
        assert state is None or isinstance(state, cls)


@given(st.lists(cells, min_size=6, max_size=6))
def test_counter_columns_decode_to_counts_or_a_decode_error(values: list[Any]) -> None:
    columns = ["read", "processed", "write", "filter", "commit", "rollback"]
    row = {f"{name}_count": value for name, value in zip(columns, values, strict=True)}
    counts = decodes_or_refuses(decode_counts, row)
    assert counts is None or isinstance(counts, ExecutionCounts)
