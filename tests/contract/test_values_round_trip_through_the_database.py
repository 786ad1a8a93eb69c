"""Value scenarios that need the database: A5, A6, A21, A22: parameters and instance
identity, database-clock instants, and canonical JSON that survives a jsonb round trip.

The pure value scenarios are in tests/unit.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import NaiveTimestamp
from pybatch.values._canonical import canonical_json, sha256
from pybatch.values.definitions import LEGACY_MANIFEST, DefinitionIdentity
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import DefinitionRevision, JobName, StepName
from pybatch.values.parameters import (
    JobInstanceKey,
    JobParameter,
    JobParameters,
    ParameterValue,
    ParameterValueKind,
)
from pybatch.values.records import Created, Existing
from pybatch.values.status import BatchStatus
from tests.support.clock import ManualClock
from tests.support.statements import create_step

EMPTY_FAULT_STATE_CHECKSUM = "a491114819e0d3bd8b7ca004dc0636f95b45e2fcb1a67ddb5726beaea12f9922"


def stored_parameters(admin: psycopg.Connection[Any], instance_id: int) -> Any:
    row = admin.execute(
        "SELECT identifying_parameters FROM pybatch.job_instance WHERE id = %s", (instance_id,)
    ).fetchone()
    assert row is not None
    return row[0]


def test_non_identifying_parameters_do_not_change_the_instance(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario A5."""

    def key(attempt_token: str, retries: int) -> JobInstanceKey:
        return JobInstanceKey(
            JobName("daily_export"),
            JobParameters.from_pairs(
                [
                    ("day", JobParameter(ParameterValue.string("2026-05-01"))),
                    (
                        "token",
                        JobParameter(ParameterValue.string(attempt_token), identifying=False),
                    ),
                    ("retries", JobParameter(ParameterValue.i64(retries), identifying=False)),
                ]
            ),
        )

    first, second = key("run-1", 0), key("run-2", 5)
    assert first == second and first.digest() == second.digest()
    with repository.begin() as uow:
        created = uow.instances.select_or_create(first)
        uow.commit()
    with repository.begin() as uow:
        existing = uow.instances.select_or_create(second)
        assert uow.instances.find(second) == created.instance
    assert isinstance(created, Created) and isinstance(existing, Existing)
    assert existing.instance.id == created.instance.id
    # Non-identifying launch parameters are never persisted.
    assert stored_parameters(admin, created.instance.id) == {
        "day": {"type": "string", "identifying": True, "value": "2026-05-01"}
    }
    assert [name.value for name in created.instance.parameters] == ["day"]


