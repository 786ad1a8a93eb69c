"""Explorer page sizes, bound cursors, filters and projections (docs/contract.md, Explorer)."""

from __future__ import annotations

import datetime as _dt
import enum
import functools
import hashlib
import itertools
import json
import re
import struct
from collections.abc import Iterable
from typing import Any, Generic, TypeVar, cast

import attrs

from pybatch import errors as e
from pybatch.values.flow import FlowDecision
from pybatch.values.names import ParameterName
from pybatch.values.operator import OperatorRecord
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.status import BatchStatus, FailureSummary

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_RESPONSE_BYTES = 256 * 1024
MAX_CURSOR_BYTES = 256
MIN_UNRESOLVED_AGE = _dt.timedelta(seconds=60)
CURSOR_FORMAT_VERSION = 1
#: At most this many NAME=VALUE pairs in a filter: at most 2**8 documents to match.
MAX_PARAMETER_FILTERS = 8

_I63_MAX = 2**63 - 1
_MAX_NAME_BYTES = 128
_CHECKSUM_BYTES = 32
_BINDING_BYTES = 8


@attrs.frozen
class PageSize:
    """How many rows a page may hold: 1..500, default 50."""

    value: int = DEFAULT_PAGE_SIZE

    def __attrs_post_init__(self) -> None:
        if type(self.value) is not int or not 1 <= self.value <= MAX_PAGE_SIZE:
            raise e.PageSizeOutOfRange(requested=self.value)


class ExplorerQuery(enum.Enum):
    """The paged queries; the value is the cursor discriminant."""

    JOB_NAMES = 1
    INSTANCES = 2
    EXECUTIONS = 3
    STEP_EXECUTIONS = 4
    UNRESOLVED_EXECUTIONS = 5
    RECOVERY_DECISIONS = 6
    FLOW_DECISIONS = 7
    STEP_PARTITIONS = 8
    OPERATOR_REQUESTS = 9
    STEP_SKIPS = 10
    PARAMETER_EXECUTIONS = 11

    @property
    def key_kind(self) -> type[CursorKey]:
        """The cursor key kind this query pages by: by name, by (primary, id) or by id."""
        if self is ExplorerQuery.JOB_NAMES:
            return NameKey
        if self in (ExplorerQuery.EXECUTIONS, ExplorerQuery.FLOW_DECISIONS):
            return OrderedKey
        return IdentityKey


