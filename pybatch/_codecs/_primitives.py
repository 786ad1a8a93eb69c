"""Strict decoding primitives: `DecodeError` names the column, never the value (-> Unavailable)."""

from __future__ import annotations

import datetime as _dt
import enum
import functools
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

from pybatch.errors import PyBatchError
from pybatch.values.ids import INT64_MAX

#: A result row as the statement loader returns it: column name to driver value.
Row = Mapping[str, object]

_E = TypeVar("_E", bound=enum.Enum)
_T = TypeVar("_T")


class DecodeError(Exception):
    """A stored column could not be decoded; names the column only, so row values never leak."""

    def __init__(self, column: str) -> None:
        super().__init__(f"stored column {column!r} could not be decoded")
        self.column = column

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str]]:
        return (DecodeError, (self.column,))


@functools.cache
def _members_by_code(enum_cls: type[enum.Enum]) -> Mapping[object, enum.Enum]:
    return {member.value: member for member in enum_cls}


def decode_enum(enum_cls: type[_E], value: object, *, column: str) -> _E:
    """Decode a stored code into `enum_cls`, refusing unknown or non-text codes."""
    member = _members_by_code(enum_cls).get(value) if type(value) is str else None
    if member is None:
        raise DecodeError(column)
    return cast(_E, member)


def decode_int64(value: object, *, column: str, minimum: int) -> int:
    """Decode a bigint column that must lie in `minimum..2^63-1`; bool is never an int."""
    if type(value) is not int or not minimum <= value <= INT64_MAX:
        raise DecodeError(column)
    return value


def decode_aware(value: object, *, column: str) -> _dt.datetime:
    """Decode a timestamptz column into an aware datetime in UTC; naive values are refused."""
    if not isinstance(value, _dt.datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise DecodeError(column)
    try:
        return value.astimezone(_dt.UTC)
    except OverflowError:  # 0001-01-01 at a positive offset has no UTC datetime
        raise DecodeError(column) from None


def decode_digest(value: object, *, column: str, length: int = 32) -> bytes:
    """Decode a bytea column that must hold exactly `length` bytes."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise DecodeError(column)
    data = bytes(value)
    if len(data) != length:
        raise DecodeError(column)
    return data


def decode_text(value: object, *, column: str) -> str:
    """Decode a text column that must be a (non-null) str."""
    if type(value) is not str:
        raise DecodeError(column)
    return value


def decode_json_object(value: object, *, column: str) -> dict[str, object]:
    """Decode a jsonb column that must hold a JSON object with string keys."""
    if not isinstance(value, dict) or any(type(key) is not str for key in value):
        raise DecodeError(column)
    return value


def decode_text_value(factory: Callable[[str], _T], value: object, *, column: str) -> _T:
    """Build a validated text value (a name, a code) from a text column; refused is DecodeError."""
    text = decode_text(value, column=column)
    try:
        return factory(text)
    except PyBatchError:
        raise DecodeError(column) from None


# Row readers: each reads `row[column]` and names that same column in its DecodeError, so a
# decoder says once which column it reads.


def int64_at(row: Row, column: str, minimum: int = 1) -> int:
    """`decode_int64` of `row[column]` (an id by default: minimum 1)."""
    return decode_int64(row[column], column=column, minimum=minimum)


def optional_int64_at(row: Row, column: str, minimum: int = 1) -> int | None:
    value = row[column]
    return None if value is None else decode_int64(value, column=column, minimum=minimum)


def text_at(row: Row, column: str) -> str:
    return decode_text(row[column], column=column)


def bool_at(row: Row, column: str) -> bool:
    """A boolean column that must be a (non-null) bool."""
    value = row[column]
    if type(value) is not bool:
        raise DecodeError(column)
    return value


def aware_at(row: Row, column: str) -> _dt.datetime:
    return decode_aware(row[column], column=column)


def optional_aware_at(row: Row, column: str) -> _dt.datetime | None:
    value = row[column]
    return None if value is None else decode_aware(value, column=column)


def digest_at(row: Row, column: str) -> bytes:
    return decode_digest(row[column], column=column)


def enum_at(enum_cls: type[_E], row: Row, column: str) -> _E:
    return decode_enum(enum_cls, row[column], column=column)


def optional_enum_at(enum_cls: type[_E], row: Row, column: str) -> _E | None:
    value = row[column]
    return None if value is None else decode_enum(enum_cls, value, column=column)


def text_value_at(factory: Callable[[str], _T], row: Row, column: str) -> _T:
    return decode_text_value(factory, row[column], column=column)


def row_columns(row: Row, columns: tuple[str, ...]) -> dict[str, object]:
    """Read exactly `columns` with `row[column]` (a missing column is a KeyError: a bug)."""
    return {column: row[column] for column in columns}


def returned(row: Row | None) -> Row:
    """The row of a statement that always returns one; no row means it did not do its work."""
    if row is None:
        raise DecodeError("row")
    return row
