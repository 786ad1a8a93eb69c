"""Every pybatch exception, declared once as a table of compact classes (docs/errors.md).

A row is a class: name, bases (its families), fields (keyword-only, frozen), a `message` built
from the fields only (never SQL, values, rows or the DSN) and a one-line hint as docstring.
Each family base, a direct child of `PyBatchError`, is followed by its leaves;
`python tools/errors_catalogue.py` renders the table as docs/errors.md.
"""

from __future__ import annotations

import enum
import functools
from typing import TYPE_CHECKING, Any, ClassVar, dataclass_transform

import attrs

_define = attrs.define(frozen=True, slots=False, kw_only=True, eq=False)


def _fields(error: Any) -> dict[str, Any]:
    return attrs.asdict(error, recurse=False)


@dataclass_transform(kw_only_default=True, frozen_default=True, eq_default=False)
class PyBatchError(Exception):
    """Root of every error pybatch raises; every subclass is a frozen, keyword-only attrs class."""

    message: ClassVar[str] = "pybatch error"
    if TYPE_CHECKING:  # what attrs adds: attrs.fields and attrs.asdict accept errors
        __attrs_attrs__: ClassVar[Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _define(cls)  # slots=False: attrs completes the class in place

    def __str__(self) -> str:
        return self.message.format(**_fields(self))

    def __reduce__(self) -> tuple[Any, ...]:  # keep errors picklable across processes
        return (functools.partial(type(self), **_fields(self)), ())


_define(PyBatchError)


class TextRule(enum.Enum):
    """The rule a validated text value broke, as its error says it; the value is never reported."""

    EMPTY = "is empty"
    TOO_LONG = "exceeds {max_bytes} bytes"
    SURROUNDING_WHITESPACE = "has surrounding whitespace"
    CONTROL_CHARACTER = "contains a control character"
    #: Request fields allow `[A-Za-z0-9._:-]` only: white space and controls alike.
    INVALID_CHARACTER = "contains an invalid character"


class _BrokenTextRule(PyBatchError):
    """One class per family for all text rules: `subject` and what `rule` says, never the value."""

    subject: ClassVar[str]
    rule: TextRule
    max_bytes: int | None = None

    def __str__(self) -> str:
        text = f"{self.subject} {self.rule.value}".format(**_fields(self))
        index = getattr(self, "character_index", None)  # NameInvalid's
        return text if index is None else f"{text} at index {index}"


class _PurgedHistory(PyBatchError):
    """A tombstoned instance's error: `purged` says its history was purged, and so does `str`."""

    id: int
    purged: bool = False

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} (its history was purged)" if self.purged else text


class _AtFault:
    """Errors whose optional fields name what was at fault (never a value): `str` appends them."""

    def __str__(self) -> str:
        text = super().__str__()
        named = [
            f"{name.replace('_', ' ')} {value}"
            for name, value in _fields(self).items()
            if name not in {"kind", "sqlstate"} and value is not None
        ]
        return f"{text}: {', '.join(named)}" if named else text


# The table. One class per row, a blank line between families: the rows read as a table.
# fmt: off
class RepositoryError(PyBatchError):
    """An operation of the job repository failed."""
    message = "job repository error"
class SchemaUninitialized(RepositoryError):
    """The pybatch schema or its version row does not exist; install it with `pybatch migrate`."""
    message = "metadata schema is not initialized; run `pybatch migrate` as the schema's owner"
class MigrationRequired(RepositoryError):
    """The installed schema is older than this package supports; run `pybatch migrate`."""
    message = "schema version {current} requires migration to {supported}"
    current: int
    supported: int
class IdentifierOutOfRange(RepositoryError):
    """An identifier does not fit PostgreSQL bigint."""
    message = "{kind} identifier {value} exceeds PostgreSQL bigint"
    kind: str
    value: int
class JobNotFound(RepositoryError):
    """No job instance has that job name; `pybatch jobs` lists the names there are."""
    message = "job {job_name} was not found (no instance has that name)"
    job_name: str
class JobInstanceNotFound(RepositoryError):
    """The job instance does not exist."""
    message = "job instance {id} was not found"
    id: int
class JobExecutionNotFound(RepositoryError):
    """The job execution does not exist."""
    message = "job execution {id} was not found"
    id: int
class StepExecutionNotFound(RepositoryError):
    """The step execution does not exist."""
    message = "step execution {id} was not found"
    id: int
class StepPartitionNotFound(RepositoryError):
    """The step partition does not exist."""
    message = "step partition {id} was not found"
    id: int
class PartitionStateCorrupt(RepositoryError):
    """Durable partition state is unusable; no work may begin."""
    message = "durable partition state is unusable and no work may begin"
class EmptyPartitionPlan(RepositoryError):
    """A partition plan needs at least one entry."""
    message = "partition plan must contain at least one entry"
