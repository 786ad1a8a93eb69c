"""BatchStatus, FailureCategory, FailureSummary and FailureReason; values are the durable codes."""

from __future__ import annotations

from typing import Any

import attrs

from pybatch.values.ids import Code, FailureId, IdentifierKind, identifier_validator, is_


class BatchStatus(Code):
    """The lifecycle status of a job or step execution; values are the durable codes."""

    STARTING = "STARTING"  # Metadata exists; user work has not started.
    STARTED = "STARTED"  # User work is running.
    STOPPING = "STOPPING"  # A cooperative stop is in progress.
    STOPPED = "STOPPED"  # Stopped cooperatively; restartable.
    FAILED = "FAILED"  # Failed; restartable.
    COMPLETED = "COMPLETED"  # Succeeded; the instance is terminal.
    ABANDONED = "ABANDONED"  # Intentionally terminal; never restarts.
    UNKNOWN = "UNKNOWN"  # Outcome ambiguous; needs explicit recovery.

    @property
    def is_active(self) -> bool:
        """STARTING, STARTED or STOPPING: work may still be running."""
        return self in _ACTIVE

    @property
    def is_finished(self) -> bool:
        """STOPPED, FAILED, COMPLETED or ABANDONED: a known outcome with an end time."""
        return self in _FINISHED

    @property
    def is_unresolved(self) -> bool:
        """Not finished (active or UNKNOWN): blocks launches and purges."""
        return self not in _FINISHED


_ACTIVE = frozenset({BatchStatus.STARTING, BatchStatus.STARTED, BatchStatus.STOPPING})
_FINISHED = frozenset(BatchStatus) - _ACTIVE - {BatchStatus.UNKNOWN}


class FailureCategory(Code):
    """A stable, redacted failure category; values are the durable codes (never renamed)."""

    INVALID_DEFINITION = "INVALID_DEFINITION"  # Invalid job definition or launch configuration.
    DUPLICATE_EXECUTION = "DUPLICATE_EXECUTION"  # Duplicate, completed or not restartable.
    ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"  # Illegal or conflicting lifecycle transition.
    TRANSIENT_INFRASTRUCTURE = "TRANSIENT_INFRASTRUCTURE"  # Repository or infrastructure.
    PERMANENT_INFRASTRUCTURE = "PERMANENT_INFRASTRUCTURE"  # Repository or infrastructure.
    USER_COMPONENT = "USER_COMPONENT"  # A reader, processor, writer, tasklet or listener failed.
    CANCELLED = "CANCELLED"  # Cancellation, stop or deadline expiry.
    SERIALIZATION = "SERIALIZATION"  # Serialization or version incompatibility.
    INVARIANT = "INVARIANT"  # A framework invariant was violated.
    OPTIMISTIC_CONFLICT = "OPTIMISTIC_CONFLICT"  # A version check lost to a concurrent writer.
    TIMEOUT = "TIMEOUT"  # A bounded operation exceeded its deadline.
    UNSUPPORTED_CAPABILITY = "UNSUPPORTED_CAPABILITY"  # A required capability is missing.
    UNKNOWN_COMMIT = "UNKNOWN_COMMIT"  # A commit outcome is unknown and must never be guessed.
    SHUTDOWN_INCOMPLETE = "SHUTDOWN_INCOMPLETE"  # A bounded shutdown left owned children.
    STALE_RECOVERED = "STALE_RECOVERED"  # Resolved from stale-ownership evidence.


@attrs.frozen
class FailureSummary:
    """A redacted failure: a category and a caller-supplied correlation id, no message text."""

    category: FailureCategory = attrs.field(validator=is_(FailureCategory))
    failure_id: FailureId = attrs.field(  # above 2^63-1 it is refused when bound, not here
        validator=identifier_validator(IdentifierKind.FAILURE, storable=False)
    )


def _bounded_name(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (type(value) is not str or not 1 <= len(value.encode()) <= 63):
        raise ValueError(f"{attribute.name} is a server identifier of 1 to 63 bytes")


@attrs.frozen
class FailureReason:
    """Why an execution or a step failed: names and a redacted message, never a value.

    Bounded as the failure_* columns are (migration 0009): class 1..200 bytes, message at most
    1,000 bytes, SQLSTATE five characters, server names 1..63 bytes.
    """

    error_class: str = attrs.field(validator=attrs.validators.max_len(200))
    message: str
    sqlstate: str | None = None
    constraint: str | None = attrs.field(default=None, validator=_bounded_name)
    table: str | None = attrs.field(default=None, validator=_bounded_name)
    column: str | None = attrs.field(default=None, validator=_bounded_name)

    def __str__(self) -> str:
        values = (self.sqlstate, self.constraint, self.table, self.column)
        pairs = zip(("SQLSTATE", "constraint", "table", "column"), values, strict=True)
        named = [f"{k} {v}" for k, v in pairs if v is not None and f"{k} {v}" not in self.message]
        return f"{self.error_class}: {self.message}" + (f" ({', '.join(named)})" if named else "")

    def as_json(self) -> dict[str, str | None]:
        """The documented JSON object (`pybatch show --json`, `failure_reason`)."""
        return attrs.asdict(self)
