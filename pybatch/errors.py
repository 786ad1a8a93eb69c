"""Every pybatch exception, one family after another (docs/contract.md, Errors).

    PyBatchError
        RepositoryError            repository operations (Repository errors)
        DomainError                value construction (Values)
        LifecycleError             transitions (Transition check order); every leaf is also a
                                   RepositoryError
        DefinitionError            definition tokens, manifests, upgrades (Definitions)
        PlanError                  start limits (Flow values)
        StateError                 checkpoint and context envelopes (State envelopes)
        FaultStateFormatError      fault-state envelope rules (Fault state)
        FaultStateError            the fault-state store (Chunk transactions)
        RecoveryRequestError       recovery request fields (Recovery vocabulary)
        RequestFieldError          actor, reason code, operation id (Names and tokens)
        ChunkTransactionError      chunk transactions (Chunk transactions)
        BusinessTransactionError   business statements in a chunk (Chunk transactions)
        ConfigError                connection configuration (Configuration)
        MigrationError             pybatch's schema migrator (Schema lifecycle)

The names in parentheses are headings of docs/contract.md.

Each family base is followed by its leaves, the contract's leaves first in its order. A leaf
with two families sits with the later one, where both bases exist: the lifecycle leaves (the
contract's `RepositoryError.Lifecycle`), `FaultStateCorrupt` (also a FaultStateError) and
`NewerSchema` (also a MigrationError). Leaves keep the contract's names and fields where
Python allows; tests/unit/test_error_hierarchy.py lists every difference. Messages are built
from the fields only: they never contain SQL, parameter values, row contents or the
connection string (docs/contract.md, Redaction).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

if TYPE_CHECKING:  # mypy's attrs plugin recognises a decorator, not a variable holding one
    from attrs import frozen as _error
else:
    _error = attrs.define(frozen=True, slots=False, kw_only=True, eq=False)


@_error
class PyBatchError(Exception):
    """Root of every error pybatch raises."""

    message: ClassVar[str] = "pybatch error"

    def __str__(self) -> str:
        return self.message.format(**attrs.asdict(self, recurse=False))

    def __reduce__(self) -> tuple[Any, ...]:  # keep errors picklable across processes
        return (_rebuild, (type(self), attrs.asdict(self, recurse=False)))


def _rebuild(cls: type[PyBatchError], fields: dict[str, Any]) -> PyBatchError:
    return cls(**fields)


class TextRule(enum.Enum):
    """The rule a validated text value broke; the value itself is never reported."""

    EMPTY = "empty"
    TOO_LONG = "too long"
    SURROUNDING_WHITESPACE = "surrounding whitespace"
    CONTROL_CHARACTER = "control character"
    #: Request fields allow `[A-Za-z0-9._:-]` only: white space and controls alike.
    INVALID_CHARACTER = "invalid character"


class _BrokenTextRule:
    """One error class per family for every text rule: `subject` then what `rule` says.

    Callers catch the family's class and read `rule`; the message names the subject, the
    rule and a bound or position, never the value.
    """

    subject: ClassVar[str]
    rule: TextRule
    max_bytes: int | None
    character_index: int | None = None

    def __str__(self) -> str:
        fields = attrs.asdict(self, recurse=False)  # type: ignore[arg-type]
        subject = self.subject.format(**fields)
        if self.rule is TextRule.EMPTY:
            return f"{subject} is empty"
        if self.rule is TextRule.TOO_LONG:
            return f"{subject} exceeds {self.max_bytes} bytes"
        if self.rule is TextRule.SURROUNDING_WHITESPACE:
            return f"{subject} has surrounding whitespace"
        if self.rule is TextRule.INVALID_CHARACTER:
            return f"{subject} contains an invalid character"
        at = "" if self.character_index is None else f" at index {self.character_index}"
        return f"{subject} contains a control character{at}"


# --------------------------------------------------------------------------------- RepositoryError
# The lifecycle leaves, FaultStateCorrupt and NewerSchema are RepositoryErrors too; they are
# written with their second family below.


class RepositoryError(PyBatchError):
    """An operation of the job repository failed."""

    message = "job repository error"


@_error
class SchemaUninitialized(RepositoryError):
    """The pybatch schema or its version row does not exist."""

    message = "metadata schema is not initialized"


@_error
class MigrationRequired(RepositoryError):
    """The installed schema is older than this package supports."""

    message = "schema version {current} requires migration to {supported}"
    current: int
    supported: int


@_error
class IdentifierOutOfRange(RepositoryError):
    """An identifier does not fit PostgreSQL bigint."""

    message = "{kind} identifier {value} exceeds PostgreSQL bigint"
    kind: str
    value: int


@_error
class JobInstanceNotFound(RepositoryError):
    """The job instance does not exist."""

    message = "job instance {id} was not found"
    id: int


@_error
class JobExecutionNotFound(RepositoryError):
    """The job execution does not exist."""

    message = "job execution {id} was not found"
    id: int


@_error
class StepExecutionNotFound(RepositoryError):
    """The step execution does not exist."""

    message = "step execution {id} was not found"
    id: int


@_error
class StepPartitionNotFound(RepositoryError):
    """The step partition does not exist."""

    message = "step partition {id} was not found"
    id: int


@_error
class PartitionStateCorrupt(RepositoryError):
    """Durable partition state is unusable; no work may begin."""

    message = "durable partition state is unusable and no work may begin"


@_error
class EmptyPartitionPlan(RepositoryError):
    """A partition plan needs at least one entry."""

    message = "partition plan must contain at least one entry"


@_error
class PartitionPlanTooLarge(RepositoryError):
    """A partition plan holds more entries than the bound."""

    message = "partition plan exceeds {max} entries"
    max: int


@_error
class DuplicatePartitionKey(RepositoryError):
    """Two entries of one plan share a byte-identical key."""

    message = "partition plan contains a duplicate key"


@_error
class PartitionPlanExists(RepositoryError):
    """The parent step already has a plan."""

    message = "step execution {step_execution_id} already has a partition plan"
    step_execution_id: int


@_error
class PartitionPlanNotCommitted(RepositoryError):
    """Workers start only after the plan is durably published."""

    message = "step execution {step_execution_id} partition plan must commit before assignment"
    step_execution_id: int


@_error
class PartitionUpdateNotAllowed(RepositoryError):
    """The partition's status forbids this update."""

    message = "step partition {id} cannot be updated from {status}"
    id: int
    status: str


