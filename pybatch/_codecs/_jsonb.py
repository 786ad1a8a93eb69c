"""The one place codecs wrap jsonb documents: the canonical JSON pybatch hashed, repr redacted."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.types.json import Jsonb, set_json_loads

from pybatch._codecs._primitives import DecodeError
from pybatch.values._canonical import canonical_json


def _strict_loads(data: str | bytes) -> Any:
    """json.loads whose failures (a 5,000-digit number, deep nesting) fail closed as DecodeError."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise DecodeError("jsonb") from None


def install_strict_json_loads(conn: psycopg.Connection[Any]) -> None:
    """Read json and jsonb columns on `conn` with `_strict_loads`."""
    set_json_loads(_strict_loads, conn)


class CanonicalJsonb(Jsonb):
    """A Jsonb parameter dumped as canonical JSON, with a redacted repr."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CanonicalJsonb(<redacted>)"


def to_jsonb(document: Mapping[str, object]) -> CanonicalJsonb:
    """Wrap a JSON object for a jsonb parameter; psycopg dumps it as canonical JSON."""
    return CanonicalJsonb(document, dumps=canonical_json)
