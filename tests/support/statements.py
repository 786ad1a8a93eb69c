"""What tests run that pybatch does not: the statements of tests/support/queries/.

pybatch starts its steps through its flow (`Flow.start_step`); `create_step` calls migration
0014's `create_step_execution` directly, for tests that need a plain STARTING step.
"""

from __future__ import annotations

from pathlib import Path

from pybatch._codecs._primitives import returned
from pybatch._codecs.steps import decode_step_execution
from pybatch._repository._capability import decided, execution_at
from pybatch._repository.steps import duplicate_step_overrides
from pybatch._statements import Statements, load_statements
from pybatch._unit_of_work import UnitOfWork
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.names import StepName
from pybatch.values.records import StepExecution


def support_statements() -> Statements:
    """The statements of tests/support/queries/, compiled once per process."""
    return load_statements(Path(__file__).resolve().with_name("queries"))


def create_step(uow: UnitOfWork, job_execution_id: int, step_name: StepName) -> StepExecution:
    """Create a step (STARTING) in `uow`; in a restart attempt copy its source's durable state.

    Raises, in this order: JobExecutionNotFound, DuplicateStep, InvalidDefinitionUpgrade
    (an upgraded restart has no mapping entry), RestartStateNotFound (no source step).
    """
    duplicate = duplicate_step_overrides(job_execution_id, step_name, step_name.value)
    with uow.operation(overrides=duplicate) as conn:
        check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)
        row = returned(
            support_statements().create_step_execution.one(
                conn,
                job_execution_id=job_execution_id,
                step_name=step_name.value,
                now=uow.clock.now(),
            )
        )
        execution_at(row, "execution_")  # no step begins under a corrupt execution
        return decode_step_execution(decided(row, "created")[1])


def transaction_settings(uow: UnitOfWork) -> dict[str, str]:
    """The isolation level, timeouts and time zone in force in `uow`'s transaction."""
    with uow.operation() as conn:
        row = support_statements().get_transaction_settings.one(conn)
    return {} if row is None else {str(key): str(value) for key, value in row.items()}