class PartitionPlanTooLarge(RepositoryError):
    """A partition plan holds more entries than the bound."""
    message = "partition plan exceeds {max} entries"
    max: int
class DuplicatePartitionKey(RepositoryError):
    """Two entries of one plan share a byte-identical key."""
    message = "partition plan contains a duplicate key"
class PartitionPlanExists(RepositoryError):
    """The parent step already has a plan."""
    message = "step execution {step_execution_id} already has a partition plan"
    step_execution_id: int
class PartitionPlanNotCommitted(RepositoryError):
    """Workers start only after the plan is durably published."""
    message = "step execution {step_execution_id} partition plan must commit before assignment"
    step_execution_id: int
class PartitionUpdateNotAllowed(RepositoryError):
    """The partition's status forbids this update."""
    message = "step partition {id} cannot be updated from {status}"
    id: int
    status: str
class PartitionWorkerMismatch(RepositoryError):
    """The worker is the parent itself or belongs to another job execution."""
    message = "worker {worker} does not belong to partition {partition_id}"
    partition_id: int
    worker: int
class PartitionWorkerStale(RepositoryError):
    """The completion names a worker that no longer backs the partition."""
    message = "worker {worker} is not the current worker for partition {partition_id}"
    partition_id: int
    worker: int
class PartitionParentNotActive(RepositoryError):
    """The parent step's status forbids mutating its partitions."""
    message = "partition parent {step_execution_id} cannot mutate children from {status}"
    step_execution_id: int
    status: str
class PartitionAggregationIncomplete(RepositoryError):
    """A child (or its worker) has not reached a runtime-terminal status."""
    message = "step execution {step_execution_id} cannot aggregate a child in {status}"
    step_execution_id: int
    status: str
class CompletedInstance(_PurgedHistory, RepositoryError):
    """The latest attempt of the instance is COMPLETED; it never runs again (a new run_id does)."""
    message = (
        "job instance {id} is already completed; to run the same parameters again on purpose, "
        "launch Job(..., run_id=N) with a run id not used before"
    )
class AbandonedInstance(_PurgedHistory, RepositoryError):
    """The latest attempt of the instance is ABANDONED; it never runs again."""
    message = "job instance {id} is abandoned"
class ExecutionAlreadyActive(RepositoryError):
    """The instance already has an unresolved execution; let it finish or recover it first."""
    message = "job instance {instance_id} already has execution {execution_id} in {status}"
    instance_id: int
    execution_id: int
    status: str
class DefinitionDrift(RepositoryError):
    """The same (job, revision) was registered with another manifest; give it a new revision."""
    message = "job {job_name} definition revision {revision} has drifted"
    job_name: str
    revision: str
class DefinitionJobMismatch(RepositoryError):
    """The definition is bound to another job name."""
    message = "definition for job {actual} cannot be used for job {expected}"
    expected: str
    actual: str
class IncompatibleDefinition(RepositoryError):
    """A restart changed the definition digest without a registered direct upgrade; add one."""
    message = "job instance {instance_id} has no direct compatible definition"
    instance_id: int
class UnsupportedManifestVersion(RepositoryError):
    """The manifest format is 0 or above 3."""
    message = "definition manifest format {format} is unsupported"
    format: int
class InvalidDefinitionUpgrade(RepositoryError):
    """An upgraded restart step has no mapping entry."""
    message = "definition upgrade for execution {execution_id} is incomplete"
    execution_id: int
class DefinitionUpgradeConflict(RepositoryError):
    """An upgrade edge or upgrade key conflicts with a registered one."""
    message = "job {job_name} definition upgrade conflicts"
    job_name: str
class RestartStateNotFound(RepositoryError):
    """A restart step has no source step in the previous attempt."""
    message = "restart execution {execution_id} has no durable source for step {step_name}"
    execution_id: int
    step_name: str
class StartLimitExceeded(RepositoryError):
    """The node has used up its start limit in this instance."""
    message = "job instance {instance_id} exhausted start limit {limit} for node {node_id}"
    instance_id: int
    node_id: str
    limit: int
class FlowStateCorrupt(RepositoryError):
    """Durable flow history is unusable; no work may begin."""
    message = "durable flow history is unusable and no work may begin"
class RecoveryNotAllowed(RepositoryError):
    """Only unresolved executions (STARTING, STARTED, STOPPING, UNKNOWN) can be recovered."""
    message = "job execution {id} in {status} cannot be recovered"
    id: int
    status: str
class ExecutionOwned(RepositoryError):
    """Another owner token is already recorded on the execution."""
    message = "job execution {id} is owned by another process"
    id: int
class ExecutionOwnershipNotAllowed(RepositoryError):
    """An owner can be claimed only while the execution is STARTING."""
    message = "job execution {id} in {status} cannot acquire process ownership"
    id: int
    status: str
