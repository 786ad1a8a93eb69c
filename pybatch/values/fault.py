"""Retry keys, retry bounds and the fault-state envelope (pure values; the SQL is FaultState's).

Every refusal is a `FaultStateEnvelopeInvalid` whose `reason` is a `FaultStateRefusal`; the store
maps it to `FaultStateCorrupt`, and no work begins on such state.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import re
import struct
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from pybatch.errors import (
    CapacityExhausted,
    DefinitionError,
    DomainError,
    FaultStateEnvelopeInvalid,
    StaleReservation,
)
from pybatch.values._canonical import canonical_json, sha256
from pybatch.values._fields import Code, digest, is_
from pybatch.values.ids import UINT64_MAX, Validator
from pybatch.values.names import ClassifierRevision, StepName
from pybatch.values.status import BatchStatus, FailureCategory

FAULT_STATE_FORMAT = 1  # `fault_state_format`: the only format version (kept from the seed).
FAULT_STATE_SCHEMA = "oxide-batch.fault-state"  # `fault_state_schema`, kept byte for byte.
FAULT_STATE_SCHEMA_VERSION = 1  # Value of the `fault_state_schema_version` column.
FAULT_STATE_MAX_BYTES = 64 * 1024  # Byte ceiling of the canonical envelope.
FAULT_STATE_MAX_ENTRIES = 256  # Hard entry ceiling of format 1 (and of `RetryStateLimit`).
RETRY_KEY_DOMAIN = b"oxide-batch/retry-key/1"  # Domain of `RetryKey.derive`, byte for byte.

_U16_MAX = 2**16 - 1
_DIGEST_BYTES = 32
_ZERO_DIGEST = bytes(_DIGEST_BYTES)
# Lower case only: the canonical form is lower-case hex, so anything else was not written by us.
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_ENTRY_MEMBERS = frozenset({"category", "key", "ordinal", "phase", "revision"})


class FaultStateRefusal(enum.StrEnum):
    """The `reason` of each `FaultStateEnvelopeInvalid`, one per broken rule."""

    UNSUPPORTED_FORMAT = "unsupported format"
    UNSUPPORTED_SCHEMA = "unsupported schema"
    UNSUPPORTED_SCHEMA_VERSION = "unsupported schema version"
    MALFORMED = "malformed"  # not an object with a 64-hex `checkpoint` and an `entries` array
    TOO_LARGE = "too large"
    TOO_MANY_ENTRIES = "too many entries"  # the format's ceiling, or the policy's state limit
    MALFORMED_ENTRY = "malformed entry"
    UNKNOWN_ENUMERATION = "unknown enumeration"
    UNSORTED_ENTRIES = "unsorted entries"
    DUPLICATE_KEY = "duplicate key"
    #: Empty with a non-zero checkpoint digest, or non-empty with the zero one.
    CHECKPOINT_EMPTINESS_MISMATCH = "checkpoint emptiness mismatch"
    CHECKSUM_MISMATCH = "checksum mismatch"
    ORDINAL_ABOVE_LIMIT = "ordinal above limit"  # above the policy's retry limit
    CHECKPOINT_MISMATCH = "checkpoint mismatch"  # entries of a superseded checkpoint generation


def fault_state_refusal(refusal: FaultStateRefusal) -> FaultStateEnvelopeInvalid:
    """Build the refusal; the reason is a plain str so the error pickles and prints cleanly."""
    return FaultStateEnvelopeInvalid(reason=refusal.value)


def _bounded(what: str, minimum: int, maximum: int) -> Validator:
    # Programmer errors (policy constants in the ETL script), hence ValueError.
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not int:
            raise TypeError(f"{what} takes an int")
        if not minimum <= value <= maximum:
            raise ValueError(f"{what} must lie in {minimum}..{maximum}")

    return check


def _check_digest(value: object, what: str) -> None:
    if type(value) is not bytes:
        raise TypeError(f"{what} takes bytes")
    if len(value) != _DIGEST_BYTES:
        raise ValueError(f"{what} must be exactly {_DIGEST_BYTES} bytes")


@attrs.frozen(order=True)
class RetryOrdinal:
    """Zero-based invocation ordinal of one retry key; 0 is the first call, which is no retry."""

    value: int = attrs.field(validator=_bounded("RetryOrdinal", 0, _U16_MAX))

    INITIAL: ClassVar[RetryOrdinal]  # The initial, non-retried call.
    MAX: ClassVar[RetryOrdinal]  # The largest ordinal (u16).


RetryOrdinal.INITIAL = RetryOrdinal(0)
RetryOrdinal.MAX = RetryOrdinal(_U16_MAX)


@attrs.frozen(order=True)
class RetryLimit:
    """Maximum re-invocations after the first call (u16); stored ordinals above it are corrupt."""

    value: int = attrs.field(validator=_bounded("RetryLimit", 0, _U16_MAX))

    NONE: ClassVar[RetryLimit]  # A policy that never retries.


RetryLimit.NONE = RetryLimit(0)


@attrs.frozen(order=True)
class RetryStateLimit:
    """Maximum unresolved retry keys one step retains (1..256), so fault state stays bounded."""

    value: int = attrs.field(validator=_bounded("RetryStateLimit", 1, FAULT_STATE_MAX_ENTRIES))


class FaultPhase(Code):
    """The framework phase that produced a fault; values are the durable lower-case names."""

    READ = "read"  # An item reader failed.
    PROCESS = "process"  # An item processor failed.
    WRITE = "write"  # An item writer failed.
    TRANSACTION = "transaction"  # A chunk transaction failed to begin, commit or roll back.
    CHECKPOINT = "checkpoint"  # Checkpoint or context state could not be produced or stored.
    LISTENER = "listener"  # A listener callback failed.
    BACKOFF = "backoff"  # Cancellable backoff failed or was interrupted.

    @property
    def is_reservable(self) -> bool:
        """Whether a retry can be reserved: only read, process and write have retry counters."""
        return self in _RESERVABLE


_RESERVABLE = frozenset({FaultPhase.READ, FaultPhase.PROCESS, FaultPhase.WRITE})


@attrs.frozen(order=True)
class RetryKey:
    """Opaque 32-byte digest of one retryable unit of work; ordered by bytes, repr redacted."""

    digest: bytes = attrs.field(validator=digest, repr=lambda _: "<redacted>")

    @classmethod
    def derive(
        cls,
        definition_digest: bytes,
        step_name: StepName,
        phase: FaultPhase,
        checkpoint_digest: bytes,
        ordinal: int,
    ) -> RetryKey:
        """Derive the key of one failed unit of work (`ordinal`: the stable item ordinal, u64).

        SHA-256 over domain ‖ definition digest ‖ u64be(len(step)) ‖ step ‖ phase ‖ 0x00 ‖
        checkpoint digest ‖ u64be(ordinal), so a restart finds the same key.
        """
        _check_digest(definition_digest, "definition digest")
        _check_digest(checkpoint_digest, "checkpoint digest")
        if not isinstance(step_name, StepName):
            raise TypeError("step_name takes a StepName")
        if not isinstance(phase, FaultPhase):
            raise TypeError("phase takes a FaultPhase")
        if type(ordinal) is not int:
            raise TypeError("ordinal takes an int")
        if not 0 <= ordinal <= UINT64_MAX:
            raise ValueError("ordinal must lie in 0..2^64-1")
        step = step_name.value.encode("utf-8")
        material = RETRY_KEY_DOMAIN + definition_digest + struct.pack(">Q", len(step)) + step
        material += phase.value.encode("ascii") + b"\x00" + checkpoint_digest
        return cls(sha256(material + struct.pack(">Q", ordinal)))

    def hex(self) -> str:
        """Return the 64 lower-case hex digits stored in the fault-state payload."""
        return self.digest.hex()


@attrs.frozen(kw_only=True)
class FaultEntry:
    """One retained retry reservation: framework classification only, never an item or message."""

    key: RetryKey = attrs.field(validator=is_(RetryKey))
    phase: FaultPhase = attrs.field(validator=is_(FaultPhase))
    category: FailureCategory = attrs.field(validator=is_(FailureCategory))
    ordinal: RetryOrdinal = attrs.field(validator=is_(RetryOrdinal))
    revision: ClassifierRevision = attrs.field(validator=is_(ClassifierRevision))

    def to_payload(self) -> dict[str, object]:
        """Return the entry's JSON object, members as docs/tables.md 3.6 names them."""
        return {
            "category": self.category.value,
            "key": self.key.hex(),
            "ordinal": self.ordinal.value,
            "phase": self.phase.value,
            "revision": self.revision.value,
        }


