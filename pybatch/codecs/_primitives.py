"""Strict decoding primitives, canonical JSON and SHA-256 (schema.md 3.1-3.5; behaviour.md 6.3).

Everything here is stdlib-only so that values can hash canonical JSON without importing the
driver. Decoders refuse anything unexpected with `DecodeError`, which names the column and
never the value; the unit of work maps it to `Unavailable` in one place.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
import hashlib
import json
import math
from collections.abc import Mapping
from typing import TypeVar

from pybatch.errors import JsonNotEncodable

__all__ = [
    "INT64_MAX",
    "MAX_NUMBER_DIGITS",
    "DecodeError",
    "canonical_json",
    "decode_aware",
    "decode_digest",
    "decode_enum",
    "decode_int64",
    "decode_json_object",
    "decode_optional_aware",
    "decode_optional_int64",
    "decode_text",
    "numeric_text",
    "sha256",
]

#: Largest value a PostgreSQL bigint holds; the storage bound of ids, versions and counters.
INT64_MAX = 2**63 - 1

#: Most digits a JSON number may have: Python's default int/str conversion limit, so a number
#: written to jsonb can always be read back (json.loads refuses longer integers).
MAX_NUMBER_DIGITS = 4300

_E = TypeVar("_E", bound=enum.Enum)


class DecodeError(Exception):
    """A stored column could not be decoded; names the column only, so row values never leak."""

    def __init__(self, column: str) -> None:
        super().__init__(f"stored column {column!r} could not be decoded")
        self.column = column

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str]]:
        return (DecodeError, (self.column,))


# --------------------------------------------------------------------------- canonical JSON


def canonical_json(value: object) -> bytes:
    """Encode `value` as canonical JSON bytes, the only form pybatch hashes (rule 24).

    The form is `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    allow_nan=False)` except for non-integral numbers: a float (or Decimal) is written in the
    plain positional notation PostgreSQL's `numeric` prints for it (`1e16` ->
    `10000000000000000`, `1e-7` -> `0.0000001`, `-0.0` -> `0.0`), so a document hashes to the
    same bytes before it is written to `jsonb` and after it is read back (schema.md 3.5).

    Raises:
        JsonNotEncodable: NaN or infinity, a number of more than 4,300 digits, a non-string
            key, a value that is not JSON, text that is not UTF-8 encodable or holds a NUL
            (PostgreSQL text and jsonb cannot store U+0000), or nesting too deep to encode.
    """
    parts: list[str] = []
    try:
        _write(value, parts)
    except RecursionError:
        raise JsonNotEncodable(reason="nesting too deep") from None
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError:
        raise JsonNotEncodable(reason="text is not UTF-8 encodable") from None


def numeric_text(value: float | decimal.Decimal) -> str:
    """Write a finite number the way PostgreSQL `numeric` prints it (plain notation, no -0)."""
    number = decimal.Decimal(repr(value)) if isinstance(value, float) else value
    if not number.is_finite():
        raise JsonNotEncodable(reason="NaN or infinity")
    if number.is_zero():
        number = abs(number)  # numeric has no negative zero: -0.0 reads back as 0.0
    return format(number, "f")


# What json.dumps(s, ensure_ascii=False) returns for a str, without building an encoder per
# string: the same escapes (quote, backslash, control characters), UTF-8 kept as is.
_encode_string = json.encoder.encode_basestring


def _write(value: object, parts: list[str]) -> None:
    # bool before int: True is an int in Python but a JSON literal here.
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, int):
        if value.bit_length() > _MAX_INT_BITS:
            raise JsonNotEncodable(reason=f"a number has more than {MAX_NUMBER_DIGITS} digits")
        try:
            text = int.__repr__(value)
        except ValueError:  # above a lowered sys.get_int_max_str_digits()
            raise JsonNotEncodable(reason="integer too large") from None
        if value.bit_length() > _SHORT_INT_BITS:
            _check_digits(text)
        parts.append(text)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise JsonNotEncodable(reason="NaN or infinity")
        parts.append(numeric_text(value))  # at most ~330 digits
    elif isinstance(value, decimal.Decimal):
        if value.is_finite() and value.adjusted() > MAX_NUMBER_DIGITS:
            raise JsonNotEncodable(reason=f"a number has more than {MAX_NUMBER_DIGITS} digits")
        parts.append(_check_digits(numeric_text(value)))
    elif isinstance(value, str):
        if "\x00" in value:
            raise JsonNotEncodable(reason="text contains NUL")
        parts.append(_encode_string(value))
    elif isinstance(value, Mapping):
        _write_object(value, parts)
    elif isinstance(value, list | tuple):
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    else:
        raise JsonNotEncodable(reason="value is not JSON")


# An int of more bits has more than MAX_NUMBER_DIGITS digits (checked before formatting it,
# which would be slow and raise ValueError at sys.get_int_max_str_digits()).
_MAX_INT_BITS = math.ceil(MAX_NUMBER_DIGITS * math.log2(10)) + 1
# An int of at most this many bits has fewer than MAX_NUMBER_DIGITS digits: no count needed.
_SHORT_INT_BITS = math.floor((MAX_NUMBER_DIGITS - 1) * math.log2(10))


def _check_digits(text: str) -> str:
    if sum(character.isdigit() for character in text) > MAX_NUMBER_DIGITS:
        raise JsonNotEncodable(reason=f"a number has more than {MAX_NUMBER_DIGITS} digits")
    return text


def _write_object(value: Mapping[object, object], parts: list[str]) -> None:
    keys: list[str] = []
    for key in value:
        if not isinstance(key, str):
            raise JsonNotEncodable(reason="object key is not a string")
        if "\x00" in key:
            raise JsonNotEncodable(reason="text contains NUL")
        keys.append(key)
    keys.sort()  # code-point order, which equals UTF-8 byte order
    parts.append("{")
    for index, key in enumerate(keys):
        if index:
            parts.append(",")
        parts.append(_encode_string(key))
        parts.append(":")
        _write(value[key], parts)
    parts.append("}")


def sha256(data: bytes) -> bytes:
    """Return the 32-byte SHA-256 digest of `data`."""
    return hashlib.sha256(data).digest()


# --------------------------------------------------------------------------- column decoders


def decode_enum(enum_cls: type[_E], value: object, *, column: str) -> _E:
    """Decode a stored code into `enum_cls`, refusing unknown or non-text codes (rule 6.3)."""
    if type(value) is not str:
        raise DecodeError(column)
    for member in enum_cls:
        if member.value == value:
            return member
    raise DecodeError(column)


def decode_int64(value: object, *, column: str, minimum: int) -> int:
    """Decode a bigint column that must lie in `minimum..2^63-1`; bool is never an int."""
    if type(value) is not int or not minimum <= value <= INT64_MAX:
        raise DecodeError(column)
    return value


def decode_optional_int64(value: object, *, column: str, minimum: int) -> int | None:
    """Decode a nullable bigint column (see `decode_int64`)."""
    if value is None:
        return None
    return decode_int64(value, column=column, minimum=minimum)


def decode_aware(value: object, *, column: str) -> _dt.datetime:
    """Decode a timestamptz column into an aware datetime in UTC; naive values are refused."""
    if not isinstance(value, _dt.datetime) or value.tzinfo is None:
        raise DecodeError(column)
    if value.utcoffset() is None:
        raise DecodeError(column)
    return value.astimezone(_dt.UTC)


def decode_optional_aware(value: object, *, column: str) -> _dt.datetime | None:
    """Decode a nullable timestamptz column (see `decode_aware`)."""
    if value is None:
        return None
    return decode_aware(value, column=column)


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
    if not isinstance(value, dict):
        raise DecodeError(column)
    for key in value:
        if type(key) is not str:
            raise DecodeError(column)
    return value