def test_u64_and_i64_of_the_same_number_are_different_instances(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario A6."""
    unsigned = JobInstanceKey(JobName("batch"), JobParameters.of({"n": ParameterValue.u64(1)}))
    signed = JobInstanceKey(JobName("batch"), JobParameters.of({"n": ParameterValue.i64(1)}))
    assert unsigned != signed and unsigned.digest() != signed.digest()
    with repository.begin() as uow:
        a = uow.instances.select_or_create(unsigned)
        b = uow.instances.select_or_create(signed)
        uow.commit()
    assert isinstance(a, Created) and isinstance(b, Created)
    assert a.instance.id != b.instance.id
    with repository.begin() as uow:
        read_a = uow.instances.get(a.instance.id)
        read_b = uow.instances.get(b.instance.id)
    assert read_a is not None and read_b is not None
    assert read_a.parameters["n"].kind is ParameterValueKind.U64
    assert read_b.parameters["n"].kind is ParameterValueKind.I64
    assert read_a.key == unsigned and read_b.key == signed
    assert stored_parameters(admin, a.instance.id)["n"]["type"] == "u64"
    assert stored_parameters(admin, b.instance.id)["n"]["type"] == "i64"


def test_extreme_integer_parameters_round_trip(repository: JobRepository) -> None:
    """Scenario A6."""
    key = JobInstanceKey(
        JobName("bounds"),
        JobParameters.of(
            {
                "u64_max": ParameterValue.u64(2**64 - 1),
                "i64_min": ParameterValue.i64(-(2**63)),
                "flag": True,
                "text": '서울\ttab, "quotes", \\ and \u2028',
            }
        ),
    )
    with repository.begin() as uow:
        created = uow.instances.select_or_create(key).instance
        uow.commit()
    with repository.begin() as uow:
        found = uow.instances.find(key)
    assert found == created and found.key == key


# --------------------------------------------------------------------------- A21


def test_naive_datetimes_are_rejected() -> None:
    """Scenario A21."""
    with pytest.raises(NaiveTimestamp):
        LifecycleTransition.new(BatchStatus.STARTED, datetime(2026, 1, 1, 12, 0))


def test_instants_round_trip_in_utc_with_microseconds(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario A21."""
    kolkata = timezone(timedelta(hours=5, minutes=30))
    created_at = datetime(2026, 7, 1, 17, 30, 0, 123456, tzinfo=kolkata)
    started_at = datetime(2026, 7, 1, 8, 0, 1, 1, tzinfo=timezone(timedelta(hours=-4)))
    clock.set(created_at)
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(
            JobInstanceKey(JobName("tz"), JobParameters.of({"d": "x"}))
        ).instance
        execution = uow.executions.create(instance.id)
        execution = uow.executions.transition(
            execution.id, 0, LifecycleTransition.new(BatchStatus.STARTED, started_at)
        )
        uow.commit()
    with repository.begin() as uow:
        stored = uow.executions.get(execution.id)
        stored_instance = uow.instances.get(instance.id)
    assert stored is not None and stored_instance is not None
    for value, expected in (
        (stored.created_at, created_at),
        (stored_instance.created_at, created_at),
        (stored.metadata.timestamps.started_at, started_at),
        (stored.updated_at, started_at),
    ):
        assert value == expected
        assert value is not None and value.tzinfo == UTC
    assert stored.created_at == datetime(2026, 7, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert stored.metadata.timestamps.started_at == datetime(2026, 7, 1, 12, 0, 1, 1, tzinfo=UTC)
    row = admin.execute(
        "SELECT created_at = '2026-07-01T12:00:00.123456Z'::timestamptz, "
        "started_at = '2026-07-01T12:00:01.000001Z'::timestamptz "
        "FROM pybatch.job_execution WHERE id = %s",
        (execution.id,),
    ).fetchone()
    assert row == (True, True)


# --------------------------------------------------------------------------- A22


def test_jsonb_documents_re_canonicalise_to_the_same_bytes(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    # jsonb orders keys by length first, canonical JSON by code point: "zz" < "aaa" in jsonb.
    """Scenario A22."""
    key = JobInstanceKey(
        JobName("canon"),
        JobParameters.of({"zz": "last", "aaa": "first", "b": ParameterValue.u64(2**64 - 1)}),
    )
    definition = DefinitionIdentity.from_manifest(
        None,
        DefinitionRevision("r1"),
        {"format": 1, "zz": {"y": [3, 2, 1], "bb": None}, "aaa": "text", "é": True},
    )
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id, definition)
        legacy = uow.executions.create(
            uow.instances.select_or_create(
                JobInstanceKey(JobName("canon"), JobParameters.of({"other": 1}))
            ).instance.id
        )
        step = create_step(uow, execution.id, StepName("s"))
        uow.commit()

    # Identifying parameters: the server reorders keys; the document re-canonicalises.
    text_row = admin.execute(
        "SELECT identifying_parameters::text, identifying_parameters FROM pybatch.job_instance "
        "WHERE id = %s",
        (instance.id,),
    ).fetchone()
    assert text_row is not None
    server_text, document = text_row
    assert list(json.loads(server_text)) == ["b", "zz", "aaa"]  # jsonb's own order
    sent = canonical_json(document)
    assert sent.startswith(b'{"aaa":') and b" " not in sent
    with repository.begin() as uow:
        found = uow.instances.get(instance.id)
    assert found is not None and found.key.digest() == key.digest() == bytes(found.instance_key)

    # Manifests: read back from jsonb, canonical bytes and digest are those registered.
    for definition_id, manifest in (
        (execution.definition_id, definition.canonical_manifest),
        (legacy.definition_id, LEGACY_MANIFEST),
    ):
        row = admin.execute(
            "SELECT manifest, manifest_digest FROM pybatch.job_definition WHERE id = %s",
            (definition_id,),
        ).fetchone()
        assert row is not None
        assert canonical_json(row[0]) == manifest
        assert sha256(canonical_json(row[0])) == bytes(row[1])

    # The empty fault-state envelope: stored jsonb re-canonicalises to the checksummed bytes.
    row = admin.execute(
        "SELECT fault_state_payload, fault_state_checksum FROM pybatch.step_execution "
        "WHERE id = %s",
        (step.id,),
    ).fetchone()
    assert row is not None
    assert canonical_json(row[0]) == FaultStateEnvelope.EMPTY.canonical_bytes()
    assert sha256(canonical_json(row[0])).hex() == EMPTY_FAULT_STATE_CHECKSUM
    assert bytes(row[1]).hex() == EMPTY_FAULT_STATE_CHECKSUM