def _check_i63(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or not 0 <= value <= _I63_MAX:
        raise ValueError(f"{attribute.name} must be 0..2**63-1")


@attrs.frozen
class IdentityKey:
    """Page key of queries ordered by row id."""

    id: int = attrs.field(validator=_check_i63)


@attrs.frozen
class OrderedKey:
    """Page key of queries ordered by (primary, id): executions, flow decisions."""

    primary: int = attrs.field(validator=_check_i63)
    id: int = attrs.field(validator=_check_i63)


@attrs.frozen
class NameKey:
    """Page key of the job-name listing."""

    name: str

    def __attrs_post_init__(self) -> None:
        if type(self.name) is not str:
            raise TypeError("a name key is a str")
        if not 1 <= len(self.name.encode("utf-8")) <= _MAX_NAME_BYTES:
            raise ValueError("a name key is 1..128 UTF-8 bytes")


CursorKey = IdentityKey | OrderedKey | NameKey


_BINDING_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def query_binding(query: ExplorerQuery, page_size: PageSize, filter_value: object) -> bytes:
    """First 8 bytes of SHA-256 over the canonical identity of (query, page size, filter)."""
    name = f"list_{query.name.lower()}"  # the contract's name of the query: list_job_names...
    identity = _BINDING_JSON.encode([name, page_size.value, filter_value])
    return hashlib.sha256(identity.encode("utf-8")).digest()[:_BINDING_BYTES]


def _cursor_bytes(instance: object, attribute: attrs.Attribute[bytes], value: bytes) -> None:
    if not isinstance(value, bytes) or not 1 <= len(value) <= MAX_CURSOR_BYTES:
        raise e.CursorInvalid()


@attrs.frozen(repr=False)
class Cursor:
    """An opaque page cursor: 1..256 bytes; `str` is lower-case hex, `repr` its length only."""

    data: bytes = attrs.field(validator=_cursor_bytes)

    @classmethod
    def from_hex(cls, text: str) -> Cursor:
        """Parse lower-case, even-length hex; anything else is `CursorInvalid`."""
        if not isinstance(text, str) or re.fullmatch("(?:[0-9a-f]{2})*", text) is None:
            raise e.CursorInvalid()
        return cls(bytes.fromhex(text))

    def __str__(self) -> str:
        return self.data.hex()

    def __repr__(self) -> str:
        return f"Cursor(<{len(self.data)} bytes>)"

    @classmethod
    def issue(cls, query: ExplorerQuery, key: CursorKey, ceiling: int, binding: bytes) -> Cursor:
        """Encode the cursor of the page after `key` (see its layout above)."""
        if not isinstance(key, query.key_kind) or len(binding) != _BINDING_BYTES:
            raise ValueError("cursor key kind or binding does not fit the query")
        body = bytes([CURSOR_FORMAT_VERSION, query.value]) + _encode_key(key)
        body += struct.pack(">Q", ceiling) + binding
        return cls(body + hashlib.sha256(body).digest())

    def open(self, query: ExplorerQuery, binding: bytes) -> tuple[CursorKey, int]:
        """The (key, ceiling) carried; CursorQueryMismatch if intact but for another binding."""
        data = self.data
        if len(data) < 2 + 1 + 8 + _BINDING_BYTES + _CHECKSUM_BYTES:
            raise e.CursorInvalid()
        body, checksum = data[:-_CHECKSUM_BYTES], data[-_CHECKSUM_BYTES:]
        if hashlib.sha256(body).digest() != checksum or body[0] != CURSOR_FORMAT_VERSION:
            raise e.CursorInvalid()
        try:
            presented = ExplorerQuery(body[1])
        except ValueError:
            raise e.CursorInvalid() from None
        key, offset = _decode_key(body, 2)
        if len(body) != offset + 8 + _BINDING_BYTES:
            raise e.CursorInvalid()
        (ceiling,) = struct.unpack_from(">Q", body, offset)
        if ceiling > _I63_MAX or not isinstance(key, query.key_kind):
            raise e.CursorInvalid()
        if presented is not query or body[offset + 8 :] != binding:
            raise e.CursorQueryMismatch()
        return key, ceiling


def _encode_key(key: CursorKey) -> bytes:
    if isinstance(key, IdentityKey):
        return b"\x01" + struct.pack(">Q", key.id)
    if isinstance(key, OrderedKey):
        return b"\x02" + struct.pack(">QQ", key.primary, key.id)
    name = key.name.encode("utf-8")
    return b"\x03" + bytes([len(name)]) + name


def _decode_key(body: bytes, offset: int) -> tuple[CursorKey, int]:
    try:
        tag = body[offset]
        offset += 1
        if tag == 1:
            (identity,) = struct.unpack_from(">Q", body, offset)
            return IdentityKey(identity), offset + 8
        if tag == 2:
            primary, identity = struct.unpack_from(">QQ", body, offset)
            return OrderedKey(primary, identity), offset + 16
        if tag == 3:
            length = body[offset]
            raw = body[offset + 1 : offset + 1 + length]
            if len(raw) != length:
                raise e.CursorInvalid()
            return NameKey(raw.decode("utf-8")), offset + 1 + length
    except (IndexError, struct.error, UnicodeDecodeError, ValueError):
        raise e.CursorInvalid() from None
    raise e.CursorInvalid()


#: The decimal form of an integer parameter: no sign on 0, no leading zero, at most 20 digits.
_DECIMAL = re.compile(r"0|-?[1-9][0-9]{0,19}")


@attrs.frozen
class ParameterFilter:
    """Identifying parameter values an instance must all have: (name, value text) pairs.

    A value matches a string parameter equal to it, an integer parameter whose decimal form it
    is, and a boolean parameter when it is `true` or `false` (docs/operators.md, `--param`).
    """

    pairs: tuple[tuple[str, str], ...] = attrs.field(repr=lambda pairs: f"<{len(pairs)} pairs>")

    @classmethod
    def parse(cls, texts: Iterable[str]) -> ParameterFilter:
        """From `NAME=VALUE` texts, split at the first `=`; anything else ParameterFilterInvalid."""
        split = [text.partition("=") for text in texts]
        names = {name for name, _, _ in split}
        if (
            all(sep for _, sep, _ in split)
            and 1 <= len(split) == len(names) <= MAX_PARAMETER_FILTERS
        ):
            try:
                for name in names:
                    ParameterName(name)
                return cls(tuple(sorted((name, value) for name, _, value in split)))
            except e.PyBatchError:
                pass
        raise e.ParameterFilterInvalid(limit=MAX_PARAMETER_FILTERS)

    def documents(self) -> list[dict[str, Any]]:
        """Every `identifying_parameters` fragment that satisfies the filter, for `@> ANY`."""
        choices = []
        for name, text in self.pairs:
            values: list[object] = [text]
            if _DECIMAL.fullmatch(text):
                values.append(int(text))
            if text in ("true", "false"):
                values.append(text == "true")
            choices.append([(name, {"value": value}) for value in values])
        return [dict(combination) for combination in itertools.product(*choices)]


T = TypeVar("T")


@attrs.frozen
class Page(Generic[T]):
    """One page of a traversal; `next_cursor` is None on the last page."""

    items: tuple[T, ...]
    next_cursor: Cursor | None
    ceiling: int


def _json(value: object) -> Any:
    """The documented JSON of a projection: its fields in order, codes, ISO instants, hex."""
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, str | int | float):  # the most frequent, checked early
        return value
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return [_json(item) for item in value]
    cls: Any = type(value)
    if not attrs.has(cls):
        return value
    return {name: _json(getattr(value, name)) for name in _field_names(cls)}


