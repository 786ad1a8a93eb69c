"""Upgrading to step rules checked on write (the step_execution_rules_on_write migration).

A run of the older package keeps committing chunks while the migration replaces the CHECKs of
step_execution by one constraint trigger that checks them all; afterwards every rule still
refuses what its CHECK refused (SQLSTATE 23514, the CHECK's name as the constraint), and a
chunk commit, which writes none of the columns those rules read, never fires it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch.etl import Job, StepRun
from tests.conftest import plaintext_config
from tests.migrations.live_plan import run_across_upgrade

#: The migration that moves the rules onto triggers (the next one validates its new CHECK),
#: looked up by name: its number follows the others'.
RULES = next(
    m.version for m in migrator.shipped_migrations() if m.name == "step_execution_rules_on_write"
)

_CLASS, _MESSAGE = "failure_error_class = 'KeyError'", "failure_message = 'm'"
#: Each rule and a write of the finished step (COMPLETED, with start and end) that breaks it
#: and no other rule.
BROKEN: dict[str, str] = {
    "step_execution_id_positive": "id = -id",
    "step_execution_end_state": "ended_at = NULL",
    "step_execution_timestamp_order": "started_at = created_at - interval '1 second'",
    "step_execution_updated_after_created": "updated_at = created_at - interval '1 second'",
    "step_execution_failed_has_failure": "status = 'FAILED'",
    "step_execution_failure_shape": "failure_id = 7",
    "step_execution_failure_error_class_length": f"failure_error_class = '', {_MESSAGE}",
    "step_execution_failure_message_length": f"{_CLASS}, failure_message = repeat('m', 1001)",
    "step_execution_failure_sqlstate_format": f"{_CLASS}, {_MESSAGE}, failure_sqlstate = 'oops'",
    "step_execution_failure_names_length": f"{_CLASS}, {_MESSAGE}, failure_table = repeat('t', 64)",
    "step_execution_failure_reason_whole": "failure_message = 'no class'",
}


def test_a_job_live_across_the_upgrade_commits_and_every_rule_still_refuses(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    applied = run_across_upgrade(config, RULES, monkeypatch)

    def more(step: StepRun) -> None:
        for offset in (3, 4):
            with step.chunk() as chunk:
                chunk.commit(read=1, written=1, checkpoint={"offset": offset})

    with JobRepository.connect(config) as repository, Job(repository, "next", {}).launch() as run:
        run.step("load", more)
    assert applied == list(range(RULES, migrator.supported_schema_version() + 1))
    with psycopg.connect(blank_database, autocommit=True) as conn:
        steps: list[Any] = conn.execute(
            "SELECT status, read_count, checkpoint_payload FROM pybatch.step_execution ORDER BY id"
        ).fetchall()
        assert steps == [("COMPLETED", 2, {"offset": 2}), ("COMPLETED", 2, {"offset": 4})]
        refused = {}
        for rule, assignment in BROKEN.items():
            with pytest.raises(psycopg.errors.CheckViolation) as caught:
                conn.execute(f"UPDATE pybatch.step_execution SET {assignment} WHERE id = 1")
            refused[rule] = caught.value.diag.constraint_name
        unvalidated = conn.execute(
            "SELECT count(*) FROM pg_constraint"
            " WHERE conrelid = 'pybatch.step_execution'::regclass AND NOT convalidated"
        ).fetchone()
    assert refused == {rule: rule for rule in BROKEN}
    assert unvalidated == (0,)


def test_a_chunk_commit_never_fires_the_rule_trigger(
    repository: JobRepository, db_dsn: str
) -> None:
    """The chunk's UPDATE writes no column the rule trigger watches (its cost is why it is)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.rule_calls (n INT);"
            " CREATE FUNCTION public.count_rule_call() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN INSERT INTO public.rule_calls VALUES (1); RETURN NULL; END $$"
        )
        watched = conn.execute(
            "SELECT t.tgname, string_agg(a.attname, ', ')"
            " FROM pg_trigger AS t"
            " JOIN pg_attribute AS a ON a.attrelid = t.tgrelid AND a.attnum = ANY (t.tgattr)"
            " WHERE t.tgrelid = 'pybatch.step_execution'::regclass"
            "   AND t.tgfoid = 'pybatch.check_step_execution_rules'::regproc"
            " GROUP BY t.tgname"
        ).fetchall()
        assert [name for name, _ in watched] == ["step_execution_rules"]
        for name, columns in watched:  # a counting twin of the rule trigger
            conn.execute(
                f"CREATE TRIGGER {name}_calls AFTER UPDATE OF {columns}"
                " ON pybatch.step_execution FOR EACH ROW"
                " EXECUTE FUNCTION public.count_rule_call()"
            )
        seen: list[int] = []

        def work(step: StepRun) -> None:
            before = conn.execute("SELECT count(*) FROM public.rule_calls").fetchone()
            for offset in range(1, 4):
                with step.chunk() as chunk:
                    chunk.execute("SELECT 1")
                    chunk.commit(read=1, written=1, checkpoint={"offset": offset})
            with step.chunk() as chunk:  # checkpoint-only: the UPDATE alone
                chunk.commit(read=0, written=0, checkpoint={"offset": 3}, context={"k": 1})
            after = conn.execute("SELECT count(*) FROM public.rule_calls").fetchone()
            assert before is not None and after is not None
            seen.append(after[0] - before[0])

        with Job(repository, "quiet_rules", {}).launch() as run:
            run.step("load", work)
    assert seen == [0]