def fault_entry_from_payload(raw: object) -> FaultEntry:
    """Decode one stored entry, refusing anything a reservation could not have written."""
    if not isinstance(raw, Mapping) or set(raw) != _ENTRY_MEMBERS:
        raise fault_state_refusal(FaultStateRefusal.MALFORMED_ENTRY)
    key, phase_name, category_code = raw["key"], raw["phase"], raw["category"]
    if type(key) is not str or HEX_DIGEST.fullmatch(key) is None:
        raise fault_state_refusal(FaultStateRefusal.MALFORMED_ENTRY)
    if type(phase_name) is not str or type(category_code) is not str:
        raise fault_state_refusal(FaultStateRefusal.MALFORMED_ENTRY)
    phase = FaultPhase.from_durable_code(phase_name)
    category = FailureCategory.from_durable_code(category_code)
    if phase is None or category is None:
        raise fault_state_refusal(FaultStateRefusal.UNKNOWN_ENUMERATION)
    ordinal, revision_text = raw["ordinal"], raw["revision"]
    # bool is an int subclass and a JSON float is never an ordinal; 0 is never reserved.
    if type(ordinal) is not int or not 1 <= ordinal <= _U16_MAX or type(revision_text) is not str:
        raise fault_state_refusal(FaultStateRefusal.MALFORMED_ENTRY)
    try:
        revision = ClassifierRevision(revision_text)
    except (DefinitionError, DomainError):
        raise fault_state_refusal(FaultStateRefusal.MALFORMED_ENTRY) from None
    return FaultEntry(
        key=RetryKey(bytes.fromhex(key)),
        phase=phase,
        category=category,
        ordinal=RetryOrdinal(ordinal),
        revision=revision,
    )