@_error
class PartitionWorkerMismatch(RepositoryError):
    """The worker is the parent itself or belongs to another job execution."""

    message = "worker {worker} does not belong to partition {partition_id}"
    partition_id: int
    worker: int


@_error
class PartitionWorkerAlreadyAssigned(RepositoryError):
    """A worker step backs at most one partition."""

    message = "worker {worker} is already assigned to a partition"
    worker: int


@_error
class PartitionWorkerStale(RepositoryError):
    """The completion names a worker that no longer backs the partition."""

    message = "worker {worker} is not the current worker for partition {partition_id}"
    partition_id: int
    worker: int


@_error
class PartitionParentNotActive(RepositoryError):
    """The parent step's status forbids mutating its partitions."""

    message = "partition parent {step_execution_id} cannot mutate children from {status}"
    step_execution_id: int
    status: str


@_error
class PartitionAggregationIncomplete(RepositoryError):
    """A child (or its worker) has not reached a runtime-terminal status."""

    message = "step execution {step_execution_id} cannot aggregate a child in {status}"
    step_execution_id: int
    status: str


@_error
class CompletedInstance(RepositoryError):
    """The latest attempt of the instance is COMPLETED; it never runs again."""

    message = "job instance {id} is already completed"
    id: int
    #: The instance's history was purged; its tombstone says it completed.
    purged: bool = False

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} (its history was purged)" if self.purged else text


@_error
class AbandonedInstance(RepositoryError):
    """The latest attempt of the instance is ABANDONED; it never runs again."""

    message = "job instance {id} is abandoned"
    id: int
    #: The instance's history was purged; its tombstone says it was abandoned.
    purged: bool = False

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} (its history was purged)" if self.purged else text


@_error
class ExecutionAlreadyActive(RepositoryError):
    """The instance already has an unresolved execution."""

    message = "job instance {instance_id} already has execution {execution_id} in {status}"
    instance_id: int
    execution_id: int
    status: str


@_error
class DefinitionDrift(RepositoryError):
    """The same (job, revision) was registered with another manifest digest."""

    message = "job {job_name} definition revision {revision} has drifted"
    job_name: str
    revision: str


@_error
class DefinitionJobMismatch(RepositoryError):
    """The definition is bound to another job name."""

    message = "definition for job {actual} cannot be used for job {expected}"
    expected: str
    actual: str


@_error
class IncompatibleDefinition(RepositoryError):
    """A restart changed the definition digest without a direct registered upgrade."""

    message = "job instance {instance_id} has no direct compatible definition"
    instance_id: int


@_error
class UnsupportedManifestVersion(RepositoryError):
    """The manifest format is 0 or above 3."""

    message = "definition manifest format {format} is unsupported"
    format: int


@_error
class InvalidDefinitionUpgrade(RepositoryError):
    """An upgraded restart step has no mapping entry."""

    message = "definition upgrade for execution {execution_id} is incomplete"
    execution_id: int


@_error
class DefinitionUpgradeConflict(RepositoryError):
    """An upgrade edge or upgrade key conflicts with a registered one."""

    message = "job {job_name} definition upgrade conflicts"
    job_name: str


@_error
class RestartStateNotFound(RepositoryError):
    """A restart step has no source step in the previous attempt."""

    message = "restart execution {execution_id} has no durable source for step {step_name}"
    execution_id: int
    step_name: str


@_error
class StartLimitExceeded(RepositoryError):
    """The node has used up its start limit in this instance."""

    message = "job instance {instance_id} exhausted start limit {limit} for node {node_id}"
    instance_id: int
    node_id: str
    limit: int


@_error
class FlowStateCorrupt(RepositoryError):
    """Durable flow history is unusable; no work may begin."""

    message = "durable flow history is unusable and no work may begin"


@_error
class RecoveryNotAllowed(RepositoryError):
    """Only unresolved executions (STARTING, STARTED, STOPPING, UNKNOWN) can be recovered."""

    message = "job execution {id} in {status} cannot be recovered"
    id: int
    status: str


@_error
class ExecutionOwned(RepositoryError):
    """Another owner token is already recorded on the execution."""

    message = "job execution {id} is owned by another process"
    id: int


@_error
class ExecutionOwnershipNotAllowed(RepositoryError):
    """An owner can be claimed only while the execution is STARTING."""

    message = "job execution {id} in {status} cannot acquire process ownership"
    id: int
    status: str


@_error
class ExecutionOwnershipLost(RepositoryError):
    """This process no longer owns its execution; stop without touching it.

    Its lease lapsed and another process recovered it, or it was changed behind the owner.
    """

    message = (
        "job execution {id} is no longer owned by this process (lease lapsed or recovered "
        "by another process); its work stops here"
    )
    id: int


