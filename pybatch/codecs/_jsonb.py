"""The one place codecs wrap documents for psycopg's jsonb dumper (style.md 3.5).

Documents are sent as canonical JSON, so what PostgreSQL parses is exactly what pybatch hashed
(floats already in `numeric`'s plain notation, NaN refused). The wrapper's repr is redacted:
payloads and parameter values must never reach a log through a bound parameter's repr.
"""

from __future__ import annotations

from collections.abc import Mapping

from psycopg.types.json import Jsonb

from pybatch.values._canonical import canonical_json

__all__ = ["CanonicalJsonb", "to_jsonb"]


class CanonicalJsonb(Jsonb):
    """A Jsonb parameter dumped as canonical JSON, with a redacted repr."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CanonicalJsonb(<redacted>)"


def to_jsonb(document: Mapping[str, object]) -> CanonicalJsonb:
    """Wrap a JSON object for binding to a jsonb parameter, dumped as canonical JSON.

    Raises:
        JsonNotEncodable: when psycopg dumps it, if the document is not JSON (NaN, ...).
    """
    return CanonicalJsonb(document, dumps=canonical_json)
