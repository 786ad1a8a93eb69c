"""Canonical JSON and SHA-256, the domain's hashing primitives (stdlib only, no driver)."""

from __future__ import annotations

import decimal
import hashlib
import json
import math
import struct
from collections.abc import Mapping
from typing import NoReturn

from pybatch.errors import JsonNotEncodable

#: Most digits a JSON number may have: Python's default int/str conversion limit, so a number
#: written to jsonb can always be read back (json.loads refuses longer integers).
MAX_NUMBER_DIGITS = 4300


def canonical_json(value: object, *, decimals: bool = True) -> bytes:
    """Encode `value` as canonical JSON bytes, the only form pybatch hashes.

    Sorted keys, no spaces, UTF-8; non-integral numbers in the positional notation `numeric`
    prints (`1e16` -> `10000000000000000`), so a document hashes the same after a jsonb round
    trip. What jsonb cannot hold back identically (NaN, NUL, a non-string key; a Decimal unless
    `decimals`) is JsonNotEncodable.
    """
    if type(value) is dict and all(map(_flat_member, value.items())):
        text = _FLAT.encode(value)  # what _write writes, in C
    else:
        parts: list[str] = []
        try:
            _write(value, parts, decimals=decimals)
        except RecursionError:
            raise JsonNotEncodable(reason="nesting too deep") from None
        text = "".join(parts)
    try:
        return text.encode("utf-8")
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

#: The C encoder writes a flat object of text, small ints, bools and nulls as _write does
#: (sorted keys, no spaces, the same escapes, int.__repr__): a checkpoint such as {"offset": n}.
_FLAT = json.JSONEncoder(
    ensure_ascii=False, check_circular=False, sort_keys=True, separators=(",", ":")
)


def _flat_member(item: tuple[object, object]) -> bool:
    """A member the C encoder writes as _write does: a text key, a plain value, no NUL."""
    key, value = item
    if type(key) is not str or "\x00" in key:
        return False
    if type(value) is str:
        return "\x00" not in value
    if type(value) is int:
        return value.bit_length() <= _SHORT_INT_BITS
    return value is None or type(value) is bool


def _write(value: object, parts: list[str], *, decimals: bool) -> None:
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
        if not decimals:
            raise JsonNotEncodable(reason="a Decimal would read back as a float")
        if value.is_finite() and value.adjusted() > MAX_NUMBER_DIGITS:
            raise JsonNotEncodable(reason=f"a number has more than {MAX_NUMBER_DIGITS} digits")
        parts.append(_check_digits(numeric_text(value)))
    elif isinstance(value, str):
        if "\x00" in value:
            raise JsonNotEncodable(reason="text contains NUL")
        parts.append(_encode_string(value))
    elif isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise JsonNotEncodable(reason="object key is not a string")
            if "\x00" in key:
                raise JsonNotEncodable(reason="text contains NUL")
        parts.append("{")
        for index, key in enumerate(sorted(value)):  # code-point order, which equals UTF-8's
            parts.append(f",{_encode_string(key)}:" if index else f"{_encode_string(key)}:")
            _write(value[key], parts, decimals=decimals)
        parts.append("}")
    elif isinstance(value, list | tuple):
        parts.append("[")
        for index, item in enumerate(value):
            parts.append("," if index else "")
            _write(item, parts, decimals=decimals)
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


def reject_constant(name: str) -> NoReturn:
    """A json.loads `parse_constant` that refuses NaN and infinity, which are not JSON."""
    raise ValueError("NaN and infinity are not JSON")


def sha256(data: bytes) -> bytes:
    """Return the 32-byte SHA-256 digest of `data`."""
    return hashlib.sha256(data).digest()


class CanonicalWriter:
    """Length-prefixed fields and big-endian u64s (request, plan digests): lists never collide."""

    def __init__(self, tag: str, *texts: str) -> None:
        self._parts: list[bytes] = []
        self.text(tag, *texts)

    def bytes_(self, value: bytes) -> None:
        """A length-prefixed byte string."""
        self._parts.append(struct.pack(">Q", len(value)) + value)

    def text(self, *values: str) -> None:
        """Length-prefixed UTF-8 strings, in order."""
        for value in values:
            self.bytes_(value.encode("utf-8"))

    def u64(self, value: int) -> None:
        """A big-endian u64."""
        self._parts.append(struct.pack(">Q", value))

    def optional_u64(self, value: int | None) -> None:
        """0x00 for None, else 0x01 and the u64."""
        self._parts.append(b"\x00" if value is None else b"\x01" + struct.pack(">Q", value))

    def raw(self, data: bytes) -> None:
        """Bytes that carry their own framing."""
        self._parts.append(data)

    def digest(self) -> bytes:
        """SHA-256 of everything written."""
        return sha256(b"".join(self._parts))