@_error
class PartitionOwnershipLost(RepositoryError):
    """This process no longer works on its partition; stop without touching it.

    Its worker's lease lapsed and another process recovered the partition (the worker step
    is FAILED with STALE_RECOVERED and the partition is claimable by a new worker), or the
    partition ended behind the worker.
    """

    message = (
        "partition {partition_id} is no longer worked on by worker step {worker} of this "
        "process (lease lapsed or recovered by another process); its work stops here"
    )
    partition_id: int
    worker: int


@_error
class UnsupportedCapability(RepositoryError):
    """A required capability is not declared."""

    message = "the adapter does not support {capability}"
    capability: str


@_error
class ConcurrentModification(RepositoryError):
    """A race backstop constraint refused the write."""

    message = "repository unit of work is based on a stale snapshot"


@_error
class CommitOutcomeUnknown(RepositoryError):
    """The COMMIT acknowledgement was lost; inspect durable state before acting."""

    message = "commit outcome is unknown; inspect durable metadata before recovery"


@_error
class Unavailable(RepositoryError):
    """Infrastructure failure, timeout or undecodable durable row (details redacted)."""

    message = "repository is unavailable"
    sqlstate: str | None = None

    def __str__(self) -> str:
        # The SQLSTATE is safe to show; the driver's message is not (it can quote values).
        return (
            self.message if self.sqlstate is None else f"{self.message} (SQLSTATE {self.sqlstate})"
        )


@_error
class DuplicateStep(RepositoryError):
    """A step with the same name or logical id already exists in the execution."""

    message = "job execution {job_execution_id} already has step {step_name} / logical id {node_id}"
    job_execution_id: int
    step_name: str
    node_id: str


@_error
class IntegrityViolation(RepositoryError):
    """A durable invariant refused the write; nothing was written."""

    message = "durable invariant {constraint} refused the write; nothing was written"
    constraint: str


@_error
class RetryableConflict(RepositoryError):
    """A serialization failure or deadlock aborted the unit of work; run it again."""

    message = "the database aborted the unit of work to resolve a conflict; retry it"
    sqlstate: str


@_error
class TransactionAborted(RepositoryError):
    """COMMIT of an already failed transaction rolled it back."""

    message = "the transaction had already failed; COMMIT rolled it back and nothing was written"


@_error
class UnitOfWorkClosed(RepositoryError):
    """The unit of work was already committed, rolled back or poisoned."""

    message = "the unit of work is closed"


@_error
class AuthenticationFailed(Unavailable):
    """The server refused the role or its password (28P01, 28000); retrying cannot help."""

    message = "the server refused the credentials"


@_error
class DatabaseNotFound(Unavailable):
    """The database named in the connection string does not exist (3D000)."""

    message = "the database named in the connection string does not exist"


@_error
class TlsVerificationFailed(Unavailable):
    """The server's certificate failed verification, or the server offers no TLS."""

    message = "the server's TLS certificate could not be verified"


@_error
class PermissionDenied(RepositoryError):
    """The role lacks a privilege the operation needs (42501); nothing was written."""

    message = (
        "permission denied: the role lacks a privilege this operation needs (SQLSTATE {sqlstate})"
    )
    sqlstate: str = "42501"


@_error
class RepositoryDomainError(RepositoryError):
    """A domain value refused inside a repository call; the DomainError is `error` and the cause.

    The contract's `RepositoryError.Domain(DomainError)`: `except RepositoryError` sees
    every failure of a repository call.
    """

    message = "invalid repository domain value: {error}"
    error: DomainError


# ------------------------------------------------------------------------------------- DomainError


class DomainError(PyBatchError):
    """A domain value was invalid (docs/contract.md, Values)."""

    message = "invalid repository domain value"


@_error
class NameInvalid(_BrokenTextRule, DomainError):
    """A name breaks a text rule: empty, too long, surrounding white space, a control character.

    `character_index` locates a control character; the character itself is never shown.
    """

    subject = "{kind} name"
    kind: str
    rule: TextRule
    max_bytes: int | None = None
    character_index: int | None = None


@_error
class ZeroIdentifier(DomainError):
    """An identifier is zero."""

    message = "{kind} identifier must be non-zero"
    kind: str


@_error
class ParameterStringTooLong(DomainError):
    """A string parameter value is longer than its byte bound."""

    message = "parameter string exceeds {max_bytes} bytes"
    max_bytes: int


@_error
class DuplicateParameter(DomainError):
    """A parameter name was given twice."""

    message = "duplicate job parameter name"


@_error
class InvalidTimestampOrder(DomainError):
    """Execution timestamps are out of order."""

    message = "execution timestamps are out of order"


@_error
class ActiveExecutionHasEndTime(DomainError):
    """An active execution carries an end time."""

    message = "an active execution cannot have an end time"


@_error
class FinishedExecutionMissingEndTime(DomainError):
    """A finished execution has no end time."""

    message = "a finished execution requires an end time"


@_error
class FailedExecutionMissingFailure(DomainError):
    """A FAILED execution has no failure summary."""

    message = "a failed execution requires a failure summary"


@_error
class NaiveTimestamp(DomainError):
    """A datetime without a time zone was given."""

    message = "timestamps must be timezone-aware"


@_error
class NegativeIdentifier(DomainError):
    """An identifier is negative or above the unsigned 64-bit range."""

    message = "{kind} identifier is outside 1..2^64-1"
    kind: str


@_error
class ParameterValueOutOfRange(DomainError):
    """An integer parameter value is outside its kind's range."""

    message = "{kind} parameter value is out of range"
    kind: str


@_error
class CounterOutOfRange(DomainError):
    """A counter is outside 0..2^63-1."""

    message = "counter {name} is outside 0..2^63-1"
    name: str


