"""Values round-trip through PostgreSQL byte-exactly.

Generated documents, checkpoints, contexts, names and parameters are written through
pybatch's own statements (or bound as jsonb the way pybatch binds them), read back, and
must re-encode to exactly the bytes they had before the round trip.
"""

from __future__ import annotations

from typing import Any

import psycopg
from hypothesis import given
from hypothesis import strategies as st

from pybatch import JobRepository
from pybatch._codecs._jsonb import to_jsonb
from pybatch.errors import DomainError, StateError
from pybatch.etl import Job, StepRun
from pybatch.values._canonical import canonical_json
from pybatch.values.names import JobName
from pybatch.values.parameters import (
    JobInstanceKey,
    JobParameter,
    JobParameters,
    ParameterValue,
)
from pybatch.values.state import Checkpoint, ExecutionContext
from tests.properties.strategies import json_objects, storable_text


@given(document=json_objects)
def test_jsonb_round_trip_re_encodes_to_the_same_bytes(
    repository: JobRepository, document: dict[str, Any]
) -> None:
    encoded = canonical_json(document)
    with repository.read_transaction() as conn:
        row = conn.execute("SELECT %s::jsonb", [to_jsonb(document)]).fetchone()
    assert row is not None
    assert canonical_json(row[0]) == encoded


def test_checkpoints_and_contexts_round_trip_through_chunk_commits(
    repository: JobRepository,
) -> None:
    states = st.tuples(json_objects, json_objects)

    def work(step: StepRun) -> None:
        @given(states)
        def commit_and_reload(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
            checkpoint, context = pair
            try:
                with step.chunk() as chunk:
                    chunk.commit(read=1, written=1, checkpoint=checkpoint, context=context)
            except StateError:
                return  # too large or too deep for a step's limits: refused, nothing written
            with repository.begin() as uow:
                stored = uow.steps.get(step.execution.id)
            assert stored is not None
            expected_checkpoint = Checkpoint(stored.checkpoint.schema, 1, checkpoint)
            expected_context = ExecutionContext(stored.context.schema, 1, context)
            assert stored.checkpoint.encode() == expected_checkpoint.encode()
            assert stored.context.encode() == expected_context.encode()
            assert step.checkpoint == stored.checkpoint.payload

        commit_and_reload()

    with Job(repository, "round_trip", {"run": "properties"}).launch() as run:
        run.step("load", work)


names = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1, max_size=40
)
parameter_values = st.one_of(
    storable_text.map(ParameterValue.string),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(ParameterValue.i64),
    st.integers(min_value=0, max_value=2**64 - 1).map(ParameterValue.u64),
    st.booleans().map(ParameterValue.boolean),
)


@given(
    job=names,
    parameters=st.dictionaries(names, st.tuples(parameter_values, st.booleans()), max_size=5),
)
def test_instance_keys_round_trip_and_find_their_instance(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    job: str,
    parameters: dict[str, tuple[ParameterValue, bool]],
) -> None:
    try:
        key = JobInstanceKey(
            JobName(job),
            JobParameters.from_pairs(
                (name, JobParameter(value, identifying=identifying))
                for name, (value, identifying) in parameters.items()
            ),
        )
    except DomainError:
        return
    with repository.begin() as uow:
        selected = uow.instances.select_or_create(key).instance
        uow.commit()
    with repository.begin() as uow:
        found = uow.instances.find(key)
    assert found == selected
    assert found.job_name == key.job_name
    assert found.parameters == key.parameters
    assert found.instance_key == key.digest()