class ExecutionOwnershipLost(RepositoryError):
    """The lease lapsed and the execution was recovered or changed; stop without touching it."""
    message = (
        "job execution {id} is no longer owned by this process (lease lapsed or recovered "
        "by another process); its work stops here"
    )
    id: int
class PartitionOwnershipLost(RepositoryError):
    """The worker's lease lapsed, its partition was recovered or ended; stop without touching it."""
    message = (
        "partition {partition_id} is no longer worked on by worker step {worker} of this "
        "process (lease lapsed or recovered by another process); its work stops here"
    )
    partition_id: int
    worker: int
class UnsupportedCapability(RepositoryError):
    """A required capability is not declared."""
    message = "the adapter does not support {capability}"
    capability: str
class ConcurrentModification(RepositoryError):
    """A race backstop constraint refused the write: another unit of work won; reload, retry."""
    message = "repository unit of work is based on a stale snapshot"
class CommitOutcomeUnknown(RepositoryError):
    """The COMMIT acknowledgement was lost; inspect durable state before acting."""
    message = "commit outcome is unknown; inspect durable metadata before recovery"
class Unavailable(RepositoryError):
    """Infrastructure failure, timeout or undecodable durable row (details redacted)."""
    message = "repository is unavailable"
    sqlstate: str | None = None
    def __str__(self) -> str:  # the SQLSTATE is safe to show, the driver's message is not
        return self.message + ("" if self.sqlstate is None else f" (SQLSTATE {self.sqlstate})")
class DuplicateStep(RepositoryError):
    """A step with the same name or logical id already exists in the execution."""
    message = "job execution {job_execution_id} already has step {step_name} / logical id {node_id}"
    job_execution_id: int
    step_name: str
    node_id: str
class IntegrityViolation(RepositoryError):
    """A durable invariant refused the write; nothing was written."""
    message = "durable invariant {constraint} refused the write; nothing was written"
    constraint: str
class RetryableConflict(RepositoryError):
    """A serialization failure or deadlock aborted the unit of work; run it again."""
    message = "the database aborted the unit of work to resolve a conflict; retry it"
    sqlstate: str
class TransactionAborted(RepositoryError):
    """COMMIT of an already failed transaction rolled it back; find the statement that failed."""
    message = "the transaction had already failed; COMMIT rolled it back and nothing was written"
class UnitOfWorkClosed(RepositoryError):
    """The unit of work was already committed, rolled back or poisoned."""
    message = "the unit of work is closed"
class AuthenticationFailed(Unavailable):
    """The server refused the role or its password (28P01, 28000); fix the DSN's credentials."""
    message = "the server refused the credentials"
class DatabaseNotFound(Unavailable):
    """The database the connection string names does not exist (3D000); create it or fix the DSN."""
    message = "the database named in the connection string does not exist"
class TlsVerificationFailed(Unavailable):
    """The server certificate failed verification, or TLS is missing; check PYBATCH_CA_FILE."""
    message = "the server's TLS certificate could not be verified"
class TlsNotOffered(TlsVerificationFailed):
    """The server offers no TLS; enable ssl there, or PYBATCH_TLS=plaintext on a closed network."""
    message = (
        "the server does not offer TLS, which PYBATCH_TLS=verify-full requires: enable ssl on"
        " the server, or on a closed network set PYBATCH_TLS=plaintext (--plaintext)"
    )
class ServerUnreachable(Unavailable):
    """Nothing accepts connections at the DSN's host and port; start the server or fix the DSN."""
    message = (
        "connection refused: nothing accepts connections at the host and port the connection"
        " string names; start the server or fix the DSN"
    )
class ReadOnlyServer(Unavailable):
    """The server takes no writes (25006: a standby, a read-only role); use the primary."""
    message = (
        "the server is read-only (a standby, or default_transaction_read_only): writes need"
        " the primary; add target_session_attrs=read-write to a multi-host connection string"
    )
class StatementCancelled(Unavailable):
    """A statement ran past a statement timeout or an operator cancelled it (57014)."""
    message = (
        "the server cancelled a statement (a statement timeout, or pg_cancel_backend); raise"
        " PYBATCH_STATEMENT_TIMEOUT_MS or find what slowed it"
    )
class PoolerRefused(Unavailable):
    """A pooler refused pybatch's startup options; set PYBATCH_POOLER to its pool_mode."""
    message = (
        "a connection pooler refused pybatch's startup options; set PYBATCH_POOLER to"
        " session or transaction, as the pooler's pool_mode"
    )
class SettingsNotApplied(Unavailable):
    """The server does not run pybatch's timeouts (a pooler dropped them); set PYBATCH_POOLER."""
    message = (
        "the server runs {setting}={found}, not pybatch's {expected}: a connection pooler"
        " dropped the startup options; set PYBATCH_POOLER to session or transaction"
    )
    setting: str
    expected: str
    found: str
    def __str__(self) -> str:  # the fields, not a SQLSTATE: the server raised nothing
        return PyBatchError.__str__(self)