@_error
class VersionOutOfRange(DomainError):
    """A version is outside 0..2^63-1."""

    message = "version is outside 0..2^63-1"


@_error
class JsonNotEncodable(DomainError):
    """A document cannot be written as canonical JSON; `reason` names the rule.

    See docs/tables.md 3.5.
    """

    message = "document cannot be encoded as canonical JSON: {reason}"
    reason: str


@_error
class TextNotUtf8(DomainError):
    """A text value contains an unpaired surrogate and cannot be stored as UTF-8."""

    message = "{kind} is not encodable as UTF-8"
    kind: str


@_error
class TextContainsNul(DomainError):
    """A text value contains U+0000, which PostgreSQL text and jsonb cannot store."""

    message = "{kind} contains a NUL character"
    kind: str


@_error
class StateSchemaVersionNotStorable(DomainError):
    """A schema version above 2^31-1: valid (u32) but not storable in an integer column."""

    message = "state schema version above 2147483647 cannot be stored"


@_error
class TimestampOutOfRange(DomainError):
    """An aware datetime whose instant has no UTC datetime (Python's years end at 1 and 9999)."""

    message = "timestamp has no UTC form within years 1..9999"


@_error
class PartitionContextTooLarge(DomainError):
    """A partition context envelope exceeds its bound (the contract's ContextTooLarge)."""

    message = "partition context exceeds {max_bytes} bytes"
    max_bytes: int


# ---------------------------------------------------------------------------------- LifecycleError


class LifecycleError(PyBatchError):
    """A lifecycle transition or version check failed (docs/contract.md, Lifecycle)."""

    message = "lifecycle error"


@_error
class StaleVersion(LifecycleError, RepositoryError):
    """The expected version is not the stored one."""

    message = "expected version {expected} but found {actual}"
    expected: int
    actual: int


@_error
class IllegalTransition(LifecycleError, RepositoryError):
    """The lifecycle table forbids this transition."""

    message = "transition from {from_status} to {to_status} is not allowed"
    from_status: str
    to_status: str


@_error
class RestartRequiresNewAttempt(LifecycleError, RepositoryError):
    """A STOPPED or FAILED execution never returns to STARTING; launch a new attempt."""

    message = "execution in {from_status} restarts only as a new attempt"
    from_status: str


@_error
class FailedTransitionMissingFailure(LifecycleError, RepositoryError):
    """A transition to FAILED carries no failure summary."""

    message = "transition to FAILED requires a failure summary"


@_error
class InvalidTransitionTime(LifecycleError, RepositoryError):
    """The transition instant is earlier than the execution's start or end."""

    message = "transition time is earlier than the execution's recorded times"


@_error
class VersionExhausted(LifecycleError, RepositoryError):
    """The version counter cannot be incremented."""

    message = "version {version} cannot be incremented"
    version: int


@_error
class CountExhausted(LifecycleError, RepositoryError):
    """A counter would exceed its bound."""

    message = "a counter would exceed its bound"


# --------------------------------------------------------------------------------- DefinitionError


class DefinitionError(PyBatchError):
    """A job definition, token or upgrade value was invalid (docs/contract.md, Definitions)."""

    message = "invalid job definition"


@_error
class TokenInvalid(_BrokenTextRule, DefinitionError):
    """A definition token (revision, node id...) breaks a text rule."""

    subject = "{kind}"
    kind: str
    rule: TextRule
    max_bytes: int | None = None


@_error
class ManifestTooLarge(DefinitionError):
    """The manifest exceeds 65,536 bytes."""

    message = "definition manifest exceeds {max_bytes} bytes"
    max_bytes: int


@_error
class UpgradeSelfEdge(DefinitionError):
    """An upgrade edge connects a definition to itself."""

    message = "a definition upgrade cannot connect a definition to itself"


@_error
class DuplicateSourceStep(DefinitionError):
    """An upgrade maps a source step twice."""

    message = "a definition upgrade maps a source step twice"


@_error
class DuplicateTargetStep(DefinitionError):
    """An upgrade maps two source steps onto one target step."""

    message = "a definition upgrade maps two source steps to one target step"


@_error
class EmptyStepMapping(DefinitionError):
    """An upgrade edge maps no step."""

    message = "a definition upgrade requires a step mapping"


@_error
class ManifestInvalid(DefinitionError):
    """The manifest is not a canonical JSON object without floats."""

    message = "definition manifest is not a canonical JSON object: {reason}"
    reason: str


# --------------------------------------------------------------------------------------- PlanError


class PlanError(PyBatchError):
    """A flow plan value was invalid."""

    message = "invalid flow plan value"


@_error
class ZeroStartLimit(PlanError):
    """A start limit of zero was given."""

    message = "start limit must be non-zero"


# -------------------------------------------------------------------------------------- StateError


class StateError(PyBatchError):
    """A checkpoint or execution-context envelope was invalid.

    See docs/contract.md, State envelopes.
    """

    message = "invalid durable state envelope"


@_error
class SchemaIdInvalid(_BrokenTextRule, StateError):
    """A state schema identifier breaks a text rule."""

    subject = "state schema identifier"
    rule: TextRule
    max_bytes: int | None = None


@_error
class StateTooLarge(StateError):
    """An encoded state envelope exceeds its byte limit."""

    message = "{kind} exceeds {max_bytes} bytes"
    kind: str
    max_bytes: int


@_error
class StateTooDeep(StateError):
    """A state envelope exceeds its JSON nesting limit."""

    message = "{kind} exceeds JSON depth {max_depth}"
    kind: str
    max_depth: int


@_error
class StateMalformed(StateError):
    """The bytes or values are not a valid state envelope."""

    message = "{kind} is malformed"
    kind: str


