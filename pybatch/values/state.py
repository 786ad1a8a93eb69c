"""Checkpoint and ExecutionContext envelopes, bounded and versioned.

An envelope is `{"format", "format_version": 1, "schema", "schema_version", "payload": {..}}`;
the payload is kept as canonical JSON, so its digest survives a `jsonb` round trip.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeAlias, TypeVar, cast

import attrs

from pybatch import errors as e
from pybatch.values._canonical import canonical_json, sha256
from pybatch.values.names import StateSchemaId

STATE_FORMAT_VERSION = 1  # The only envelope format version.
#: Schema of the empty state of new steps and every job execution's context. The older name
#: stays: stored envelopes and checksums carry it (`pybatch show` prints it as "empty").
EMPTY_STATE_SCHEMA = StateSchemaId("oxide_batch.empty.v1")

#: The largest schema version the `*_schema_version` columns (integer) hold; a version above it
#: is a valid u32 that pybatch refuses to store (StateSchemaVersionNotStorable).
MAX_STORABLE_SCHEMA_VERSION = 2**31 - 1

_U32_MAX = 2**32 - 1

_S = TypeVar("_S", bound="_DurableState")

#: What a checkpoint or context holds: JSON, as `json.loads` gives it back (else StateMalformed).
JsonValue: TypeAlias = (
    bool | int | float | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"] | None
)
#: A checkpoint's or context's payload: a JSON object.
JsonObject: TypeAlias = Mapping[str, JsonValue]


def _not_json(value: object, path: str = "$") -> tuple[str, str] | None:
    """The key path and type name of the first value durable state cannot hold back as is."""
    if isinstance(value, Mapping):
        for key, child in value.items():
            if not isinstance(key, str):
                return path, f"{type(key).__name__} key"
            found = _not_json(child, f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, child in enumerate(value):
            found = _not_json(child, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if isinstance(value, str) and "\x00" in value:
        return path, "str containing NUL"
    if value is None or isinstance(value, bool | int | float | str):
        return None
    return path, type(value).__name__


@attrs.frozen
class StateLimits:
    """Byte and depth bounds of an envelope (default 64 KiB / 16; a step's 1 MiB / 64).

    Depth counts the root and scalar leaves: `{"payload": {}}` is 2, `{"payload": {"a": 1}}` 3.
    """

    max_bytes: int = 64 * 1024
    max_depth: int = 16

    STEP: ClassVar[StateLimits]  # Limits for durable step state (checkpoint and context columns).
    PARTITION: ClassVar[StateLimits]  # Limits for partition contexts.


StateLimits.STEP = StateLimits(1024 * 1024, 64)
StateLimits.PARTITION = StateLimits(4096, 16)


def _depth_exceeds(value: object, limit: int) -> bool:
    """Whether the JSON nesting depth of `value` exceeds `limit` (stops early; safe on cycles)."""
    if limit < 1:
        return True
    if isinstance(value, dict):
        return any(_depth_exceeds(child, limit - 1) for child in value.values())
    if isinstance(value, list | tuple):
        return any(_depth_exceeds(child, limit - 1) for child in value)
    return False


@functools.lru_cache(maxsize=4)
def _envelope_head(format_name: str) -> bytes:
    """The canonical envelope's bytes before its payload (one per envelope kind)."""
    return b'{"format":%s,"format_version":%d,"payload":' % (
        canonical_json(format_name),
        STATE_FORMAT_VERSION,
    )


@functools.lru_cache(maxsize=256)
def _envelope_schema(schema: str) -> bytes:
    """The canonical envelope's bytes between its payload and its schema version."""
    return b',"schema":%s,"schema_version":' % canonical_json(schema)


@attrs.frozen(repr=False, init=False)
class _DurableState:
    """A validated envelope; equality and hashing follow its type and canonical bytes."""

    _FORMAT: ClassVar[str] = ""
    _KIND: ClassVar[str] = ""

    schema: StateSchemaId = attrs.field(eq=False)
    schema_version: int = attrs.field(eq=False)
    _payload_json: bytes = attrs.field(eq=False)
    _encoded: bytes

    def __init__(
        self,
        schema: StateSchemaId,
        schema_version: int,
        payload: dict[str, Any],
        *,
        limits: StateLimits | None = None,
    ) -> None:
        """Validate and build an envelope (schema version outside 1..2^32-1: ZeroSchemaVersion)."""
        if not isinstance(schema, StateSchemaId):
            raise TypeError("schema is a StateSchemaId")
        if type(schema_version) is not int or not 1 <= schema_version <= _U32_MAX:
            raise e.ZeroSchemaVersion()
        if not isinstance(payload, dict):
            raise e.StatePayloadNotObject()
        limits = limits if limits is not None else StateLimits()
        # The envelope's depth is its payload's plus one (the other members are scalars).
        payload_depth = limits.max_depth - 1
        try:
            payload_json = canonical_json(payload, decimals=False)
        except e.JsonNotEncodable:
            if _depth_exceeds(payload, payload_depth):
                raise e.StateTooDeep(kind=self._KIND, max_depth=limits.max_depth) from None
            path, value_type = _not_json(payload) or (None, None)
            raise e.StateMalformed(kind=self._KIND, path=path, value_type=value_type) from None
        # canonical_json of the whole envelope, written around the already canonical payload.
        encoded = b"%s%s%s%d}" % (
            _envelope_head(self._FORMAT),
            payload_json,
            _envelope_schema(schema.value),
            schema_version,
        )
        if len(encoded) > limits.max_bytes:
            raise e.StateTooLarge(kind=self._KIND, max_bytes=limits.max_bytes)
        # Each level of nesting takes at least one byte of the canonical text, so a payload
        # shorter than the depth limit cannot exceed it (the common small checkpoint).
        if len(payload_json) >= payload_depth and _depth_exceeds(payload, payload_depth):
            raise e.StateTooDeep(kind=self._KIND, max_depth=limits.max_depth)
        self.__attrs_init__(schema, schema_version, payload_json, encoded)

    @classmethod
    def empty(cls: type[_S]) -> _S:
        """The default state: schema `oxide_batch.empty.v1`, version 1, payload `{}`."""
        return cls(EMPTY_STATE_SCHEMA, 1, {})

    def encode(self) -> bytes:
        """The canonical envelope JSON bytes."""
        return self._encoded

    @property
    def payload(self) -> dict[str, Any]:
        """A fresh copy of the payload in its canonical (round-trip stable) form."""
        return cast(dict[str, Any], json.loads(self._payload_json))

    def payload_json(self) -> bytes:
        """The canonical payload bytes (what the `*_payload` jsonb column holds)."""
        return self._payload_json

    @property
    def encoded_bytes(self) -> int:
        """Length of the canonical envelope in bytes."""
        return len(self._encoded)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(format_version={STATE_FORMAT_VERSION}, "
            f"schema_version={self.schema_version}, encoded_bytes={self.encoded_bytes}, "
            "payload=<redacted>)"
        )


class Checkpoint(_DurableState):
    """A bounded, versioned reader position committed with a chunk."""

    __slots__ = ()

    _FORMAT = "oxide-batch.checkpoint"
    _KIND = "checkpoint"

    def generation_digest(self) -> bytes:
        """SHA-256 of the canonical envelope: the checkpoint generation (never the zero digest)."""
        return sha256(self._encoded)


class ExecutionContext(_DurableState):
    """Bounded, versioned application restart state committed with a chunk."""

    __slots__ = ()

    _FORMAT = "oxide-batch.execution-context"
    _KIND = "execution context"