class PermissionDenied(_AtFault, RepositoryError):
    """The role lacks a privilege the operation needs (42501); grant it (docs/dba.md, Roles)."""
    message = (
        "permission denied: the role lacks a privilege this operation needs (SQLSTATE {sqlstate})"
    )
    sqlstate: str = "42501"
    object_name: str | None = None
    privilege: str | None = None
class RepositoryDomainError(RepositoryError):
    """A repository call refused a domain value; `error` (also the cause) says which and why."""
    message = "invalid repository domain value: {error}"
    error: DomainError

class DomainError(PyBatchError):
    """A domain value was invalid (docs/contract.md, Values)."""
    message = "invalid repository domain value"
class NameInvalid(_BrokenTextRule, DomainError):
    """A name breaks a text rule: empty, too long, surrounding white space, a control character."""
    subject = "{kind} name"
    kind: str
    character_index: int | None = None
class ZeroIdentifier(DomainError):
    """An identifier is zero."""
    message = "{kind} identifier must be non-zero"
    kind: str
class ParameterStringTooLong(DomainError):
    """A string parameter value is longer than its byte bound."""
    message = "parameter string exceeds {max_bytes} bytes"
    max_bytes: int
class DuplicateParameter(DomainError):
    """A parameter name was given twice."""
    message = "duplicate job parameter name"
class InvalidTimestampOrder(DomainError):
    """Execution timestamps are out of order."""
    message = "execution timestamps are out of order"
class ActiveExecutionHasEndTime(DomainError):
    """An active execution carries an end time."""
    message = "an active execution cannot have an end time"
class FinishedExecutionMissingEndTime(DomainError):
    """A finished execution has no end time."""
    message = "a finished execution requires an end time"
class FailedExecutionMissingFailure(DomainError):
    """A FAILED execution has no failure summary."""
    message = "a failed execution requires a failure summary"
class NaiveTimestamp(DomainError):
    """A datetime without a time zone was given; pass an aware datetime (for example in UTC)."""
    message = "timestamps must be timezone-aware"
class NegativeIdentifier(DomainError):
    """An identifier is negative or above the unsigned 64-bit range."""
    message = "{kind} identifier is outside 1..2^64-1"
    kind: str
class RunIdInvalid(DomainError):
    """`Job(run_id=...)` takes a whole number from 1 to 2^63-1 (an int, not a bool)."""
    message = "run_id must be a whole number from 1 to 9223372036854775807"
class ParameterValueOutOfRange(DomainError):
    """An integer parameter value is outside its kind's range."""
    message = "{kind} parameter value is out of range"
    kind: str
class CounterOutOfRange(DomainError):
    """A counter is outside 0..2^63-1."""
    message = "counter {name} is outside 0..2^63-1"
    name: str
class VersionOutOfRange(DomainError):
    """A version is outside 0..2^63-1."""
    message = "version is outside 0..2^63-1"
class JsonNotEncodable(DomainError):
    """A document cannot be written as canonical JSON (docs/tables.md 3.5); `reason` says why."""
    message = "document cannot be encoded as canonical JSON: {reason}"
    reason: str
class TextNotUtf8(DomainError):
    """A text value contains an unpaired surrogate and cannot be stored as UTF-8."""
    message = "{kind} is not encodable as UTF-8"
    kind: str
class TextContainsNul(DomainError):
    """A text value contains U+0000, which PostgreSQL text and jsonb cannot store."""
    message = "{kind} contains a NUL character"
    kind: str
class StateSchemaVersionNotStorable(DomainError):
    """A schema version above 2^31-1: valid (u32) but not storable in an integer column."""
    message = "state schema version above 2147483647 cannot be stored"
class TimestampOutOfRange(DomainError):
    """An aware datetime whose instant has no UTC datetime (Python's years end at 1 and 9999)."""
    message = "timestamp has no UTC form within years 1..9999"
class PartitionContextTooLarge(DomainError):
    """A partition context envelope exceeds its bound (the contract's ContextTooLarge)."""
    message = "partition context exceeds {max_bytes} bytes"
    max_bytes: int

class LifecycleError(PyBatchError):
    """A lifecycle transition or version check failed (docs/contract.md, Lifecycle)."""
    message = "lifecycle error"
class StaleVersion(LifecycleError, RepositoryError):
    """The expected version is not the stored one."""
    message = "expected version {expected} but found {actual}"
    expected: int
    actual: int
class IllegalTransition(LifecycleError, RepositoryError):
    """The lifecycle table forbids this transition."""
    message = "transition from {from_status} to {to_status} is not allowed"
    from_status: str
    to_status: str