@functools.cache
def _field_names(cls: Any) -> tuple[str, ...]:
    return tuple(field.name for field in attrs.fields(cls))


class _Projection:
    __slots__ = ()

    def as_json(self) -> dict[str, Any]:
        """The documented JSON object (docs/operators.md): every field, in field order."""
        return cast("dict[str, Any]", _json(self))


def _bytes_repr(value: bytes) -> str:
    return f"<{len(value)} bytes>"


@attrs.frozen
class StateEnvelopeDescriptor(_Projection):
    """What a stored state envelope is, never its payload; `encoded_len` is its stored size."""

    kind: str
    format_version: int
    schema_id: str
    schema_version: int
    encoded_len: int


@attrs.frozen
class DefinitionDescriptor(_Projection):
    """The definition an execution ran under (revision, manifest format and digest)."""

    revision: str
    manifest_format: int
    manifest_digest: bytes = attrs.field(repr=_bytes_repr)


@attrs.frozen
class ProjectionCounts(_Projection):
    """The six counters of an execution, step or partition."""

    read: int
    processed: int
    written: int
    filtered: int
    commits: int
    rollbacks: int


@attrs.frozen
class JobNameSummary(_Projection):
    """A job name, with the latest attempt of its newest instance (None while it has none)."""

    job_name: str
    latest_execution_id: int | None
    latest_status: BatchStatus | None
    latest_updated_at: _dt.datetime | None


@attrs.frozen
class LatestAttempt(_Projection):
    """The newest attempt of an instance: the one a restart starts from."""

    execution_id: int
    attempt: int
    status: BatchStatus


@attrs.frozen
class RunningExecution(_Projection):
    """An execution running now (a live lease) and where its newest step stands.

    Times are the server's: `observed_at` is the statement time of the read, so the lease
    left and the step's rate do not depend on the reader's clock.
    """

    id: int
    job_name: str
    attempt: int
    status: BatchStatus
    started_at: _dt.datetime | None
    lease_expires_at: _dt.datetime
    stop_requested_at: _dt.datetime | None
    #: `host:pid` of the process that claimed it (None if claimed before migration 0012).
    owner_host: str | None
    step_name: str | None
    step_started_at: _dt.datetime | None
    read: int
    written: int
    commits: int
    observed_at: _dt.datetime

    @property
    def lease_left(self) -> _dt.timedelta:
        """How long the lease runs before a renewal must extend it."""
        return self.lease_expires_at - self.observed_at

    @property
    def items_per_second(self) -> float | None:
        """Items written per second since the newest step started (None before it has)."""
        if self.step_started_at is None:
            return None
        elapsed = (self.observed_at - self.step_started_at).total_seconds()
        return self.written / elapsed if elapsed > 0 else None


@attrs.frozen
class ParameterDescriptor(_Projection):
    """An identifying parameter: name, kind and value (kept out of its repr)."""

    name: str
    kind: str
    value: str | int | bool = attrs.field(repr=lambda _: "<redacted>")
    identifying: bool = True

    def shown_value(self, limit: int = 40) -> str:
        """The value for a table: `true`/`false`, controls escaped, over `limit` characters cut."""
        text = str(self.value).lower() if type(self.value) is bool else str(self.value)
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
        return text if len(text) <= limit else text[: limit - 1] + "\u2026"


@attrs.frozen
class RetentionHold(_Projection):
    """A retention hold placed on an instance."""

    actor: str
    reason: str
    placed_at: _dt.datetime


@attrs.frozen
class InstanceTombstone(_Projection):
    """What a purge left of an instance's history: its final status, when, its last attempt."""

    final_status: BatchStatus
    purged_at: _dt.datetime
    last_attempt: int