@_error
class StateFormatMismatch(StateError):
    """The envelope belongs to the other durable-state kind."""

    message = "durable state is not a {kind}"
    kind: str


@_error
class UnsupportedStateFormatVersion(StateError):
    """The envelope format version is not 1."""

    message = "{kind} format version {version} is unsupported"
    kind: str
    version: int


@_error
class StatePayloadNotObject(StateError):
    """The state payload is not a JSON object."""

    message = "durable state payload must be a JSON object"


@_error
class StateSchemaMismatch(StateError):
    """The envelope schema is not the one the reader expects."""

    message = "{kind} schema does not match the component"
    kind: str


@_error
class UnsupportedStateSchemaVersion(StateError):
    """The envelope was written by a newer application schema version."""

    message = "{kind} schema version {found} is newer than supported version {current}"
    kind: str
    found: int
    current: int


@_error
class InvalidStateByteLimit(StateError):
    """A state byte limit is zero or above the hard ceiling."""

    message = "state byte limit must be between 1 and {maximum}"
    maximum: int


@_error
class InvalidStateDepthLimit(StateError):
    """A state depth limit is zero or above the hard ceiling."""

    message = "state depth limit must be between 1 and {maximum}"
    maximum: int


@_error
class ZeroSchemaVersion(StateError):
    """A state schema version is zero (or outside 1..2^32-1)."""

    message = "state schema version must be from 1 to 4294967295"


@_error
class StateEnvelopeInvalid(StateError):
    """A checkpoint or context envelope was refused; `reason` names the rule."""

    message = "durable state envelope refused: {reason}"
    reason: str


# --------------------------------------------------------------------------- FaultStateFormatError


class FaultStateFormatError(PyBatchError):
    """A fault-state envelope could not be decoded or validated (docs/contract.md, Fault state)."""

    message = "fault state envelope is invalid"


@_error
class FaultStateEnvelopeInvalid(FaultStateFormatError):
    """A fault-state envelope broke a format rule; `reason` names it."""

    message = "fault state envelope refused: {reason}"
    reason: str


# --------------------------------------------------------------------------------- FaultStateError


class FaultStateError(PyBatchError):
    """The durable fault-state store refused an operation (docs/contract.md, Chunk transactions)."""

    message = "fault state error"


@_error
class FaultStateUnbound(FaultStateError):
    """The fault-state store was used before `bind`."""

    message = "fault state is not bound to a step execution"


@_error
class FaultStateCorrupt(RepositoryError, FaultStateError):
    """Durable fault state is unusable; no work may begin."""

    message = "durable fault state is unusable and no work may begin"


@_error
class StaleReservation(FaultStateError):
    """A retry reservation lost its race, skipped an ordinal or named a non-retryable phase."""

    message = "retry reservation is stale"


@_error
class CapacityExhausted(FaultStateError):
    """The retry state already holds its maximum number of keys."""

    message = "retry state holds its maximum of {max} entries"
    max: int


@_error
class FaultStateUnavailable(FaultStateError):
    """The fault-state store could not reach the database."""

    message = "fault state store is unavailable"


@_error
class FaultStateCommitOutcomeUnknown(FaultStateError):
    """The reservation's COMMIT acknowledgement was lost."""

    message = "fault reservation commit outcome is unknown"


# ---------------------------------------------------------------------------- RecoveryRequestError


class RecoveryRequestError(PyBatchError):
    """A recovery request field was invalid."""

    message = "invalid recovery request"


@_error
class RecoveryFieldInvalid(_BrokenTextRule, RecoveryRequestError):
    """A recovery reason code or operator reference broke a text rule."""

    subject = "recovery {field}"
    field: str
    rule: TextRule
    max_bytes: int | None = None


@_error
class RecoveryEvidenceDigestInvalid(RecoveryRequestError):
    """The evidence digest is not 32 bytes."""

    message = "recovery evidence digest must be 32 bytes"


# ------------------------------------------------------------------------------- RequestFieldError


class RequestFieldError(PyBatchError):
    """An operator request field (actor, reason, operation id) was invalid."""

    message = "invalid request field"


@_error
class RequestFieldInvalid(_BrokenTextRule, RequestFieldError):
    """An actor, reason code or operation id is empty, too long or has an invalid character."""

    subject = "{field}"
    field: str
    rule: TextRule
    max_bytes: int | None = None


# ----------------------------------------------------------------------------------- OperatorError


class OperatorError(PyBatchError):
    """An operator request could not be settled (docs/contract.md, Operator requests)."""

    message = "operator request error"


# ---------------------------------------------------------------------------------- RetentionError


class RetentionError(PyBatchError):
    """A retention request or purge plan was refused.

    See docs/contract.md, Retention vocabulary; Holds; Retention and purge.
    """

    message = "retention error"


@_error
class BatchBoundOutOfRange(RetentionError):
    """A purge batch bound outside 1..=1000."""

    message = "purge batch bound {requested} is outside 1 to 1000"
    requested: int


@_error
class AgeBoundTooSmall(RetentionError):
    """A purge minimum age below one hour."""

    message = "the minimum age of a purge is {minimum}"
    minimum: str


@_error
class NonTerminalStatus(RetentionError):
    """A purge status set named an active or UNKNOWN status."""

    message = "status {status} is not terminal and cannot be purged"
    status: str


@_error
class EmptyStatusSet(RetentionError):
    """A purge status set without any status."""

    message = "a purge needs at least one status"


@_error
class RetentionPlanStale(RetentionError, RepositoryError):
    """Apply found the plan's candidates changed since the survey; nothing was deleted."""

    message = "the purge plan is stale and nothing was deleted"