class StepsUnfinished(LifecycleError, RepositoryError):
    """A step's end was lost (a server crash or failover): the run ends FAILED; restart it."""
    message = (
        "job execution {id} cannot complete while its step execution {step_execution_id}"
        " is {status}"
    )
    id: int
    step_execution_id: int
    status: str
class RestartRequiresNewAttempt(LifecycleError, RepositoryError):
    """A STOPPED or FAILED execution never returns to STARTING; launch a new attempt."""
    message = "execution in {from_status} restarts only as a new attempt"
    from_status: str
class FailedTransitionMissingFailure(LifecycleError, RepositoryError):
    """A transition to FAILED carries no failure summary."""
    message = "transition to FAILED requires a failure summary"
class InvalidTransitionTime(LifecycleError, RepositoryError):
    """The transition instant is earlier than the execution's start or end."""
    message = "transition time is earlier than the execution's recorded times"
class VersionExhausted(LifecycleError, RepositoryError):
    """The version counter cannot be incremented."""
    message = "version {version} cannot be incremented"
    version: int
class CountExhausted(LifecycleError, RepositoryError):
    """A counter would exceed its bound."""
    message = "a counter would exceed its bound"

class DefinitionError(PyBatchError):
    """A job definition, token or upgrade value was invalid (docs/contract.md, Definitions)."""
    message = "invalid job definition"
class TokenInvalid(_BrokenTextRule, DefinitionError):
    """A definition token (revision, node id...) breaks a text rule."""
    subject = "{kind}"
    kind: str
class ManifestTooLarge(DefinitionError):
    """The manifest exceeds 65,536 bytes."""
    message = "definition manifest exceeds {max_bytes} bytes"
    max_bytes: int
class UpgradeSelfEdge(DefinitionError):
    """An upgrade edge connects a definition to itself."""
    message = "a definition upgrade cannot connect a definition to itself"
class DuplicateTargetStep(DefinitionError):
    """An upgrade maps two source steps onto one target step."""
    message = "a definition upgrade maps two source steps to one target step"
class EmptyStepMapping(DefinitionError):
    """An upgrade edge maps no step."""
    message = "a definition upgrade requires a step mapping"
class ManifestInvalid(DefinitionError):
    """The manifest is not a canonical JSON object without floats."""
    message = "definition manifest is not a canonical JSON object: {reason}"
    reason: str

class PlanError(PyBatchError):
    """A flow plan value was invalid."""
    message = "invalid flow plan value"
class ZeroStartLimit(PlanError):
    """A start limit of zero was given."""
    message = "start limit must be non-zero"

class StateError(PyBatchError):
    """A checkpoint or context envelope was invalid (docs/contract.md, State envelopes)."""
    message = "invalid durable state envelope"
class SchemaIdInvalid(_BrokenTextRule, StateError):
    """A state schema identifier breaks a text rule."""
    subject = "state schema identifier"
class StateTooLarge(StateError):
    """An encoded state envelope exceeds its byte limit."""
    message = "{kind} exceeds {max_bytes} bytes"
    kind: str
    max_bytes: int
class StateTooDeep(StateError):
    """A state envelope exceeds its JSON nesting limit."""
    message = "{kind} exceeds JSON depth {max_depth}"
    kind: str
    max_depth: int
class StateMalformed(_AtFault, StateError):
    """The bytes or values are not a valid state envelope; `path` and `type` name the value."""
    message = "{kind} is malformed"
    kind: str
    path: str | None = None
    value_type: str | None = None
class StatePayloadNotObject(StateError):
    """The state payload is not a JSON object."""
    message = "durable state payload must be a JSON object"
class ZeroSchemaVersion(StateError):
    """A state schema version is zero (or outside 1..2^32-1)."""
    message = "state schema version must be from 1 to 4294967295"

class FaultStateFormatError(PyBatchError):
    """A fault-state envelope could not be decoded or validated (docs/contract.md, Fault state)."""
    message = "fault state envelope is invalid"
class FaultStateEnvelopeInvalid(FaultStateFormatError):
    """A fault-state envelope broke a format rule; `reason` names it."""
    message = "fault state envelope refused: {reason}"
    reason: str

class FaultStateError(PyBatchError):
    """The durable fault-state store refused an operation (docs/contract.md, Chunk transactions)."""
    message = "fault state error"
class FaultStateUnbound(FaultStateError):
    """The fault-state store was used before `bind`."""
    message = "fault state is not bound to a step execution"
class FaultStateCorrupt(RepositoryError, FaultStateError):
    """Durable fault state is unusable; no work may begin."""
    message = "durable fault state is unusable and no work may begin"
class StaleReservation(FaultStateError):
    """A retry reservation lost its race or skipped an ordinal."""
    message = "retry reservation is stale"
class CapacityExhausted(FaultStateError):
    """The retry state already holds its maximum number of keys."""
    message = "retry state holds its maximum of {max} entries"
    max: int