@attrs.frozen
class JobInstanceProjection(_Projection):
    """A job instance and its identifying parameters (docs/contract.md, Explorer vocabulary)."""

    id: int
    job_name: str
    instance_key_digest: bytes = attrs.field(repr=_bytes_repr)
    parameters: tuple[ParameterDescriptor, ...]
    created_at: _dt.datetime
    hold: RetentionHold | None
    #: Set once a purge deleted the instance's history (its row stays as a tombstone).
    tombstone: InstanceTombstone | None = None


@attrs.frozen
class JobExecutionProjection(_Projection):
    """A job execution with derived counts and ownership evidence (docs/contract.md, Explorer)."""

    id: int
    instance_id: int
    job_name: str
    parameters: tuple[ParameterDescriptor, ...]
    attempt: int
    status: BatchStatus
    exit_code: str
    counts: ProjectionCounts
    version: int
    created_at: _dt.datetime
    started_at: _dt.datetime | None
    ended_at: _dt.datetime | None
    updated_at: _dt.datetime
    failure: FailureSummary | None
    definition: DefinitionDescriptor
    context: StateEnvelopeDescriptor
    stop_requested_at: _dt.datetime | None
    stop_requested_by: str | None
    owner_recorded: bool
    #: `host:pid` of the process that claimed it, kept after it ended (None before 0012).
    owner_host: str | None


@attrs.frozen
class StepExecutionProjection(_Projection):
    """A step execution with its checkpoint and context descriptors."""

    id: int
    job_execution_id: int
    step_name: str
    node_id: str
    status: BatchStatus
    exit_code: str
    counts: ProjectionCounts
    version: int
    created_at: _dt.datetime
    started_at: _dt.datetime | None
    ended_at: _dt.datetime | None
    updated_at: _dt.datetime
    failure: FailureSummary | None
    checkpoint: StateEnvelopeDescriptor
    context: StateEnvelopeDescriptor


@attrs.frozen
class StepPartitionProjection(_Projection):
    """A partition of a manager step, with its context descriptor."""

    id: int
    step_execution_id: int
    partition_key: str
    ordinal: int
    status: BatchStatus
    exit_code: str
    counts: ProjectionCounts
    version: int
    worker_step_execution_id: int | None
    context: StateEnvelopeDescriptor


@attrs.frozen
class StepSkip(_Projection):
    """One item a step skipped (`StepRun.load`): where, its key, why; never the item's values."""

    id: int
    step_execution_id: int
    step_name: str
    item_position: int
    item_key: str
    sqlstate: str
    constraint: str | None
    table: str | None
    column: str | None
    message: str
    created_at: _dt.datetime


def flow_decision_json(decision: FlowDecision) -> dict[str, Any]:
    """The documented JSON object of a flow decision as the explorer lists it."""
    target = decision.target
    return {
        "id": decision.id,
        "job_execution_id": decision.job_execution_id,
        "sequence": decision.sequence,
        "source_node_id": str(decision.source_node_id),
        "source_step_execution_id": decision.source_step_execution_id,
        "transition_kind": decision.kind.value,
        "observed_outcome": str(decision.observed_outcome),
        "target_node_id": None if target.node is None else str(target.node),
        "terminal_kind": None if target.terminal is None else target.terminal.value,
        "plan_fingerprint": decision.plan_fingerprint.hex(),
        "input_digest": decision.input_digest.hex(),
        "reused_decision_id": decision.reused_decision_id,
        "decided_at": _json(decision.decided_at),
    }


def operator_request_json(record: OperatorRecord) -> dict[str, Any]:
    """The documented JSON object of an operator request as the explorer lists it."""
    return {
        "id": record.id,
        "action": record.action.value,
        "authorization_class": record.authorization_class.value,
        "operation_id": str(record.operation_id),
        "actor": str(record.actor),
        "reason": None if record.reason is None else str(record.reason),
        "request_digest": record.digest.value.hex(),
        "job_instance_id": record.job_instance_id,
        "job_execution_id": record.job_execution_id,
        "observed_version": record.observed_version,
        "prior_status": None if record.prior_status is None else record.prior_status.value,
        "result_status": None if record.result_status is None else record.result_status.value,
        "outcome": record.outcome.value,
        "rejection": _json(record.rejection),  # code, current_version, status, execution_id
        "requested_at": _json(record.requested_at),
    }


def recovery_decision_json(decision: RecoveryDecision) -> dict[str, Any]:
    """The documented JSON object of a recovery decision: its fields, as a projection's."""
    return cast("dict[str, Any]", _json(decision))