def _entries_value(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not tuple or not all(isinstance(entry, FaultEntry) for entry in value):
        raise TypeError("entries takes a tuple of FaultEntry")


@attrs.frozen(repr=False)
class FaultStateEnvelope:
    """The bounded, checksummed retry state of one step, tied to one checkpoint generation."""

    checkpoint_digest: bytes = attrs.field(validator=digest)
    entries: tuple[FaultEntry, ...] = attrs.field(validator=_entries_value)
    _canonical: bytes = attrs.field(init=False, eq=False, hash=False)

    #: The state of every new step and the value every chunk commit writes.
    EMPTY: ClassVar[FaultStateEnvelope]

    def __attrs_post_init__(self) -> None:
        if len(self.entries) > FAULT_STATE_MAX_ENTRIES:
            raise fault_state_refusal(FaultStateRefusal.TOO_MANY_ENTRIES)
        for previous, current in itertools.pairwise(self.entries):
            if previous.key == current.key:
                raise fault_state_refusal(FaultStateRefusal.DUPLICATE_KEY)
            if previous.key > current.key:
                raise fault_state_refusal(FaultStateRefusal.UNSORTED_ENTRIES)
        if (not self.entries) != (self.checkpoint_digest == _ZERO_DIGEST):
            raise fault_state_refusal(FaultStateRefusal.CHECKPOINT_EMPTINESS_MISMATCH)
        canonical = canonical_json(self.to_payload())
        if len(canonical) > FAULT_STATE_MAX_BYTES:
            raise fault_state_refusal(FaultStateRefusal.TOO_LARGE)
        object.__setattr__(self, "_canonical", canonical)

    @property
    def is_empty(self) -> bool:
        """Whether no retry key is retained (the state right after a chunk commit)."""
        return not self.entries

    def ordinal_for(self, key: RetryKey) -> RetryOrdinal | None:
        """Return the ordinal already reserved for `key`, or None when it holds none."""
        index, exists = self._find(key)
        return self.entries[index].ordinal if exists else None

    def _find(self, key: RetryKey) -> tuple[int, bool]:
        """Where `key`'s entry is or would go, and whether it is there."""
        index = bisect.bisect_left(self.entries, key, key=lambda entry: entry.key)
        return index, index < len(self.entries) and self.entries[index].key == key

    def to_payload(self) -> dict[str, object]:
        """Return the `fault_state_payload` document: exactly `checkpoint` and `entries`."""
        return {
            "checkpoint": self.checkpoint_digest.hex(),
            "entries": [entry.to_payload() for entry in self.entries],
        }

    def canonical_bytes(self) -> bytes:
        """Return the canonical JSON the checksum covers (docs/tables.md 3.6)."""
        return self._canonical

    def checksum(self) -> bytes:
        """Return `fault_state_checksum`: SHA-256 of the canonical bytes."""
        return sha256(self._canonical)

    def validate_for(
        self, retry_limit: RetryLimit, state_limit: RetryStateLimit, checkpoint_digest: bytes
    ) -> None:
        """Refuse state the current policy and checkpoint cannot own (run on every load)."""
        _check_digest(checkpoint_digest, "checkpoint digest")
        if len(self.entries) > state_limit.value:
            raise fault_state_refusal(FaultStateRefusal.TOO_MANY_ENTRIES)
        if any(entry.ordinal.value > retry_limit.value for entry in self.entries):
            raise fault_state_refusal(FaultStateRefusal.ORDINAL_ABOVE_LIMIT)
        if self.entries and self.checkpoint_digest != checkpoint_digest:
            raise fault_state_refusal(FaultStateRefusal.CHECKPOINT_MISMATCH)

    def reserved(
        self, entry: FaultEntry, checkpoint_digest: bytes, state_limit: RetryStateLimit
    ) -> FaultStateEnvelope:
        """The envelope after one reservation (replacing the key's entry), at `checkpoint_digest`.

        An ordinal is never spent twice: it must be the key's reserved one (or 0) plus 1. The order
        of refusals is the store's: checkpoint, ordinal, capacity, then a non-reservable phase.
        """
        if not isinstance(entry, FaultEntry):
            raise TypeError("entry takes a FaultEntry")
        _check_digest(checkpoint_digest, "checkpoint digest")
        if self.entries and self.checkpoint_digest != checkpoint_digest:
            raise fault_state_refusal(FaultStateRefusal.CHECKPOINT_MISMATCH)
        index, exists = self._find(entry.key)
        previous = self.entries[index].ordinal.value if exists else RetryOrdinal.INITIAL.value
        # At 65535 no successor exists, so every ordinal is stale.
        if entry.ordinal.value != previous + 1:
            raise StaleReservation()
        if not exists and len(self.entries) >= state_limit.value:
            raise CapacityExhausted(max=state_limit.value)
        if not entry.phase.is_reservable:
            raise StaleReservation()
        entries = (*self.entries[:index], entry, *self.entries[index + exists :])
        return FaultStateEnvelope(checkpoint_digest, entries)

    def __repr__(self) -> str:
        return f"FaultStateEnvelope(entry_count={len(self.entries)}, ..)"  # digests redacted


FaultStateEnvelope.EMPTY = FaultStateEnvelope(_ZERO_DIGEST, ())


@attrs.frozen(kw_only=True)
class LockedFaultState:
    """What a retry reservation is validated against, read under the step's row lock."""

    status: BatchStatus
    version: int
    checkpoint_digest: bytes
    envelope: FaultStateEnvelope
