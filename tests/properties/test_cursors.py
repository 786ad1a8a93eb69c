"""Explorer cursors: no forged, altered or truncated cursor is accepted.

A cursor that pybatch issued opens to exactly its key and ceiling for its own query and
binding. Anything else, random bytes, random text, a cursor with one byte changed or cut
short, is refused with `CursorInvalid`; an intact cursor shown to another query, filter or
page size is `CursorQueryMismatch`. No other exception ever comes out.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pybatch.errors import CursorInvalid, CursorQueryMismatch
from pybatch.values.explorer import (
    Cursor,
    CursorKey,
    ExplorerQuery,
    IdentityKey,
    NameKey,
    OrderedKey,
    PageSize,
    query_binding,
)

I63 = st.integers(min_value=0, max_value=2**63 - 1)
NAMES = st.text(min_size=1, max_size=40).filter(lambda n: 1 <= len(n.encode()) <= 128)


@st.composite
def issued(draw: st.DrawFn) -> tuple[ExplorerQuery, CursorKey, int, bytes, Cursor]:
    """A cursor pybatch would issue, with what it was issued for."""
    query = draw(st.sampled_from(list(ExplorerQuery)))
    kind = query.key_kind
    key: CursorKey
    if kind is IdentityKey:
        key = IdentityKey(draw(I63))
    elif kind is OrderedKey:
        key = OrderedKey(draw(I63), draw(I63))
    else:
        key = NameKey(draw(NAMES))
    ceiling = draw(I63)
    page = PageSize(draw(st.integers(min_value=1, max_value=500)))
    binding = query_binding(query, page, draw(st.none() | st.integers(1, 10**6) | NAMES))
    return query, key, ceiling, binding, Cursor.issue(query, key, ceiling, binding)


@given(issued())
def test_an_issued_cursor_opens_to_its_key_and_ceiling(
    case: tuple[ExplorerQuery, CursorKey, int, bytes, Cursor],
) -> None:
    query, key, ceiling, binding, cursor = case
    assert Cursor.from_hex(str(cursor)).open(query, binding) == (key, ceiling)


@given(issued(), st.data())
def test_one_changed_byte_is_refused(
    case: tuple[ExplorerQuery, CursorKey, int, bytes, Cursor], data: st.DataObject
) -> None:
    query, _key, _ceiling, binding, cursor = case
    raw = bytearray(cursor.data)
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= data.draw(st.integers(1, 255))
    try:
        Cursor(bytes(raw)).open(query, binding)
    except CursorInvalid:
        return
    raise AssertionError("an altered cursor was accepted")


@given(issued(), st.data())
def test_a_truncated_or_extended_cursor_is_refused(
    case: tuple[ExplorerQuery, CursorKey, int, bytes, Cursor], data: st.DataObject
) -> None:
    query, _key, _ceiling, binding, cursor = case
    cut = data.draw(st.integers(1, len(cursor.data) - 1))
    for forged in (cursor.data[:cut], cursor.data + data.draw(st.binary(min_size=1, max_size=8))):
        if len(forged) > 256:
            continue
        try:
            Cursor(forged).open(query, binding)
        except CursorInvalid:
            continue
        raise AssertionError("a truncated or extended cursor was accepted")


@given(issued(), st.sampled_from(list(ExplorerQuery)), st.binary(min_size=8, max_size=8))
def test_an_intact_cursor_of_another_query_or_binding_is_a_mismatch(
    case: tuple[ExplorerQuery, CursorKey, int, bytes, Cursor],
    other_query: ExplorerQuery,
    other_binding: bytes,
) -> None:
    query, _key, _ceiling, binding, cursor = case
    if other_query is query and other_binding == binding:
        return
    try:
        cursor.open(other_query, other_binding)
    except (CursorQueryMismatch, CursorInvalid):  # another key kind is CursorInvalid
        return
    raise AssertionError("a cursor was accepted by another query or binding")


@given(st.binary(max_size=300), st.sampled_from(list(ExplorerQuery)))
def test_random_bytes_never_open(data: bytes, query: ExplorerQuery) -> None:
    try:
        Cursor(data).open(query, bytes(8))
    except CursorInvalid:
        return
    raise AssertionError("random bytes opened as a cursor")


@given(st.text(max_size=600))
def test_random_text_is_a_cursor_or_cursor_invalid(text: str) -> None:
    try:
        cursor = Cursor.from_hex(text)
    except CursorInvalid:
        return
    assert str(cursor) == text
