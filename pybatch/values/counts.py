"""Execution and step fault counters, each 0..2^63-1 (bigint), so a valid value is storable."""

from __future__ import annotations

import attrs

from pybatch.errors import CountExhausted
from pybatch.values.ids import INT64_MAX, check_counter


def counter(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    """A counter 0..2^63-1 (an int, never a bool), named by its field in CounterOutOfRange."""
    check_counter(attribute.name, value)


@attrs.frozen(kw_only=True)
class ExecutionCounts:
    """Six item and transaction counters of a step (job executions carry none)."""

    read: int = attrs.field(default=0, validator=counter)
    processed: int = attrs.field(default=0, validator=counter)
    written: int = attrs.field(default=0, validator=counter)
    filtered: int = attrs.field(default=0, validator=counter)
    committed: int = attrs.field(default=0, validator=counter)
    rolled_back: int = attrs.field(default=0, validator=counter)

    def with_terminal_rollback(self) -> ExecutionCounts:
        """Return the counts with `rolled_back + 1` (a terminal rollback; CountExhausted at max)."""
        if self.rolled_back == INT64_MAX:
            raise CountExhausted()
        return attrs.evolve(self, rolled_back=self.rolled_back + 1)


@attrs.frozen(kw_only=True)
class StepFaultCounts:
    """Retry, skip and no-rollback counters of a step, copied on restart."""

    read_retry: int = attrs.field(default=0, validator=counter)
    process_retry: int = attrs.field(default=0, validator=counter)
    write_retry: int = attrs.field(default=0, validator=counter)
    read_skip: int = attrs.field(default=0, validator=counter)
    process_skip: int = attrs.field(default=0, validator=counter)
    write_skip: int = attrs.field(default=0, validator=counter)
    no_rollback: int = attrs.field(default=0, validator=counter)