@_error
class InstanceHeld(RetentionError):
    """The instance is held (vocabulary only)."""

    message = "job instance {job_instance_id} is held"
    job_instance_id: int


# One class each for the operator's and the retention service's variants of the same error.


@_error
class OperationIdConflict(OperatorError, RetentionError):
    """The operation id is already recorded for this action with a different request."""

    message = "operation id {operation_id} was already used for a different {action} request"
    action: str
    operation_id: str


@_error
class OperationOutcomeUnknown(OperatorError, RetentionError):
    """The COMMIT acknowledgement was lost; re-run with the same operation id to learn it."""

    message = (
        "the outcome of the request is unknown; re-run it with the same operation id, which "
        "replays a recorded outcome instead of acting twice"
    )


# --------------------------------------------------------------------------- ChunkTransactionError


class ChunkTransactionError(PyBatchError):
    """A chunk transaction could not commit (docs/contract.md, Chunk transactions)."""

    message = "chunk transaction error"


@_error
class NotCommitted(ChunkTransactionError):
    """The chunk did not commit; nothing of it is durable. `reason` names the rule."""

    message = "chunk was not committed: {reason}"
    reason: str


@_error
class ChunkCommitOutcomeUnknown(ChunkTransactionError):
    """The chunk's COMMIT acknowledgement was lost; reload committed state before resuming."""

    message = "chunk commit outcome is unknown; reload committed state before resuming"


@_error
class StopRequested(ChunkTransactionError):
    """An operator asked the run to stop; the ETL API ends the step and the job STOPPED."""

    message = "a stop was requested for job execution {id}"
    id: int


# ------------------------------------------------------------------------ BusinessTransactionError


class BusinessTransactionError(PyBatchError):
    """A business statement run inside a chunk transaction failed.

    See docs/contract.md, Chunk transactions.
    """

    message = "business statement failed"


@_error
class Rejected(BusinessTransactionError):
    """The server rejected a business statement (data, integrity or syntax error)."""

    message = "business statement was rejected (SQLSTATE {sqlstate})"
    sqlstate: str


@_error
class Cancelled(BusinessTransactionError):
    """A business statement was cancelled by the statement timeout."""

    message = "business statement was cancelled"


@_error
class LockTimeout(BusinessTransactionError):
    """A business statement waited longer than lock_timeout for a lock (55P03).

    The connection is healthy and kept; the chunk's transaction can only roll back.
    """

    message = "business statement timed out waiting for a lock (SQLSTATE 55P03)"


@_error
class Infrastructure(BusinessTransactionError):
    """A business statement failed for an infrastructure reason; the connection was discarded."""

    message = "business statement failed for an infrastructure reason"


# ------------------------------------------------------------------------------------- ConfigError


class ConfigError(PyBatchError):
    """A connection configuration value was out of bounds (docs/tables.md 6)."""

    message = "invalid pybatch configuration"


@_error
class EmptyConnectionString(ConfigError):
    """The DSN is empty."""

    message = "PostgreSQL connection string is empty"


@_error
class InvalidConnectionString(ConfigError):
    """The DSN cannot be parsed or carries a key pybatch does not allow."""

    message = "PostgreSQL connection string is invalid: {reason}"
    reason: str


@_error
class TlsOptionInConnectionString(ConfigError):
    """The DSN carries a TLS option; TLS is set through the configuration only."""

    message = "PostgreSQL TLS options must use pybatch's TLS configuration, not the DSN"


@_error
class PoolSize(ConfigError):
    """The pool size is outside 1..1024."""

    message = "pool size must be from 1 to 1024"


@_error
class EmptyCaCertificate(ConfigError):
    """The CA bundle is empty."""

    message = "CA certificate bundle is empty"


@_error
class CaCertificateTooLarge(ConfigError):
    """The CA bundle exceeds 1 MiB."""

    message = "CA certificate bundle exceeds {max_bytes} bytes"
    max_bytes: int


@_error
class TimeoutOutOfBounds(ConfigError):
    """A timeout is outside its bounds."""

    message = "PostgreSQL {timeout_class} timeout is outside its bounds ({bounds})"
    timeout_class: str
    bounds: str


@_error
class LockExceedsStatement(ConfigError):
    """The lock timeout is longer than the statement timeout."""

    message = "lock timeout must not exceed statement timeout"


@_error
class AcquireExceedsClose(ConfigError):
    """The acquire timeout is longer than the pool close timeout."""

    message = "acquire timeout must not exceed pool close timeout"


@_error
class UnitOfWorkAttempts(ConfigError):
    """The unit-of-work attempt bound is outside 1..10."""

    message = "unit of work attempts must be from 1 to 10"


@_error
class ClockSkewBoundOutOfRange(ConfigError):
    """The configured maximum clock skew is outside 100 ms..60 s."""

    message = "maximum clock skew must be from 100 ms to 60 s"


@_error
class StaleThresholdOutOfRange(ConfigError):
    """The configured stale threshold is outside 1 min..24 h."""

    message = "stale threshold must be from 1 minute to 24 hours"


@_error
class ClockSkewExceeded(ConfigError):
    """This host's clock is further from the database server's than the configured bound.

    Measured on every new pooled connection, the first one when the repository connects.
    The fix is on the host: synchronise its clock (NTP), or, if the distance is expected,
    raise PYBATCH_MAX_CLOCK_SKEW_MS (at most 60 s).
    """

    message = (
        "this host's clock is {skew_ms} ms {direction} the database server's, beyond the "
        "{bound_ms} ms allowed; synchronise the host clock (NTP) and connect again"
    )
    skew_ms: int
    direction: str
    bound_ms: int


