"""Flow-graph bounds are enforced when a definition is registered.

A graph over 1,024 nodes, 4,096 transitions or 64 transitions leaving one node, or with an
exit pattern over 64 bytes, used to register and then route nothing. Now its registration
is refused with `ManifestInvalid` and nothing is stored; a graph exactly at every bound
registers and routes.
"""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import ManifestInvalid
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.flow import FlowTarget, FlowTransitionKind, TerminalKind, select_flow_target
from pybatch.values.names import DefinitionRevision, ExitCode, JobName, NodeId
from pybatch.values.parameters import JobInstanceKey, JobParameters

_runs = itertools.count(1)


def flow(nodes: int, transitions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": 2,
        "nodes": [{"id": f"n{index}", "kind": "step"} for index in range(nodes)],
        "transitions": transitions,
    }


def register(repository: JobRepository, manifest: dict[str, Any]) -> int:
    definition = DefinitionIdentity.from_manifest(
        None, DefinitionRevision(f"r{next(_runs)}"), manifest
    )
    with repository.begin() as uow:
        key = JobInstanceKey(JobName("bounded"), JobParameters.of({"run": next(_runs)}))
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id, definition)
        uow.commit()
    return execution.definition_id


def definitions(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM pybatch.job_definition").fetchone()
    assert row is not None
    return int(row[0])


def end(source: str, pattern: str = "*") -> dict[str, Any]:
    return {"source": source, "pattern": pattern, "end": "complete"}


PATTERN_64 = "é" * 31 + "CO"  # 64 UTF-8 bytes


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        (flow(1025, [end("n0")]), "the flow graph has 1025 nodes; at most 1024"),
        (flow(1, [{}] * 4097), "the flow graph has 4097 transitions; at most 4096"),
        (
            flow(2, [end("n1")] + [end("n0", f"E{i}") for i in range(65)]),
            "transition 65 is past the 64 transitions one node may have",
        ),
        (
            flow(1, [end("n0", PATTERN_64 + "X")]),
            "the exit pattern of transition 0 is longer than 64 bytes",
        ),
    ],
    ids=["nodes", "transitions", "outgoing", "pattern"],
)
def test_a_flow_graph_beyond_a_bound_is_refused_at_registration(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    manifest: dict[str, Any],
    reason: str,
) -> None:
    before = definitions(admin)
    with pytest.raises(ManifestInvalid) as refused:
        register(repository, manifest)
    assert refused.value.reason == reason
    assert definitions(admin) == before
    count = admin.execute("SELECT count(*) FROM pybatch.job_execution").fetchone()
    assert count == (0,)


def test_a_flow_graph_at_every_bound_registers_and_routes(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    at_bounds = flow(
        1024,
        [end("n0", f"E{i}") for i in range(63)] + [end("n0", PATTERN_64)] + [{}] * (4096 - 64),
    )
    assert register(repository, at_bounds) >= 1
    assert definitions(admin) == 1
    target = select_flow_target(
        at_bounds, NodeId("n0"), FlowTransitionKind.STEP_EXIT, ExitCode("é" * 31 + "CO")
    )
    assert target == FlowTarget.end(TerminalKind.COMPLETE)