class FaultStateUnavailable(FaultStateError):
    """The fault-state store could not reach the database."""
    message = "fault state store is unavailable"
class FaultStateCommitOutcomeUnknown(FaultStateError):
    """The reservation's COMMIT acknowledgement was lost."""
    message = "fault reservation commit outcome is unknown"

class RecoveryRequestError(PyBatchError):
    """A recovery request field was invalid."""
    message = "invalid recovery request"
class RecoveryFieldInvalid(_BrokenTextRule, RecoveryRequestError):
    """A recovery reason code or operator reference broke a text rule."""
    subject = "recovery {field}"
    field: str
class RecoveryEvidenceDigestInvalid(RecoveryRequestError):
    """The evidence digest is not 32 bytes."""
    message = "recovery evidence digest must be 32 bytes"

class RequestFieldError(PyBatchError):
    """An operator request field (actor, reason, operation id) was invalid."""
    message = "invalid request field"
class RequestFieldInvalid(_BrokenTextRule, RequestFieldError):
    """An actor, reason code or operation id is empty, too long or has an invalid character."""
    subject = "{field}"
    field: str

class OperatorError(PyBatchError):
    """An operator request could not be settled (docs/contract.md, Operator requests)."""
    message = "operator request error"

class RetentionError(PyBatchError):
    """A retention request or purge plan was refused (docs/contract.md, Retention and purge)."""
    message = "retention error"
class BatchBoundOutOfRange(RetentionError):
    """A purge batch bound outside 1..=1000."""
    message = "purge batch bound {requested} is outside 1 to 1000"
    requested: int
class AgeBoundTooSmall(RetentionError):
    """A purge minimum age below one hour."""
    message = "the minimum age of a purge is {minimum}"
    minimum: str
class NonTerminalStatus(RetentionError):
    """A purge status set named an active or UNKNOWN status."""
    message = "status {status} is not terminal and cannot be purged"
    status: str
class EmptyStatusSet(RetentionError):
    """A purge status set without any status."""
    message = "a purge needs at least one status"
class RetentionPlanStale(RetentionError, RepositoryError):
    """Apply found the plan's candidates changed since the survey; nothing was deleted."""
    message = "the purge plan is stale and nothing was deleted"
# One class each for the operator's and the retention service's variants of the same error.
class OperationIdConflict(OperatorError, RetentionError):
    """The operation id is already recorded for this action with another request; use a new id."""
    message = "operation id {operation_id} was already used for a different {action} request"
    action: str
    operation_id: str
class OperationOutcomeUnknown(OperatorError, RetentionError):
    """The COMMIT acknowledgement was lost; re-run with the same operation id to learn it."""
    message = (
        "the outcome of the request is unknown; re-run it with the same operation id, which "
        "replays a recorded outcome instead of acting twice"
    )

class ChunkTransactionError(PyBatchError):
    """A chunk transaction could not commit (docs/contract.md, Chunk transactions)."""
    message = "chunk transaction error"
class NotCommitted(ChunkTransactionError):
    """The chunk did not commit; nothing of it is durable. `reason` names the rule."""
    message = "chunk was not committed: {reason}"
    reason: str
class ChunkCommitOutcomeUnknown(ChunkTransactionError):
    """The chunk's COMMIT acknowledgement was lost; reload committed state before resuming."""
    message = "chunk commit outcome is unknown; reload committed state before resuming"
class StopRequested(ChunkTransactionError):
    """An operator asked the run to stop; the ETL API ends the step and the job STOPPED."""
    message = "a stop was requested for job execution {id}"
    id: int
class ChunkNotEnded(ChunkTransactionError):
    """A chunk block ended without a commit or a rollback; it was rolled back and counted."""
    message = (
        "chunk of step execution {step_execution_id} ended without commit or rollback; "
        "call chunk.commit(...) or chunk.rollback() before the with block ends"
    )
    step_execution_id: int
class SkipLimitExceeded(ChunkTransactionError):
    """More rows were rejected than skip_limit allows; raise skip_limit or fix the source rows."""
    message = (
        "step {step} would skip {skips} items, more than its skip limit of {limit}; nothing of "
        "the chunk was committed"
    )
    limit: int
    step: str
    skips: int

class BusinessTransactionError(PyBatchError):
    """A business statement run inside a chunk transaction failed; the chunk rolls back."""
    message = "business statement failed"
class Rejected(_AtFault, BusinessTransactionError):
    """The server rejected a business statement (data, integrity or syntax error)."""
    message = "business statement was rejected (SQLSTATE {sqlstate})"
    sqlstate: str
    constraint: str | None = None
    table: str | None = None
    column: str | None = None
class Cancelled(BusinessTransactionError):
    """A business statement was cancelled by the statement timeout."""
    message = "business statement was cancelled"