@_error
class EnvironmentValueInvalid(ConfigError):
    """An environment variable could not be read as its setting."""

    message = "environment variable {variable} is not a valid {expected}"
    variable: str
    expected: str


@_error
class CommandArgumentInvalid(ConfigError):
    """A `pybatch` command-line argument cannot be read (exit code 2); the value is not quoted."""

    message = "command-line argument {argument} must be {expected}"
    argument: str
    expected: str


@_error
class InvalidTlsMode(ConfigError):
    """tls_mode is not a TlsMode member."""

    message = "TLS mode must be a TlsMode (VERIFY_FULL or PLAINTEXT)"


@_error
class CaCertificateNotBytes(ConfigError):
    """The CA bundle was not given as PEM bytes in a CaCertificate."""

    message = "CA certificate must be a CaCertificate holding PEM bytes"


@_error
class CaCertificateWithoutVerification(ConfigError):
    """A CA bundle only applies to verified TLS."""

    message = "a CA certificate applies only to TlsMode.VERIFY_FULL"


@_error
class DsnFileInsecure(ConfigError):
    """A DSN file readable or writable by others than its owner (it must be mode 0600)."""

    message = "the DSN file must have mode 0600 (found {mode})"
    mode: str


@_error
class DsnFileUnreadable(ConfigError):
    """The DSN file could not be read (the path is not shown)."""

    message = "the DSN file could not be read"


@_error
class UnknownStatement(ConfigError):
    """No shipped statement has this name (`pybatch sql show|explain`)."""

    message = "no statement is named {name}"
    name: str


# ---------------------------------------------------------------------- ExplorerError, CursorError


class ExplorerError(PyBatchError):
    """An explorer page was refused or could not be read.

    See docs/contract.md, Explorer vocabulary; Explorer.
    """

    message = "explorer error"


class CursorError(PyBatchError):
    """A page cursor was refused; every leaf is also an ExplorerError (`Cursor(CursorError)`)."""

    message = "explorer cursor error"


@_error
class PageSizeOutOfRange(ExplorerError):
    """A page size outside 1..500."""

    message = "page size {requested} is outside 1..500"
    requested: int


@_error
class ExplorerAgeBoundTooSmall(ExplorerError):
    """An unresolved-executions age under the 60 s minimum."""

    message = "minimum age of {requested_seconds} s is below the 60 s minimum"
    requested_seconds: float


@_error
class CursorInvalid(CursorError, ExplorerError):
    """The cursor is malformed, tampered with, or of the wrong kind for its query."""

    message = "the page cursor is invalid"


@_error
class CursorQueryMismatch(CursorError, ExplorerError):
    """An intact cursor presented with another query, filter or page size."""

    message = "the page cursor belongs to another query, filter or page size"


@_error
class ResponseTooLarge(ExplorerError):
    """A single row exceeds the response bound of a page."""

    message = "one row exceeds the page response bound (page size {limit})"
    limit: int


@_error
class ExplorerTimeout(ExplorerError):
    """The page's statement timeout cancelled it (SQLSTATE 57014)."""

    message = "the explorer page was cancelled by the statement timeout"


@_error
class ExplorerRepositoryError(ExplorerError):
    """The repository refused or failed the page; `error` is the repository's error."""

    message = "explorer: {error}"
    error: RepositoryError


# ---------------------------------------------------------------------------------- MigrationError


class MigrationError(PyBatchError):
    """The schema migrator refused to run or failed."""

    message = "schema migration failed"


@_error
class NewerSchema(RepositoryError, MigrationError):
    """The installed schema is newer than this package supports; nothing was changed."""

    message = "schema version {current} is newer than supported version {supported}"
    current: int
    supported: int


@_error
class MigrationChecksumMismatch(MigrationError):
    """An applied migration no longer matches the file this package ships."""

    message = "applied migration {version} does not match the shipped file"
    version: int


@_error
class MigrationHistoryInvalid(MigrationError):
    """The migration history is not a contiguous prefix of the shipped files."""

    message = "migration history is inconsistent at version {version}"
    version: int


@_error
class MigrationLockTimeout(MigrationError):
    """Another migrator held the migration history lock for longer than the lock timeout.

    Also raised when a first install keeps colliding with concurrent first installs.
    """

    message = "timed out waiting for the migration lock"


# ------------------------------------------------------------------------------------- JobRunError


class JobRunError(PyBatchError):
    """A job run ended the way its flow or its partitions decided (pybatch.etl)."""

    message = "the job run ended unsuccessfully"


@_error
class FlowEndedInFailure(JobRunError):
    """The job's flow reached its `fail` terminal state; the run ends FAILED."""

    message = "the flow ended in failure after node {node_id}"
    node_id: str


@_error
class PartitionsFailed(JobRunError):
    """A partitioned step ended without every partition COMPLETED."""

    message = "partitioned step {step_name} ended {status}; partitions not completed: {keys}"
    step_name: str
    status: str
    keys: tuple[str, ...]


@_error
class PartitionPlanNotPublished(JobRunError):
    """A joining worker waited in vain: no running attempt published the step's plan."""

    message = (
        "no running attempt of job {job_name} published a plan for step {step_name}"
        " within {waited_seconds} s"
    )
    job_name: str
    step_name: str
    waited_seconds: float


