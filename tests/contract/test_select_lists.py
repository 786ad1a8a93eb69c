"""Every statement returns exactly the columns its reader reads (issue: typed rows).

A decoder reads its columns with `row[column]`, so a column it needs and the statement
lacks fails loudly at run time; this test also catches the opposite, a column selected
and never read, and a decoder that drifted from its statements. PostgreSQL describes each
prepared statement, so the test reads the real result shape, not a parse of the SQL.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from pybatch._codecs.chunks import COMMITTED_STEP_STATE_COLUMNS
from pybatch._codecs.executions import JOB_EXECUTION_COLUMNS, RECOVERY_DECISION_COLUMNS
from pybatch._codecs.explorer import (
    EXECUTION_PROJECTION_COLUMNS,
    FAILURE_REASON_COLUMNS,
    INSTANCE_PROJECTION_COLUMNS,
    JOB_NAME_SUMMARY_COLUMNS,
    LATEST_ATTEMPT_COLUMNS,
    PARTITION_PROJECTION_COLUMNS,
    RUNNING_EXECUTION_COLUMNS,
    SKIP_COUNT_COLUMNS,
    STEP_PROJECTION_COLUMNS,
    STEP_SKIP_COLUMNS,
)
from pybatch._codecs.fault_state import LOCKED_FAULT_STATE_COLUMNS
from pybatch._codecs.flow import FLOW_DECISION_COLUMNS
from pybatch._codecs.instances import JOB_INSTANCE_COLUMNS
from pybatch._codecs.operator import OPERATOR_REQUEST_COLUMNS
from pybatch._codecs.partitions import CLAIMED_PARTITION_COLUMNS, STEP_PARTITION_COLUMNS
from pybatch._codecs.steps import COUNT_COLUMNS, STEP_EXECUTION_COLUMNS
from pybatch._statements import Statement, load_statements
from tests.support.statements import support_statements

#: Statement -> the columns its reader reads: a decoder's list, or (for rows read by hand
#: in the named module) the exact columns that module reads.
READERS: dict[str, tuple[str, ...]] = {
    # decoders
    "explore_job_names": JOB_NAME_SUMMARY_COLUMNS,
    "explore_instances": INSTANCE_PROJECTION_COLUMNS,
    "explore_instances_with_parameters": INSTANCE_PROJECTION_COLUMNS,
    "explore_executions": EXECUTION_PROJECTION_COLUMNS,
    "explore_execution": EXECUTION_PROJECTION_COLUMNS,
    "explore_latest_attempt": LATEST_ATTEMPT_COLUMNS,
    "explore_running_executions": RUNNING_EXECUTION_COLUMNS,
    "explore_recent_executions": LATEST_ATTEMPT_COLUMNS,
    "explore_failure_reasons": FAILURE_REASON_COLUMNS,
    "explore_unresolved_executions": EXECUTION_PROJECTION_COLUMNS,
    "explore_executions_with_parameters": EXECUTION_PROJECTION_COLUMNS,
    "explore_step_executions": STEP_PROJECTION_COLUMNS,
    "explore_recovery_decisions": RECOVERY_DECISION_COLUMNS,
    "explore_flow_decisions": FLOW_DECISION_COLUMNS,
    "explore_step_partitions": PARTITION_PROJECTION_COLUMNS,
    "explore_operator_requests": OPERATOR_REQUEST_COLUMNS,
    "explore_step_skips": STEP_SKIP_COLUMNS,
    "explore_step_skip_counts": SKIP_COUNT_COLUMNS,
    "insert_job_instance_if_absent": JOB_INSTANCE_COLUMNS,
    "find_job_instance_by_key": JOB_INSTANCE_COLUMNS,
    "get_job_instance": JOB_INSTANCE_COLUMNS,
    "get_job_execution": JOB_EXECUTION_COLUMNS,
    "lock_job_execution": JOB_EXECUTION_COLUMNS,
    "list_job_executions": JOB_EXECUTION_COLUMNS,
    "get_step_execution": STEP_EXECUTION_COLUMNS,
    "lock_step_execution": STEP_EXECUTION_COLUMNS,
    "list_step_executions": STEP_EXECUTION_COLUMNS,
    "get_step_chunk_state": COMMITTED_STEP_STATE_COLUMNS,
    "lock_step_fault_state": LOCKED_FAULT_STATE_COLUMNS,
    "insert_recovery_decision": RECOVERY_DECISION_COLUMNS,
    "find_latest_recovery_decision": RECOVERY_DECISION_COLUMNS,
    "find_operator_request": OPERATOR_REQUEST_COLUMNS,
    "list_flow_decisions": FLOW_DECISION_COLUMNS,
    "find_reusable_flow_decision": FLOW_DECISION_COLUMNS,
    "insert_step_partitions": STEP_PARTITION_COLUMNS,
    "list_step_partitions": STEP_PARTITION_COLUMNS,
    "lock_step_partitions_by_ordinal": STEP_PARTITION_COLUMNS,
    "copy_step_partitions": STEP_PARTITION_COLUMNS,
    "claim_step_partition": CLAIMED_PARTITION_COLUMNS,
    "claim_fresh_step_partition": CLAIMED_PARTITION_COLUMNS,
    "end_step_partition": (
        "id",
        "found_version",
        "found_status",
        "found_worker_step_execution_id",
        "parent_step_execution_id",
        "parent_status",
        "worker_status",
        "same_execution",
    ),
    "summarize_step_partitions": (
        "partitions",
        "incomplete_status",
        "mirrored",
        "status",
        "exit_code",
        "failure_category",
        "failure_id",
        *COUNT_COLUMNS,
    ),
    # read by hand: repository/flow.py
    "get_job_execution_flow_plan": ("manifest_digest", "manifest"),
    "insert_flow_decision": ("id",),
    # read by hand: repository/partitions.py
    "lock_partition_step": ("job_execution_id", "status"),
    "lock_partition_restart_pair": ("source_job_status", "target_status", "same_logical_id"),
    "list_started_step_partitions": (
        "id",
        "worker_step_execution_id",
        "partition_key",
        "version",
        "leased",
        "lease_expired",
    ),
    # read by hand: repository/definitions.py
    "insert_job_definition_if_absent": ("id",),
    "find_job_definition_by_revision": ("id", "manifest_digest"),
    "find_job_definition_by_digest": ("id", "manifest_digest"),
    # existence checks: only "is there a row" is read
    "insert_definition_upgrade_if_absent": ("from_definition_id",),
    "find_definition_upgrade": ("upgrade_key", "step_mapping"),
    # read by hand: repository/steps.py, repository/operator_requests.py
    "end_unfinished_step_executions": ("ended_steps",),
    "insert_operator_request": ("id",),
    # read by hand: migrator.py (name is shown by `pybatch migrate --dry-run` history)
    "list_schema_migrations": ("version", "name", "checksum"),
    # read whole: tests/support/statements.py transaction_settings, the demo's digest
    "get_transaction_settings": (
        "transaction_isolation",
        "statement_timeout",
        "lock_timeout",
        "idle_in_transaction_session_timeout",
        "time_zone",
    ),
    # the settings in force after set_config, read whole: nothing decodes them
    "apply_pooled_settings": (
        "statement_timeout",
        "lock_timeout",
        "idle_in_transaction_session_timeout",
        "time_zone",
    ),
    "set_migrator_transaction_settings": (
        "statement_timeout",
        "lock_timeout",
        "idle_in_transaction_session_timeout",
        "time_zone",
    ),
    # read by hand: _transaction.py _dropped_setting
    "read_session_settings": ("name", "setting"),
    # the settings in force after set_config, never read: _transaction.py commit_alone
    "short_transaction_settings": ("synchronous_commit", "plan_cache_mode"),
    "demo_orders_digest": ("row_count", "sha256"),
    # operations: repository/ownership.py, recovery.py, audit_chain.py, holds.py, retention.py
    "lock_execution_ownership": (
        *JOB_EXECUTION_COLUMNS,
        "owner_token",
        "lease_expires_at",
        "lease_remaining_ms",
        "stop_requested",
        "lease_expired",
    ),
    "renew_execution_lease": ("stop_requested",),
    # one-statement transitions (migration 0014): outcome and a refusal's details, then the
    # decoders' columns
    "launch_job_execution": (
        *("outcome", "details", "lease_expired", "lease_remaining_ms"),
        *("instance_id", "instance_created_at"),
        *JOB_EXECUTION_COLUMNS,
        *("owner_token", "lease_expires_at", "stop_requested"),
        *(f"previous_{column}" for column in JOB_EXECUTION_COLUMNS),
    ),
    "create_job_execution": (
        *("outcome", "details"),
        *("instance_id", "job_name", "instance_key", "identifying_parameters"),
        "instance_created_at",
        *JOB_EXECUTION_COLUMNS,
        *(f"previous_{column}" for column in JOB_EXECUTION_COLUMNS),
    ),
    "end_job_execution": ("outcome", "details", *JOB_EXECUTION_COLUMNS),
    "start_flow_step": ("outcome", "details", *STEP_EXECUTION_COLUMNS),
    "end_step_execution": ("outcome", "details", *STEP_EXECUTION_COLUMNS),
    "create_step_execution": (
        *("outcome", "details"),
        *(f"execution_{column}" for column in JOB_EXECUTION_COLUMNS),
        *STEP_EXECUTION_COLUMNS,
    ),
    "read_recovery_snapshot": (
        "status",
        "attempt",
        "version",
        "updated_at",
        "failure_category",
        "latest_step_id",
        "latest_step_status",
        "latest_step_checkpoint_schema",
        "latest_step_checkpoint_schema_version",
        "owner_absent",
        "owner_matches",
        "server_time",
        "completed_partition",
        "committed_flow_decision",
        "ambiguous_external_effect",
    ),
    "append_audit_link": ("seq", "link_digest"),
    "read_audit_chain_head": ("seq", "link_digest"),
    "list_audit_links": (
        "seq",
        "record_kind",
        "record_id",
        "content_digest",
        "previous_digest",
        "link_digest",
        "record_content_digest",
        "purged_by",
        "purge_action",
        "purge_seq",
        "expected_link_digest",
    ),
    "find_unlinked_audit_record": ("record_kind", "record_id"),
    "find_overdrawn_audit_purge": ("retention_action_id", "record_kind", "marked", "deleted"),
    "read_instance_hold": ("id", "hold_actor", "hold_reason", "hold_placed_at"),
    "lock_instance_hold": ("id", "hold_actor", "hold_reason", "hold_placed_at"),
    "find_retention_action": (
        "id",
        "job_instance_id",
        "action",
        "operation_id",
        "actor_ref",
        "reason_code",
        "request_digest",
        "plan_digest",
        "batch_bound",
        "deleted_flow_decisions",
        "deleted_recovery_decisions",
        "deleted_operator_requests",
        "deleted_step_partitions",
        "deleted_step_executions",
        "deleted_job_executions",
        "deleted_job_instances",
        "outcome_class",
        "applied_at",
    ),
    "insert_retention_action": ("id",),
    "find_purge_batches": (
        "batches",
        "deleted_flow_decisions",
        "deleted_recovery_decisions",
        "deleted_operator_requests",
        "deleted_step_partitions",
        "deleted_step_executions",
        "deleted_job_executions",
        "deleted_job_instances",
    ),
    "survey_purge_batch": (
        "job_instance_id",
        "job_execution_id",
        "version",
        "updated_at",
        "status",
        "flow_decisions",
        "recovery_decisions",
        "operator_requests",
        "step_partitions",
        "step_executions",
    ),
    "lock_purge_instances": ("found", "held"),
    "lock_purge_executions": ("candidates_digest", "unresolved", "not_requested"),
    "delete_purge_histories": (
        "flow_decisions",
        "recovery_decisions",
        "operator_requests",
        "step_partitions",
        "step_executions",
        "job_executions",
        "tombstones",
        "operator_request_ids",
        "recovery_decision_ids",
    ),
}

ROW_STATEMENTS = [
    s
    for s in [*load_statements(), *load_statements("demo"), *support_statements()]
    if s.mode in ("one", "many")
]


def _described_columns(conn: psycopg.Connection[Any], statement: Statement) -> list[str]:
    """The result columns PostgreSQL reports for the statement, prepared but not run."""
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", placeholder, statement.query.decode())
    prepared = f"pybatch_describe_{statement.name}".encode()
    conn.pgconn.prepare(prepared, text.encode())
    description = conn.pgconn.describe_prepared(prepared)
    return [(description.fname(index) or b"").decode() for index in range(description.nfields)]


def test_every_row_statement_has_a_declared_reader() -> None:
    assert sorted(s.name for s in ROW_STATEMENTS if s.name not in READERS) == []
    assert sorted(set(READERS) - {s.name for s in ROW_STATEMENTS}) == []


@pytest.mark.parametrize("statement", ROW_STATEMENTS, ids=lambda s: s.name)
def test_select_list_equals_the_readers_columns(
    admin: psycopg.Connection[Any], statement: Statement
) -> None:
    if statement.filename == "demo.sql":  # its table, made by the demo's own statements
        demo = load_statements("demo")
        demo.create_demo_schema.affected(admin)
        demo.create_demo_orders.affected(admin)
    assert _described_columns(admin, statement) == list(READERS[statement.name])
