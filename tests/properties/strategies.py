"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

#: Text PostgreSQL can store: any code point except NUL and lone surrogates.
storable_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))

#: Integers at and around every edge pybatch cares about, plus arbitrary ones.
edge_integers = st.one_of(
    st.sampled_from(
        [0, 1, -1, 2**31 - 1, -(2**31), 2**53, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64]
    ),
    st.integers(min_value=-(10**300), max_value=10**300),
)

#: Finite floats, the subnormal and huge ones included (numeric prints them in plain notation).
finite_floats = st.floats(allow_nan=False, allow_infinity=False).filter(math.isfinite)

json_scalars = st.one_of(st.none(), st.booleans(), edge_integers, finite_floats, storable_text)

json_documents: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(storable_text, children, max_size=5),
    ),
    max_leaves=30,
)

json_objects = st.dictionaries(storable_text, json_documents, max_size=6)

#: Anything at all, for "no exception outside the hierarchy escapes".
anything: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.decimals(),
        st.text(),
        st.binary(),
        st.complex_numbers(),
        st.just(object()),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.frozensets(st.integers(), max_size=3),
        st.dictionaries(st.one_of(st.text(), st.integers(), st.none()), children, max_size=4),
    ),
    max_leaves=20,
)