__all__ = [
    "AbandonedInstance",
    "AcquireExceedsClose",
    "ActiveExecutionHasEndTime",
    "AgeBoundTooSmall",
    "AuthenticationFailed",
    "BatchBoundOutOfRange",
    "BusinessTransactionError",
    "CaCertificateNotBytes",
    "CaCertificateTooLarge",
    "CaCertificateWithoutVerification",
    "Cancelled",
    "CapacityExhausted",
    "ChunkCommitOutcomeUnknown",
    "ChunkTransactionError",
    "ClockSkewBoundOutOfRange",
    "ClockSkewExceeded",
    "CommandArgumentInvalid",
    "CommitOutcomeUnknown",
    "CompletedInstance",
    "ConcurrentModification",
    "ConfigError",
    "CountExhausted",
    "CounterOutOfRange",
    "CursorError",
    "CursorInvalid",
    "CursorQueryMismatch",
    "DatabaseNotFound",
    "DefinitionDrift",
    "DefinitionError",
    "DefinitionJobMismatch",
    "DefinitionUpgradeConflict",
    "DomainError",
    "DsnFileInsecure",
    "DsnFileUnreadable",
    "DuplicateParameter",
    "DuplicatePartitionKey",
    "DuplicateSourceStep",
    "DuplicateStep",
    "DuplicateTargetStep",
    "EmptyCaCertificate",
    "EmptyConnectionString",
    "EmptyPartitionPlan",
    "EmptyStatusSet",
    "EmptyStepMapping",
    "EnvironmentValueInvalid",
    "ExecutionAlreadyActive",
    "ExecutionOwned",
    "ExecutionOwnershipLost",
    "ExecutionOwnershipNotAllowed",
    "ExplorerAgeBoundTooSmall",
    "ExplorerError",
    "ExplorerRepositoryError",
    "ExplorerTimeout",
    "FailedExecutionMissingFailure",
    "FailedTransitionMissingFailure",
    "FaultStateCommitOutcomeUnknown",
    "FaultStateCorrupt",
    "FaultStateEnvelopeInvalid",
    "FaultStateError",
    "FaultStateFormatError",
    "FaultStateUnavailable",
    "FaultStateUnbound",
    "FinishedExecutionMissingEndTime",
    "FlowEndedInFailure",
    "FlowStateCorrupt",
    "IdentifierOutOfRange",
    "IllegalTransition",
    "IncompatibleDefinition",
    "Infrastructure",
    "InstanceHeld",
    "IntegrityViolation",
    "InvalidConnectionString",
    "InvalidDefinitionUpgrade",
    "InvalidStateByteLimit",
    "InvalidStateDepthLimit",
    "InvalidTimestampOrder",
    "InvalidTlsMode",
    "InvalidTransitionTime",
    "JobExecutionNotFound",
    "JobInstanceNotFound",
    "JobRunError",
    "JsonNotEncodable",
    "LifecycleError",
    "LockExceedsStatement",
    "LockTimeout",
    "ManifestInvalid",
    "ManifestTooLarge",
    "MigrationChecksumMismatch",
    "MigrationError",
    "MigrationHistoryInvalid",
    "MigrationLockTimeout",
    "MigrationRequired",
    "NaiveTimestamp",
    "NameInvalid",
    "NegativeIdentifier",
    "NewerSchema",
    "NonTerminalStatus",
    "NotCommitted",
    "OperationIdConflict",
    "OperationOutcomeUnknown",
    "OperatorError",
    "PageSizeOutOfRange",
    "ParameterStringTooLong",
    "ParameterValueOutOfRange",
    "PartitionAggregationIncomplete",
    "PartitionContextTooLarge",
    "PartitionOwnershipLost",
    "PartitionParentNotActive",
    "PartitionPlanExists",
    "PartitionPlanNotCommitted",
    "PartitionPlanNotPublished",
    "PartitionPlanTooLarge",
    "PartitionStateCorrupt",
    "PartitionUpdateNotAllowed",
    "PartitionWorkerAlreadyAssigned",
    "PartitionWorkerMismatch",
    "PartitionWorkerStale",
    "PartitionsFailed",
    "PermissionDenied",
    "PlanError",
    "PoolSize",
    "PyBatchError",
    "RecoveryEvidenceDigestInvalid",
    "RecoveryFieldInvalid",
    "RecoveryNotAllowed",
    "RecoveryRequestError",
    "Rejected",
    "RepositoryDomainError",
    "RepositoryError",
    "RequestFieldError",
    "RequestFieldInvalid",
    "ResponseTooLarge",
    "RestartRequiresNewAttempt",
    "RestartStateNotFound",
    "RetentionError",
    "RetentionPlanStale",
    "RetryableConflict",
    "SchemaIdInvalid",
    "SchemaUninitialized",
    "StaleReservation",
    "StaleThresholdOutOfRange",
    "StaleVersion",
    "StartLimitExceeded",
    "StateEnvelopeInvalid",
    "StateError",
    "StateFormatMismatch",
    "StateMalformed",
    "StatePayloadNotObject",
    "StateSchemaMismatch",
    "StateSchemaVersionNotStorable",
    "StateTooDeep",
    "StateTooLarge",
    "StepExecutionNotFound",
    "StepPartitionNotFound",
    "StopRequested",
    "TextContainsNul",
    "TextNotUtf8",
    "TextRule",
    "TimeoutOutOfBounds",
    "TimestampOutOfRange",
    "TlsOptionInConnectionString",
    "TlsVerificationFailed",
    "TokenInvalid",
    "TransactionAborted",
    "Unavailable",
    "UnitOfWorkAttempts",
    "UnitOfWorkClosed",
    "UnknownStatement",
    "UnsupportedCapability",
    "UnsupportedManifestVersion",
    "UnsupportedStateFormatVersion",
    "UnsupportedStateSchemaVersion",
    "UpgradeSelfEdge",
    "VersionExhausted",
    "VersionOutOfRange",
    "ZeroIdentifier",
    "ZeroSchemaVersion",
    "ZeroStartLimit",
]