class LockTimeout(BusinessTransactionError):
    """A business statement waited past lock_timeout (55P03); the connection is kept."""
    message = "business statement timed out waiting for a lock (SQLSTATE 55P03)"
class TransientConflict(BusinessTransactionError):
    """A business statement lost a serialization conflict or a deadlock; the chunk may run again."""
    message = "business statement lost a transaction conflict (SQLSTATE {sqlstate})"
    sqlstate: str
class Infrastructure(BusinessTransactionError):
    """A business statement failed for an infrastructure reason; the connection was discarded."""
    message = "business statement failed for an infrastructure reason"

class ConfigError(PyBatchError):
    """A connection configuration value was out of bounds (docs/tables.md 6)."""
    message = "invalid pybatch configuration"
class EmptyConnectionString(ConfigError):
    """The DSN is empty; set PYBATCH_DSN or pass a connection string."""
    message = "PostgreSQL connection string is empty; set PYBATCH_DSN or pass --dsn"
class InvalidConnectionString(ConfigError):
    """The DSN cannot be parsed or carries a key pybatch does not allow."""
    message = "PostgreSQL connection string is invalid: {reason}"
    reason: str
class TlsOptionInConnectionString(ConfigError):
    """The DSN carries a TLS option; set TLS with PYBATCH_TLS or the configuration instead."""
    message = (
        "PostgreSQL TLS options do not belong in the DSN; set PYBATCH_TLS (verify-full or"
        " plaintext) or pass --plaintext, and PYBATCH_CA_FILE for the CA"
    )
class PoolSize(ConfigError):
    """The pool size (PYBATCH_POOL_SIZE) is outside 1..1024."""
    message = "pool size must be from 1 to 1024"
class EmptyCaCertificate(ConfigError):
    """The CA bundle is empty."""
    message = "CA certificate bundle is empty"
class CaCertificateTooLarge(ConfigError):
    """The CA bundle exceeds 1 MiB."""
    message = "CA certificate bundle exceeds {max_bytes} bytes"
    max_bytes: int
class TimeoutOutOfBounds(ConfigError):
    """A timeout is outside its bounds."""
    message = "PostgreSQL {timeout_class} timeout is outside its bounds ({bounds})"
    timeout_class: str
    bounds: str
class LockExceedsStatement(ConfigError):
    """The lock timeout is longer than the statement timeout."""
    message = "lock timeout must not exceed statement timeout"
class AcquireExceedsClose(ConfigError):
    """The acquire timeout is longer than the pool close timeout."""
    message = "acquire timeout must not exceed pool close timeout"
class UnitOfWorkAttempts(ConfigError):
    """The unit-of-work attempt bound is outside 1..10."""
    message = "unit of work attempts must be from 1 to 10"
class ClockSkewBoundOutOfRange(ConfigError):
    """The configured maximum clock skew is outside 100 ms..60 s."""
    message = "maximum clock skew must be from 100 ms to 60 s"
class StaleThresholdOutOfRange(ConfigError):
    """The configured stale threshold is outside 1 min..24 h."""
    message = "stale threshold must be from 1 minute to 24 hours"
class ClockSkewExceeded(ConfigError):
    """Checked per new connection: fix the host clock (NTP) or raise PYBATCH_MAX_CLOCK_SKEW_MS."""
    message = (
        "this host's clock is {skew_ms} ms {direction} the database server's, beyond the "
        "{bound_ms} ms allowed; synchronise the host clock (NTP) and connect again"
    )
    skew_ms: int
    direction: str
    bound_ms: int
class EnvironmentValueInvalid(ConfigError):
    """An environment variable could not be read as its setting."""
    message = "environment variable {variable} is not a valid {expected}"
    variable: str
    expected: str
class CommandArgumentInvalid(ConfigError):
    """A `pybatch` command-line argument cannot be read (exit code 2); the value is not quoted."""
    message = "command-line argument {argument} must be {expected}"
    argument: str
    expected: str
class InvalidTlsMode(ConfigError):
    """tls_mode is not a TlsMode member."""
    message = "TLS mode must be a TlsMode (VERIFY_FULL or PLAINTEXT)"
class InvalidPooler(ConfigError):
    """pooler is not a Pooler member."""
    message = "pooler must be a Pooler (NONE, SESSION or TRANSACTION)"
class CaCertificateNotBytes(ConfigError):
    """The CA bundle was not given as PEM bytes in a CaCertificate."""
    message = "CA certificate must be a CaCertificate holding PEM bytes"
class CaCertificateWithoutVerification(ConfigError):
    """A CA bundle only applies to verified TLS."""
    message = "a CA certificate applies only to TlsMode.VERIFY_FULL"
class DsnFileInsecure(ConfigError):
    """A DSN file readable or writable by others than its owner; make it mode 0600."""
    message = "the DSN file must have mode 0600 (found {mode})"
    mode: str
