"""The error table of pybatch.errors, checked row by row and against the contract's catalogue.

The table (`errors.ERRORS`, one compact class per error) gives each error's families (its
bases), fields, message and hint; the tests here build every row from its fields, pickle it and
check docs/errors.md is rendered from it, without restating it. What the table must agree with
is the contract: `REPOSITORY_ROWS` and `FAMILY_ROWS` copy the contract's catalogue rows in its
order, as `Name{fields}` (repository errors) or `Family.Variant{fields}` (the other families),
each mapped to the pybatch families it must belong to. Where pybatch differs on purpose, the
difference is written down as data with its reason: `RENAMED` (another class name),
`FIELD_RENAMES` (another field name), `NOT_DEFINED` (no class), `CATALOGUE_FAMILIES` (a family
pybatch folds or lacks), `SECOND_FAMILY` (a family pybatch adds) and `PYBATCH_ONLY` (errors
beyond the contract), so a new class cannot slip in unaccounted for.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from pybatch import errors
from pybatch._config import CaCertificate, ConnectionConfig
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.fault import FAULT_STATE_SCHEMA, FaultStateEnvelope
from pybatch.values.names import DefinitionRevision, JobName, ParameterName, StateSchemaId
from pybatch.values.parameters import ParameterValue
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.state import Checkpoint
from tools.errors_catalogue import catalogue

Families = tuple[type[errors.PyBatchError], ...]

REPOSITORY: Families = (errors.RepositoryError,)
DOMAIN: Families = (errors.DomainError,)
# The repository row `Lifecycle(LifecycleError)`: every lifecycle leaf is also a RepositoryError.
LIFECYCLE: Families = (errors.LifecycleError, errors.RepositoryError)
DEFINITION: Families = (errors.DefinitionError,)
PLAN: Families = (errors.PlanError,)
STATE: Families = (errors.StateError,)
FAULT_FORMAT: Families = (errors.FaultStateFormatError,)
FAULT_STATE: Families = (errors.FaultStateError,)
RECOVERY_REQUEST: Families = (errors.RecoveryRequestError,)
REQUEST_FIELD: Families = (errors.RequestFieldError,)
CHUNK: Families = (errors.ChunkTransactionError,)
BUSINESS: Families = (errors.BusinessTransactionError,)
CONFIG: Families = (errors.ConfigError,)
MIGRATION: Families = (errors.MigrationError,)
OPERATOR: Families = (errors.OperatorError,)
RETENTION: Families = (errors.RetentionError,)
EXPLORER: Families = (errors.ExplorerError,)
# The explorer row `ExplorerError.Cursor(CursorError)`: every cursor leaf is also an ExplorerError.
CURSOR: Families = (errors.CursorError, errors.ExplorerError)

#: The repository errors, row by row: every variant is a RepositoryError.
REPOSITORY_ROWS: dict[str, Families] = {
    "SchemaUninitialized": REPOSITORY,
    "MigrationRequired{current, supported}": REPOSITORY,
    "NewerSchema{current, supported}": REPOSITORY,
    "IdentifierOutOfRange{kind, value}": REPOSITORY,
    "JobInstanceNotFound{id}": REPOSITORY,
    "JobExecutionNotFound{id}": REPOSITORY,
    "StepExecutionNotFound{id}": REPOSITORY,
    "StepPartitionNotFound{id}": REPOSITORY,
    "EmptyPartitionPlan": REPOSITORY,
    "PartitionPlanTooLarge{max}": REPOSITORY,
    "DuplicatePartitionKey": REPOSITORY,
    "PartitionPlanExists{step_execution_id}": REPOSITORY,
    "PartitionPlanNotCommitted{step_execution_id}": REPOSITORY,
    "PartitionUpdateNotAllowed{id, status}": REPOSITORY,
    "PartitionWorkerMismatch{partition_id, worker}": REPOSITORY,
    "PartitionWorkerAlreadyAssigned{worker}": REPOSITORY,
    "PartitionWorkerStale{partition_id, worker}": REPOSITORY,
    "PartitionParentNotActive{step_execution_id, status}": REPOSITORY,
    "PartitionAggregationIncomplete{step_execution_id, status}": REPOSITORY,
    "PartitionStateCorrupt": REPOSITORY,
    "CompletedInstance{id}": REPOSITORY,
    "AbandonedInstance{id}": REPOSITORY,
    "ExecutionAlreadyActive{instance_id, execution_id, status}": REPOSITORY,
    "DefinitionDrift{job_name, revision}": REPOSITORY,
    "DefinitionJobMismatch{expected, actual}": REPOSITORY,
    "IncompatibleDefinition{instance_id}": REPOSITORY,
    "UnsupportedManifestVersion{format}": REPOSITORY,
    "InvalidDefinitionUpgrade{execution_id}": REPOSITORY,
    "DefinitionUpgradeConflict{job_name}": REPOSITORY,
    "RestartStateNotFound{execution_id, step_name}": REPOSITORY,
    "FaultStateCorrupt": REPOSITORY,
    "StartLimitExceeded{instance_id, node_id, limit}": REPOSITORY,
    "FlowStateCorrupt": REPOSITORY,
    "RecoveryNotAllowed{id, status}": REPOSITORY,
    "ExecutionOwned{id}": REPOSITORY,
    "ExecutionOwnershipNotAllowed{id, status}": REPOSITORY,
    "Domain(DomainError)": REPOSITORY,
    # `Lifecycle(LifecycleError)`: see LIFECYCLE and the LifecycleError rows of FAMILY_ROWS.
    "RetentionPlanStale": REPOSITORY,
    "UnsupportedCapability{capability}": REPOSITORY,
    "ConcurrentModification": REPOSITORY,
    "CommitOutcomeUnknown": REPOSITORY,
    "Unavailable": REPOSITORY,
    "DuplicateStep{job_execution_id, step_name, node_id}": REPOSITORY,
    "IntegrityViolation{constraint}": REPOSITORY,
    "RetryableConflict{sqlstate}": REPOSITORY,
    "TransactionAborted": REPOSITORY,
    # "Seed variants pybatch does not raise" (after the repository table):
    "DuplicateIdentifier{kind, value}": REPOSITORY,
    "Identifier(IdGenerationError)": REPOSITORY,
}

#: The other families, family by family, with the variants the contract names for them
#: (the transition check order for LifecycleError, the text values and state envelopes for
#: StateError, the text values for the token errors).
FAMILY_ROWS: dict[str, Families] = {
    "DomainError.EmptyName": DOMAIN,
    "DomainError.NameTooLong": DOMAIN,
    "DomainError.NameHasSurroundingWhitespace": DOMAIN,
    "DomainError.NameContainsControl{character_index}": DOMAIN,
    "DomainError.ZeroIdentifier{kind}": DOMAIN,
    "DomainError.ParameterStringTooLong": DOMAIN,
    "DomainError.DuplicateParameter": DOMAIN,
    "DomainError.InvalidTimestampOrder": DOMAIN,
    "DomainError.ActiveExecutionHasEndTime": DOMAIN,
    "DomainError.FinishedExecutionMissingEndTime": DOMAIN,
    "DomainError.FailedExecutionMissingFailure": DOMAIN,
    "DomainError.NaiveTimestamp": DOMAIN,
    "LifecycleError.StaleVersion{expected, actual}": LIFECYCLE,
    "LifecycleError.IllegalTransition{from, to}": LIFECYCLE,
    "LifecycleError.RestartRequiresNewAttempt{from}": LIFECYCLE,
    "LifecycleError.NotRestartable{status}": LIFECYCLE,
    "LifecycleError.AttemptIdentifierReused": LIFECYCLE,
    "LifecycleError.FailedTransitionMissingFailure": LIFECYCLE,
    "LifecycleError.InvalidTransitionTime{source}": LIFECYCLE,
    "LifecycleError.VersionExhausted{version}": LIFECYCLE,
    "LifecycleError.CountExhausted": LIFECYCLE,
    "DefinitionError.EmptyToken{kind}": DEFINITION,
    "DefinitionError.TokenTooLong{kind}": DEFINITION,
    "DefinitionError.SurroundingWhitespace{kind}": DEFINITION,
    "DefinitionError.ControlCharacter{kind}": DEFINITION,
    "DefinitionError.ManifestTooLarge": DEFINITION,
    "DefinitionError.UpgradeSelfEdge": DEFINITION,
    "DefinitionError.DuplicateSourceStep": DEFINITION,
    "DefinitionError.DuplicateTargetStep": DEFINITION,
    "DefinitionError.EmptyStepMapping": DEFINITION,
    # Deviation: format 0 and formats above 3 are reported by registration as the contract's
    # own repository mapping, UnsupportedManifestVersion; there is no value-level error.
    "ManifestError.MissingFormat": REPOSITORY,
    "ManifestError.UnsupportedFormat": REPOSITORY,
    # Deviation: ManifestError is folded into DefinitionError (see CATALOGUE_FAMILIES).
    "ManifestError.ParseCanonicalFloatDigest": DEFINITION,
    "PlanError.ZeroStartLimit": PLAN,
    "StateError.TooLarge": STATE,
    "StateError.TooDeep": STATE,
    "StateError.Malformed": STATE,
    "StateError.FormatMismatch": STATE,
    "StateError.UnsupportedFormatVersion": STATE,
    "StateError.PayloadNotObject": STATE,
    "StateError.SchemaMismatch": STATE,
    "StateError.UnsupportedSchemaVersion": STATE,
    "StateError.InvalidByteLimit": STATE,
    "StateError.InvalidDepthLimit": STATE,
    "StateError.EmptySchemaId": STATE,
    "StateError.SchemaIdTooLong": STATE,
    "StateError.SchemaIdHasSurroundingWhitespace": STATE,
    "StateError.SchemaIdContainsControl": STATE,
    "FaultStateFormatError.EnvelopeRules": FAULT_FORMAT,
    "FaultStateFormatError.TooManyEntries": FAULT_FORMAT,
    "FaultStateFormatError.OrdinalAboveLimit": FAULT_FORMAT,
    "FaultStateFormatError.CheckpointMismatch": FAULT_FORMAT,
    "FaultStateError.Unbound": FAULT_STATE,
    "FaultStateError.Corrupt": FAULT_STATE,
    "FaultStateError.StaleReservation": FAULT_STATE,
    "FaultStateError.CapacityExhausted{max}": FAULT_STATE,
    "FaultStateError.Unavailable": FAULT_STATE,
    "FaultStateError.CommitOutcomeUnknown": FAULT_STATE,
    "RecoveryRequestError.Empty{field}": RECOVERY_REQUEST,
    "RecoveryRequestError.TooLong{field, max_bytes}": RECOVERY_REQUEST,
    "RecoveryRequestError.SurroundingWhitespace{field}": RECOVERY_REQUEST,
    "RecoveryRequestError.ControlCharacter{field}": RECOVERY_REQUEST,
    "RequestFieldError.Empty": REQUEST_FIELD,
    "RequestFieldError.TooLong": REQUEST_FIELD,
    "RequestFieldError.InvalidCharacter{field}": REQUEST_FIELD,
    "OperatorError.OperationIdConflict{action, operation_id}": OPERATOR,
    "OperatorError.OperationOutcomeUnknown": OPERATOR,
    "RetentionError.BatchBoundOutOfRange{requested}": RETENTION,
    "RetentionError.AgeBoundTooSmall{minimum}": RETENTION,
    "RetentionError.NonTerminalStatus{status}": RETENTION,
    "RetentionError.EmptyStatusSet": RETENTION,
    "RetentionError.RetentionPlanStale": RETENTION,
    "RetentionError.InstanceHeld{job_instance_id}": RETENTION,
    "RetentionError.OperationIdConflict{action, operation_id}": RETENTION,
    "RetentionError.OperationOutcomeUnknown": RETENTION,
    "ChunkTransactionError.NotCommitted": CHUNK,
    "ChunkTransactionError.CommitOutcomeUnknown": CHUNK,
    "BusinessTransactionError.Rejected": BUSINESS,
    "BusinessTransactionError.Cancelled": BUSINESS,
    "BusinessTransactionError.Infrastructure": BUSINESS,
    "ConfigError.EmptyConnectionString": CONFIG,
    "ConfigError.InvalidConnectionString": CONFIG,
    "ConfigError.TlsOptionInConnectionString": CONFIG,
    "ConfigError.PoolSize": CONFIG,
    "ConfigError.EmptyCaCertificate": CONFIG,
    "ConfigError.CaCertificateTooLarge{max_bytes}": CONFIG,
    "ConfigError.Timeout{class}": CONFIG,
    "ConfigError.LockExceedsStatement": CONFIG,
    "ConfigError.AcquireExceedsClose": CONFIG,
    "ConfigError.UnitOfWorkAttempts": CONFIG,
    "ExplorerError.PageSizeOutOfRange{requested}": EXPLORER,
    "ExplorerError.AgeBoundTooSmall": EXPLORER,
    "CursorError.CursorInvalid": CURSOR,
    "CursorError.CursorQueryMismatch": CURSOR,
    "ExplorerError.ResponseTooLarge{limit}": EXPLORER,
    "ExplorerError.Timeout": EXPLORER,
    "ExplorerError.UnsupportedCapability": EXPLORER,
    "ExplorerError.Repository": EXPLORER,
}

#: The catalogue's families: contract family -> pybatch family base, or None if pybatch has none.
CATALOGUE_FAMILIES: dict[str, type[errors.PyBatchError] | None] = {
    "DomainError": errors.DomainError,
    "LifecycleError": errors.LifecycleError,
    "DefinitionError": errors.DefinitionError,
    # Deviation: one family for definition values; the manifest errors are DefinitionErrors.
    "ManifestError": errors.DefinitionError,
    "PlanError": errors.PlanError,
    # Not built: partition values, aggregation and mutation (EmptyKey, KeyTooLong,
    # ContextTooLarge, NonTerminalResult, CountTooLarge; EmptyPlan, PlanTooLarge, DuplicateKey,
    # Incomplete, CountExhausted; StaleVersion, InvalidState, VersionExhausted).
    "PartitionValueError": None,
    "PartitionAggregationError": None,
    "PartitionMutationError": None,
    "StateError": errors.StateError,
    "FaultStateFormatError": errors.FaultStateFormatError,
    "FaultStateError": errors.FaultStateError,
    "RecoveryRequestError": errors.RecoveryRequestError,
    "RequestFieldError": errors.RequestFieldError,
    # Not needed: pybatch allocates every id from an identity column and has no IdGenerator.
    "IdGenerationError": None,
    "OperatorError": errors.OperatorError,
    "RetentionError": errors.RetentionError,
    "ExplorerError": errors.ExplorerError,
    "CursorError": errors.CursorError,
    "ChunkTransactionError": errors.ChunkTransactionError,
    "BusinessTransactionError": errors.BusinessTransactionError,
    "ConfigError": errors.ConfigError,
}

#: Contract rows pybatch spells differently: row (without fields) -> pybatch class name.
#: The contract's variants are scoped by their family (Rust enums); pybatch's errors share one
#: namespace, so a bare `TooLarge`, `Empty` or `Unavailable` would be ambiguous or clash with
#: another family's leaf. The renamed leaves carry their family in their name.
RENAMED: dict[str, str] = {
    # One class per family for the four text rules, `rule` a TextRule naming which one.
    "DomainError.EmptyName": "NameInvalid",
    "DomainError.NameTooLong": "NameInvalid",
    "DomainError.NameHasSurroundingWhitespace": "NameInvalid",
    "DomainError.NameContainsControl": "NameInvalid",
    "DefinitionError.EmptyToken": "TokenInvalid",
    "DefinitionError.TokenTooLong": "TokenInvalid",
    "DefinitionError.SurroundingWhitespace": "TokenInvalid",
    "DefinitionError.ControlCharacter": "TokenInvalid",
    "StateError.EmptySchemaId": "SchemaIdInvalid",
    "StateError.SchemaIdTooLong": "SchemaIdInvalid",
    "StateError.SchemaIdHasSurroundingWhitespace": "SchemaIdInvalid",
    "StateError.SchemaIdContainsControl": "SchemaIdInvalid",
    "ManifestError.MissingFormat": "UnsupportedManifestVersion",  # with format=0
    "ManifestError.UnsupportedFormat": "UnsupportedManifestVersion",
    # One class for "manifest parse/canonical/float/digest errors"; `reason` names the rule.
    # There is no digest error: pybatch computes the digest, it never takes one in.
    "ManifestError.ParseCanonicalFloatDigest": "ManifestInvalid",
    "StateError.TooLarge": "StateTooLarge",
    "StateError.TooDeep": "StateTooDeep",
    "StateError.Malformed": "StateMalformed",
    "StateError.PayloadNotObject": "StatePayloadNotObject",
    # One class for every fault-state envelope rule; `reason` is a FaultStateRefusal value
    # (the contract's distinct variants are distinct reasons).
    "FaultStateFormatError.EnvelopeRules": "FaultStateEnvelopeInvalid",
    "FaultStateFormatError.TooManyEntries": "FaultStateEnvelopeInvalid",
    "FaultStateFormatError.OrdinalAboveLimit": "FaultStateEnvelopeInvalid",
    "FaultStateFormatError.CheckpointMismatch": "FaultStateEnvelopeInvalid",
    "FaultStateError.Unbound": "FaultStateUnbound",
    # One class for FaultStateError.Corrupt and RepositoryError.FaultStateCorrupt.
    "FaultStateError.Corrupt": "FaultStateCorrupt",
    "FaultStateError.Unavailable": "FaultStateUnavailable",
    "FaultStateError.CommitOutcomeUnknown": "FaultStateCommitOutcomeUnknown",
    # The four recovery text rules: RecoveryFieldInvalid{field, rule}.
    "RecoveryRequestError.Empty": "RecoveryFieldInvalid",
    "RecoveryRequestError.TooLong": "RecoveryFieldInvalid",
    "RecoveryRequestError.SurroundingWhitespace": "RecoveryFieldInvalid",
    "RecoveryRequestError.ControlCharacter": "RecoveryFieldInvalid",
    # The DomainError is the `error` field and the __cause__.
    "Domain(DomainError)": "RepositoryDomainError",
    # The three request-field rules: RequestFieldInvalid{field, rule}.
    "RequestFieldError.Empty": "RequestFieldInvalid",
    "RequestFieldError.TooLong": "RequestFieldInvalid",
    "RequestFieldError.InvalidCharacter": "RequestFieldInvalid",
    "ChunkTransactionError.CommitOutcomeUnknown": "ChunkCommitOutcomeUnknown",
    "ConfigError.Timeout": "TimeoutOutOfBounds",
    # The retention family has its own AgeBoundTooSmall and the repository its Unavailable.
    "ExplorerError.AgeBoundTooSmall": "ExplorerAgeBoundTooSmall",
    "ExplorerError.Timeout": "ExplorerTimeout",
    # `Repository(e)`: the repository's error is the `error` field.
    "ExplorerError.Repository": "ExplorerRepositoryError",
}

#: Contract fields pybatch names differently: row -> {contract field: pybatch field or None}.
FIELD_RENAMES: dict[str, dict[str, str | None]] = {
    # `from`, `to` and `class` are Python keywords.
    "LifecycleError.IllegalTransition": {"from": "from_status", "to": "to_status"},
    "LifecycleError.RestartRequiresNewAttempt": {"from": "from_status"},
    "ConfigError.Timeout": {"class": "timeout_class"},
    # The source InvalidTimestampOrder is the exception's __cause__, not a field.
    "LifecycleError.InvalidTransitionTime": {"source": None},
}

#: Contract rows without a pybatch class: row -> why.
NOT_DEFINED: dict[str, str] = {
    "DuplicateIdentifier": "by contract: identity columns cannot reuse an id",
    "Identifier(IdGenerationError)": "by contract: pybatch's repository has no IdGenerator",
    "LifecycleError.NotRestartable": "by contract: the domain restart function is unused",
    "LifecycleError.AttemptIdentifierReused": "by contract: the domain restart function is unused",
    "ExplorerError.UnsupportedCapability": (
        "by design: an unknown explorer query cannot be expressed (ExplorerQuery is an enum)"
    ),
    "DefinitionError.DuplicateSourceStep": "by design: a step mapping is a Mapping, keyed once",
    "PartitionWorkerAlreadyAssigned": "by design: a claim creates the worker step it assigns",
    "RetentionError.InstanceHeld": "by design: a hold refuses nothing but purges, which skip it",
    # pybatch reads durable state from its columns, never from envelope bytes, and the
    # envelope's reader is the ETL script's own code (docs/contract.md, Differences).
    "StateError.FormatMismatch": "by design: no envelope is read from bytes",
    "StateError.UnsupportedFormatVersion": "by design: no envelope is read from bytes",
    "StateError.SchemaMismatch": "by design: the script reads its checkpoint as a dict",
    "StateError.UnsupportedSchemaVersion": "by design: the script reads its checkpoint as a dict",
    "StateError.InvalidByteLimit": "by design: the limits are pybatch's constants",
    "StateError.InvalidDepthLimit": "by design: the limits are pybatch's constants",
}

#: pybatch's errors beyond the catalogue (their families are their bases in pybatch.errors).
PYBATCH_ONLY: frozenset[str] = frozenset(
    {
        "UnitOfWorkClosed",  # a closed unit of work is used again
        "NegativeIdentifier",  # Python ints are signed; the contract's ids are u64
        "ParameterValueOutOfRange",  # Python ints are unbounded; i64/u64 ranges
        "CounterOutOfRange",  # counters are 0..2^63-1
        "VersionOutOfRange",  # versions are 0..2^63-1
        "JsonNotEncodable",  # canonical JSON
        "TextNotUtf8",  # Python str can hold unpaired surrogates
        "ZeroSchemaVersion",  # schema_version is u32 >= 1
        "EnvironmentValueInvalid",  # ConnectionConfig.from_env
        "CommandArgumentInvalid",  # a pybatch CLI argument out of range or not UTF-8
        "ParameterFilterInvalid",  # the explorer's parameter filter (`--param NAME=VALUE`)
        "ChunkNotEnded",  # the ETL API: a chunk block left without commit or rollback
        "StepsUnfinished",  # a run's end that finds a step's end lost (migration 0024)
        "RunIdInvalid",  # Job(run_id=...)
        "MigrationChecksumMismatch",  # the migrator
        "MigrationHistoryInvalid",
        "MigrationLockTimeout",
        "MigrationTableLockTimeout",  # a migration's own table lock, after its retries
        # Connection refusals that waiting cannot fix; still Unavailable to contract code.
        "AuthenticationFailed",
        "DatabaseNotFound",
        "TlsVerificationFailed",
        "TlsNotOffered",
        "PoolerRefused",
        "SettingsNotApplied",
        # Unavailable to contract code, but not worth retrying: their own exit codes.
        "ServerUnreachable",
        "ReadOnlyServer",
        "StatementCancelled",
        "PermissionDenied",  # SQLSTATE 42501, deliberately not Unavailable
        "LockTimeout",  # 55P03 in a business statement; the connection is kept
        "TransientConflict",  # 40001 or 40P01 in a business statement; the chunk runs again
        "SkipLimitExceeded",  # the ETL API's fault-tolerant load: more rejected rows than allowed
        "TextContainsNul",  # PostgreSQL text and jsonb cannot store U+0000
        "StateSchemaVersionNotStorable",  # u32 versions in integer columns
        "TimestampOutOfRange",  # an aware instant beyond Python's UTC datetimes
        "RecoveryEvidenceDigestInvalid",  # the evidence digest is exactly 32 bytes
        "InvalidPooler",
        "InvalidTlsMode",  # typed refusals instead of a TypeError echoing the value
        "CaCertificateNotBytes",
        "CaCertificateWithoutVerification",
        # The contract's PartitionValueError.ContextTooLarge; that family is not built, the
        # other partition value rules are typed name errors or repository errors.
        "PartitionContextTooLarge",
        "JobRunError",  # how a run ends, decided by its flow or its partitions (etl)
        "FlowEndedInFailure",
        "PartitionsFailed",
        "PartitionPlanNotPublished",  # a joining worker found no plan in time
        "DsnFileInsecure",  # --dsn-file must be mode 0600 (CLI connection settings)
        "DsnFileUnreadable",
        "UnknownStatement",  # pybatch sql show|explain NAME
        "JobNotFound",  # the explorer's instances of a job name no instance has
        "ExecutionOwnershipLost",  # a stale owner whose execution was recovered
        "PartitionOwnershipLost",  # a stale worker whose partition was recovered
        "StopRequested",  # the ETL API ends a step at a chunk boundary on a stop request
        # The clock-skew and stale-threshold bounds (100 ms..60 s, 1 min..24 h) as settings, and
        # the connect-time refusal of a host whose clock is beyond the skew bound.
        "ClockSkewBoundOutOfRange",
        "StaleThresholdOutOfRange",
        "ClockSkewExceeded",
    }
)

#: Contract leaves pybatch also puts in a family of its own: class name -> extra families.
SECOND_FAMILY: dict[str, Families] = {
    "NewerSchema": MIGRATION,  # the migrator refuses a newer schema with the same error
}

_ROW = re.compile(r"^(?P<row>[^{]+?)(?:\{(?P<fields>[^}]*)\})?$")


def _row(key: str) -> tuple[str, tuple[str, ...]]:
    """Split `Name{a, b}` into the row name and the fields the contract names."""
    match = _ROW.match(key)
    assert match is not None, key
    fields = match["fields"]
    return match["row"], tuple(f.strip() for f in fields.split(",")) if fields else ()


def _class_name(row: str) -> str:
    return RENAMED.get(row, row.rpartition(".")[2])


CONTRACT_ROWS = {**REPOSITORY_ROWS, **FAMILY_ROWS}
DEFINED_ROWS = [key for key in CONTRACT_ROWS if _row(key)[0] not in NOT_DEFINED]
#: The table: every class of pybatch.errors but the root, in the order it is written.
ERROR_CLASSES = list(errors.ERRORS)
LEAVES = [cls for cls in ERROR_CLASSES if cls not in errors.FAMILIES]


def _families_of(cls: type) -> set[type[errors.PyBatchError]]:
    return {family for family in errors.FAMILIES if issubclass(cls, family)}


def test_the_side_tables_only_name_contract_rows() -> None:
    rows = {_row(key)[0] for key in CONTRACT_ROWS}
    assert set(RENAMED) <= rows
    assert set(FIELD_RENAMES) <= rows
    assert set(NOT_DEFINED) <= rows
    assert not set(RENAMED) & set(NOT_DEFINED)


@pytest.mark.parametrize("key", DEFINED_ROWS)
def test_each_contract_error_pybatch_defines_is_in_its_family(key: str) -> None:
    row, contract_fields = _row(key)
    cls = getattr(errors, _class_name(row), None)
    assert isinstance(cls, type), f"{row} is missing; add it or list it in NOT_DEFINED"
    for family in CONTRACT_ROWS[key]:
        assert issubclass(cls, family), f"{cls.__name__} is not a {family.__name__}"
    renames = FIELD_RENAMES.get(row, {})
    expected = {renames.get(field, field) for field in contract_fields} - {None}
    assert expected <= {field.name for field in attrs.fields(cls)}


@pytest.mark.parametrize("row", [row for row in NOT_DEFINED if row.isidentifier()])
def test_errors_pybatch_does_not_define_are_absent(row: str) -> None:
    # Once one is built, move its row out of NOT_DEFINED so the family check covers it.
    assert not hasattr(errors, row)


@pytest.mark.parametrize(("contract", "family"), CATALOGUE_FAMILIES.items())
def test_each_catalogue_family_is_a_family_base_of_the_table(
    contract: str, family: type[errors.PyBatchError] | None
) -> None:
    if family is None:
        assert not hasattr(errors, contract)
    else:
        assert family in errors.FAMILIES


def test_the_families_are_exactly_the_direct_children_of_the_root() -> None:
    children = errors.PyBatchError.__subclasses__()
    assert set(errors.FAMILIES) == {c for c in children if not c.__name__.startswith("_")}
    assert errors.RepositoryError in errors.FAMILIES
    assert errors.MigrationError in errors.FAMILIES


def test_every_lifecycle_leaf_is_also_a_repository_error() -> None:
    # The repository row `Lifecycle(LifecycleError)`: `except RepositoryError` catches them.
    leaves = [cls for cls in LEAVES if issubclass(cls, errors.LifecycleError)]
    assert len(leaves) > 1
    for cls in leaves:
        assert issubclass(cls, errors.RepositoryError), cls.__name__


@pytest.mark.parametrize("cls", LEAVES, ids=lambda cls: cls.__name__)
def test_every_contract_error_has_exactly_the_contract_families(cls: type) -> None:
    assert cls.__module__ == errors.__name__
    expected: set[type[errors.PyBatchError]] = set()
    for key in DEFINED_ROWS:
        if _class_name(_row(key)[0]) == cls.__name__:
            expected.update(CONTRACT_ROWS[key])
    if not expected:
        assert cls.__name__ in PYBATCH_ONLY, (
            f"{cls.__name__}: map it to a contract row or PYBATCH_ONLY"
        )
        assert _families_of(cls), f"{cls.__name__} is in no family"
        return
    expected.update(SECOND_FAMILY.get(cls.__name__, ()))
    assert _families_of(cls) == expected


def test_pybatch_only_errors_are_not_contract_rows() -> None:
    named_by_contract = {_class_name(_row(key)[0]) for key in DEFINED_ROWS}
    assert PYBATCH_ONLY <= {cls.__name__ for cls in ERROR_CLASSES} - named_by_contract
    assert set(SECOND_FAMILY) <= named_by_contract


def test_all_lists_exactly_the_exception_classes_defined_in_the_module() -> None:
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
        and not name.startswith("_")  # a private mixin base such as _BrokenTextRule
    }
    assert defined == {cls.__name__ for cls in ERROR_CLASSES} | {"PyBatchError"}
    # The text rules' `rule` values and the table are public too.
    assert set(errors.__all__) == defined | {"TextRule", "ERRORS", "FAMILIES"}
    assert list(errors.__all__) == sorted(set(errors.__all__))


# ------------------------------------------------------------------------- the table's rows

#: A value for each field type the table uses, to build every error from its row.
SAMPLE_VALUES: dict[str, object] = {
    "int": 7,
    "str": "x",
    "bool": True,
    "float": 1.5,
    "tuple[str, ...]": ("a", "b"),
    "int | None": 9,
    "str | None": "08006",
    "TextRule": errors.TextRule.TOO_LONG,
    "DomainError": errors.ZeroIdentifier(kind="job"),
    "RepositoryError": errors.Unavailable(),
}


def _build(cls: type[errors.PyBatchError]) -> errors.PyBatchError:
    fields = attrs.fields(cls)
    return cls(**{field.name: SAMPLE_VALUES[str(field.type)] for field in fields})


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_row_declares_its_own_message_and_a_one_line_hint(cls: type) -> None:
    assert "message" in vars(cls) or "subject" in vars(cls), "each row writes its message"
    hint = cls.__doc__ or ""
    assert hint.strip() and "\n" not in hint and hint.endswith("."), "a one-line hint"


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_is_built_from_keyword_fields_and_frozen(cls: type) -> None:
    assert {str(field.type) for field in attrs.fields(cls)} <= set(SAMPLE_VALUES)
    assert all(field.kw_only for field in attrs.fields(cls))
    error = _build(cls)
    if attrs.fields(cls):
        with pytest.raises(TypeError):
            cls(*(getattr(error, field.name) for field in attrs.fields(cls)))
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(error, attrs.fields(cls)[0].name, None)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_message_is_filled_from_the_fields_and_survives_pickling(cls: type) -> None:
    error = _build(cls)
    text = str(error)
    assert text and "{" not in text and "}" not in text
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert (str(copy), repr(copy)) == (text, repr(error))


def test_docs_errors_md_is_the_rendered_table() -> None:
    # Regenerate with `python tools/errors_catalogue.py`.
    text = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    assert text == catalogue()
    for cls in LEAVES:
        assert f"| `{cls.__name__}` |" in text


# ------------------------------------------------------------------------- redaction

SECRET = "s3cret-Kx9"


def _refusal(build: Callable[[], object]) -> errors.PyBatchError:
    with pytest.raises(errors.PyBatchError) as refused:
        build()
    return refused.value


def _text_of(error: errors.PyBatchError) -> str:
    """Everything a log line or traceback could show of the error."""
    return " ".join(
        [str(error), repr(error), repr(error.args), repr(pickle.loads(pickle.dumps(error)))]
    )


REDACTED_INPUTS: dict[str, Callable[[], object]] = {
    "parameter value": lambda: ParameterValue.string(SECRET * 7000),
    "parameter name": lambda: ParameterName(SECRET + "\x07"),
    "name control character": lambda: JobName(SECRET + "\x1b"),
    "connection string, unknown key": lambda: ConnectionConfig(
        dsn=f"host=db password={SECRET} bogus=1"
    ),
    "connection string, TLS option": lambda: ConnectionConfig(
        dsn=f"host=db password={SECRET} sslmode=disable"
    ),
    "CA certificate contents": lambda: CaCertificate(SECRET.encode() * 110_000),
    "manifest bytes": lambda: DefinitionIdentity(
        None, DefinitionRevision("r1"), 1, b'{ "format": 1, "x": "' + SECRET.encode() + b'" }'
    ),
    "manifest float": lambda: DefinitionIdentity.from_manifest(
        None, DefinitionRevision("r1"), {"format": 1, SECRET: 0.5}
    ),
    "checkpoint payload, malformed": lambda: Checkpoint(
        StateSchemaId("app.v1"), 1, {"k": SECRET, "at": object()}
    ),
    "checkpoint payload, too large": lambda: Checkpoint(
        StateSchemaId("app.v1"), 1, {"k": SECRET * 10_000}
    ),
    "fault state payload": lambda: FaultStateEnvelope.from_columns(
        1, FAULT_STATE_SCHEMA, 1, {"checkpoint": SECRET, "entries": []}, b"\x00" * 32
    ),
    "recovery reason code": lambda: RecoveryRequest(
        expected_version=1,
        reason_code=SECRET + "\x07",
        operator_reference="ticket-1",
        evidence_digest=b"\x01" * 32,
    ),
}


@pytest.mark.parametrize("build", REDACTED_INPUTS.values(), ids=list(REDACTED_INPUTS))
def test_refusals_never_show_a_redacted_input(build: Callable[[], object]) -> None:
    error = _refusal(build)
    text = _text_of(error)
    assert SECRET not in text
    assert "\x07" not in text and "\x1b" not in text


def test_name_control_error_reports_the_index_not_the_character() -> None:
    error = _refusal(lambda: JobName("ab\x1bc"))
    assert isinstance(error, errors.NameInvalid)
    assert error.rule is errors.TextRule.CONTROL_CHARACTER
    assert error.character_index == 2
    assert "2" in str(error)


# Fields that would hold a secret or payload value; no error may carry one.
REDACTED_FIELD_NAMES = {
    "canonical_manifest",
    "connection_string",
    "contents",
    "detail",
    "digest",
    "dsn",
    "evidence_digest",
    "manifest",
    "owner_token",
    "parameter",
    "partition_key",
    "password",
    "payload",
    "pem",
    "retry_key",
    "sql",
    "value",
}
# IdentifierOutOfRange{kind, value} prints the identifier, as the contract's message does.
PRINTABLE_VALUE_FIELDS = {"IdentifierOutOfRange"}


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_no_error_has_a_field_for_a_redacted_value(cls: type) -> None:
    fields = {field.name for field in attrs.fields(cls)}
    if cls.__name__ in PRINTABLE_VALUE_FIELDS:
        fields.discard("value")
    assert not fields & REDACTED_FIELD_NAMES


def test_unavailable_shows_the_sqlstate_and_nothing_of_the_driver() -> None:
    assert str(errors.Unavailable(sqlstate="08006")) == "repository is unavailable (SQLSTATE 08006)"
    assert str(errors.Unavailable()) == "repository is unavailable"
    assert "ck_step_counts" in str(errors.IntegrityViolation(constraint="ck_step_counts"))
