"""Execution and step fault counters, each 0..2^63-1 (bigint), so a valid value is storable."""

from __future__ import annotations

import attrs

from pybatch.errors import CountExhausted
from pybatch.values.ids import INT64_MAX, check_counter


def counter(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    """A counter 0..2^63-1 (an int, never a bool), named by its field in CounterOutOfRange."""
    check_counter(attribute.name, value)


def _checked_sum(left: int, right: int) -> int:
    total = left + right
    if total > INT64_MAX:
        raise CountExhausted()
    return total


@attrs.frozen(kw_only=True)
class ExecutionCounts:
    """Six item and transaction counters of a step (job executions carry none)."""

    read: int = attrs.field(default=0, validator=counter)
    processed: int = attrs.field(default=0, validator=counter)
    written: int = attrs.field(default=0, validator=counter)
    filtered: int = attrs.field(default=0, validator=counter)
    committed: int = attrs.field(default=0, validator=counter)
    rolled_back: int = attrs.field(default=0, validator=counter)

    def after_chunk(
        self, read: int, processed: int, written: int, filtered: int
    ) -> ExecutionCounts:
        """The counts after one committed chunk (ChunkCounts are valid; only sums are checked)."""
        return ExecutionCounts(
            read=_checked_sum(self.read, read),
            processed=_checked_sum(self.processed, processed),
            written=_checked_sum(self.written, written),
            filtered=_checked_sum(self.filtered, filtered),
            committed=_checked_sum(self.committed, 1),
            rolled_back=self.rolled_back,
        )

    def with_terminal_rollback(self) -> ExecutionCounts:
        """Return the counts with `rolled_back + 1` (a terminal rollback; CountExhausted at max)."""
        return attrs.evolve(self, rolled_back=_checked_sum(self.rolled_back, 1))


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