class DsnFileUnreadable(ConfigError):
    """The DSN file could not be read (the path is not shown)."""
    message = "the DSN file could not be read"
class UnknownStatement(ConfigError):
    """No shipped statement has this name (`pybatch sql show|explain`)."""
    message = "no statement is named {name}"
    name: str

class ExplorerError(PyBatchError):
    """An explorer page was refused or could not be read (docs/contract.md, Explorer)."""
    message = "explorer error"
class CursorError(PyBatchError):
    """A page cursor was refused; every leaf is also an ExplorerError (`Cursor(CursorError)`)."""
    message = "explorer cursor error"
class PageSizeOutOfRange(ExplorerError):
    """A page size outside 1..500."""
    message = "page size {requested} is outside 1..500"
    requested: int
class ExplorerAgeBoundTooSmall(ExplorerError):
    """An unresolved-executions age under the 60 s minimum."""
    message = "minimum age of {requested_seconds} s is below the 60 s minimum"
    requested_seconds: float
class CursorInvalid(CursorError, ExplorerError):
    """The cursor is malformed, tampered with, or of the wrong kind for its query; start over."""
    message = "the page cursor is invalid"
class CursorQueryMismatch(CursorError, ExplorerError):
    """An intact cursor presented with another query, filter or page size; keep them the same."""
    message = "the page cursor belongs to another query, filter or page size"
class ResponseTooLarge(ExplorerError):
    """A single row exceeds the response bound of a page."""
    message = "one row exceeds the page response bound (page size {limit})"
    limit: int
class ParameterFilterInvalid(ExplorerError):
    """A parameter filter is NAME=VALUE pairs (`--param`), each a valid parameter name once."""
    message = "a parameter filter takes 1 to {limit} NAME=VALUE pairs, each name once"
    limit: int
class ExplorerTimeout(ExplorerError):
    """The page's statement timeout cancelled it (SQLSTATE 57014)."""
    message = "the explorer page was cancelled by the statement timeout"
class ExplorerRepositoryError(ExplorerError):
    """The repository refused or failed the page; `error` is the repository's error."""
    message = "explorer: {error}"
    error: RepositoryError

class MigrationError(PyBatchError):
    """The schema migrator refused to run or failed."""
    message = "schema migration failed"
class NewerSchema(RepositoryError, MigrationError):
    """The schema is newer than this package supports (nothing was changed); upgrade pybatch."""
    message = "schema version {current} is newer than supported version {supported}"
    current: int
    supported: int
class MigrationChecksumMismatch(MigrationError):
    """An applied migration no longer matches the file this package ships."""
    message = "applied migration {version} does not match the shipped file"
    version: int
class MigrationHistoryInvalid(MigrationError):
    """The migration history is not a contiguous prefix of the shipped files."""
    message = "migration history is inconsistent at version {version}"
    version: int
class MigrationLockTimeout(MigrationError):
    """Another migrator (or a racing first install) held the migration lock too long; retry."""
    message = "timed out waiting for the migration lock"
class MigrationTableLockTimeout(MigrationError):
    """A long transaction holds a lock on a table the migration changes; end it or retry later."""
    message = "migration {version} timed out waiting for a table lock, {attempts} times"
    version: int
    attempts: int

class JobRunError(PyBatchError):
    """A job run ended the way its flow or its partitions decided (pybatch.etl)."""
    message = "the job run ended unsuccessfully"
class FlowEndedInFailure(JobRunError):
    """The job's flow reached its `fail` terminal state; the run ends FAILED."""
    message = "the flow ended in failure after node {node_id}"
    node_id: str
class PartitionsFailed(JobRunError):
    """A partitioned step ended without every partition COMPLETED."""
    message = "partitioned step {step_name} ended {status}; partitions not completed: {keys}"
    step_name: str
    status: str
    keys: tuple[str, ...]
class PartitionPlanNotPublished(JobRunError):
    """A joining worker waited in vain: no running attempt published the step's plan."""
    message = (
        "no running attempt of job {job_name} published a plan for step {step_name}"
        " within {waited_seconds} s"
    )
    job_name: str
    step_name: str
    waited_seconds: float
# fmt: on


#: Every error class, in table order.
ERRORS: tuple[type[PyBatchError], ...] = tuple(
    value
    for value in list(globals().values())
    if isinstance(value, type)
    and issubclass(value, PyBatchError)
    and value is not PyBatchError
    and not value.__name__.startswith("_")  # a mixin such as _BrokenTextRule
)

#: The family bases, in table order: the direct children of PyBatchError.
FAMILIES = tuple(error for error in ERRORS if error.__bases__ == (PyBatchError,))

__all__ = sorted(["ERRORS", "FAMILIES", "PyBatchError", "TextRule", *(e.__name__ for e in ERRORS)])
