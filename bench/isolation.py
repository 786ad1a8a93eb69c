"""What isolation between job families costs per statement, for each candidate mechanism.

    python -m bench.isolation [--dsn DSN] [--statements 2000] [--batch 100]

Why: docs/dba.md's isolation (migration 0008) could be row-level security policies or
SECURITY DEFINER functions for the writes. The statements that run most often are a
chunk's progress UPDATE of its step (update_step_chunk_progress) and the lease renewal of
its execution (renew_execution_lease); a chunk commit fenced by its execution also reads
that execution's row. This program runs pybatch's own text of those statements, prepared,
as a family role of the guide (docs/dba.md, "Isolating job families"), on one STARTED step
of a job of that family, under each mechanism:

* `off`: migration 0008 applied, row level security not enabled (what runs by default);
* `rls`: the guide's enabling script, the policies of 0008 (each table's policy looks its
  parent row up, ending at the mapping table);
* `rls-definer`: the same tables, their policies replaced by a call to one SECURITY
  DEFINER function per table that reads the chain as the owner (no nested policies);
* `definer-write`: no row level security; each write is a call to a SECURITY DEFINER
  function that checks the family and then runs the statement as the owner (the other
  mechanism: the runtime role would get EXECUTE instead of UPDATE).

The mechanisms alternate batch by batch (rotating the order), so all of them see the same
moments of a busy machine; per statement it reports the medians over the batches of the
server backend's CPU time (/proc/<pid>/schedstat, local servers only) and of wall time.
Each statement runs in its own transaction, as in pybatch (autocommit here). Without
`--dsn` an EmbeddedPostgres is started (fsync off: COMMIT's flush is the same for all
mechanisms and would only add noise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from bench._server import admin_connect, postgres_server, scratch_database
from pybatch import ConnectionConfig, JobRepository, TlsMode, migrate
from pybatch._statements import load_statements
from pybatch.etl import ETL_STATE_SCHEMA, Job, StepRun

DBA_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "dba.md"
RESULTS = Path(__file__).resolve().parent / "results" / "isolation.json"
FAMILY_ROLE = "pybatch_bench"
FAMILY_PREFIX = "bench."
MECHANISMS = ("off", "rls", "rls-split", "rls-writes", "rls-definer", "definer-write")
#: The tables whose policies `rls-definer` replaces, with the function its policy calls.
DEFINER_TABLES = {
    "job_instance": "pybatch.bench_family_instance(job_instance.id)",
    "job_execution": "pybatch.bench_family_execution(job_execution.id)",
    "step_execution": "pybatch.bench_family_step(step_execution.id)",
}

# `rls-definer`: one SECURITY DEFINER function per level; it runs as the owner, so its
# reads are not filtered again by the policies of the tables it reads.
DEFINER_POLICY_SQL = (
    """
    CREATE FUNCTION pybatch.bench_family_instance(instance_id BIGINT) RETURNS BOOLEAN
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    BEGIN
        RETURN EXISTS (
            SELECT FROM pybatch.job_instance AS i
            JOIN pybatch.job_family_grant AS f
                ON f.role_name = session_user AND starts_with(i.job_name, f.job_name_prefix)
            WHERE i.id = instance_id);
    END $$
    """,
    """
    CREATE FUNCTION pybatch.bench_family_execution(execution_id BIGINT) RETURNS BOOLEAN
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    BEGIN
        RETURN EXISTS (
            SELECT FROM pybatch.job_execution AS e
            JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id
            JOIN pybatch.job_family_grant AS f
                ON f.role_name = session_user AND starts_with(i.job_name, f.job_name_prefix)
            WHERE e.id = execution_id);
    END $$
    """,
    """
    CREATE FUNCTION pybatch.bench_family_step(step_id BIGINT) RETURNS BOOLEAN
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    BEGIN
        RETURN EXISTS (
            SELECT FROM pybatch.step_execution AS s
            JOIN pybatch.job_execution AS e ON e.id = s.job_execution_id
            JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id
            JOIN pybatch.job_family_grant AS f
                ON f.role_name = session_user AND starts_with(i.job_name, f.job_name_prefix)
            WHERE s.id = step_id);
    END $$
    """,
)
# `definer-write`: the chunk's UPDATE and the lease renewal as SECURITY DEFINER functions
# that check the family first (the statements are pybatch's, the check is the policies').
DEFINER_WRITE_SQL = (
    """
    CREATE FUNCTION pybatch.bench_chunk_progress(
        p_read BIGINT, p_processed BIGINT, p_write BIGINT, p_filter BIGINT, p_commit BIGINT,
        p_schema TEXT, p_schema_version INTEGER, p_payload JSONB, p_now TIMESTAMPTZ,
        p_step BIGINT, p_execution BIGINT, p_version BIGINT
    ) RETURNS BIGINT
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog AS $$
    DECLARE
        affected BIGINT;
    BEGIN
        IF NOT pybatch.bench_family_execution(p_execution) THEN
            RETURN 0;
        END IF;
        UPDATE pybatch.step_execution
        SET read_count = p_read, processed_count = p_processed, write_count = p_write,
            filter_count = p_filter, commit_count = p_commit, checkpoint_schema = p_schema,
            checkpoint_schema_version = p_schema_version, checkpoint_payload = p_payload,
            updated_at = GREATEST(updated_at, p_now), version = version + 1
        WHERE id = p_step AND job_execution_id = p_execution AND version = p_version
            AND status = 'STARTED';
        GET DIAGNOSTICS affected = ROW_COUNT;
        RETURN affected;
    END $$
    """,
    """
    CREATE FUNCTION pybatch.bench_renew_lease(
        p_lease_ms BIGINT, p_execution BIGINT, p_owner BYTEA
    ) RETURNS TABLE (stop_requested BOOLEAN)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog AS $$
    BEGIN
        IF NOT pybatch.bench_family_execution(p_execution) THEN
            RETURN;
        END IF;
        RETURN QUERY
        UPDATE pybatch.job_execution
        SET lease_expires_at = clock_timestamp() + p_lease_ms * interval '1 millisecond'
        WHERE id = p_execution AND owner_token = p_owner
            AND status IN ('STARTING', 'STARTED', 'STOPPING')
        RETURNING job_execution.stop_requested_at IS NOT NULL;
    END $$
    """,
    f"GRANT EXECUTE ON FUNCTION pybatch.bench_chunk_progress(BIGINT, BIGINT, BIGINT, BIGINT,"
    f" BIGINT, TEXT, INTEGER, JSONB, TIMESTAMPTZ, BIGINT, BIGINT, BIGINT) TO {FAMILY_ROLE}",
    f"GRANT EXECUTE ON FUNCTION pybatch.bench_renew_lease(BIGINT, BIGINT, BYTEA) TO {FAMILY_ROLE}",
)
DEFINER_CHUNK_CALL = (
    "SELECT pybatch.bench_chunk_progress(%(read_count)s, %(processed_count)s, %(write_count)s,"
    " %(filter_count)s, %(commit_count)s, %(checkpoint_schema)s,"
    " %(checkpoint_schema_version)s, %(checkpoint_payload)s, %(now)s, %(step_execution_id)s,"
    " %(job_execution_id)s, %(expected_version)s)"
)
DEFINER_LEASE_CALL = (
    "SELECT stop_requested FROM pybatch.bench_renew_lease(%(lease_ms)s,"
    " %(job_execution_id)s, %(owner_token)s)"
)
# A chunk commit fenced by its execution (the read the fencing predicates add).
FENCE_READ = (
    "SELECT e.version FROM pybatch.job_execution AS e"
    " WHERE e.id = %(job_execution_id)s AND e.owner_token = %(owner_token)s"
    " AND e.status = 'STARTED'"
)
ISOLATED_TABLES = (
    "job_definition",
    "definition_upgrade",
    "job_instance",
    "job_execution",
    "step_execution",
    "step_partition",
    "flow_decision",
    "recovery_decision",
    "operator_request",
)


def guide_block(name: str) -> str:
    """A fenced `sql <name>` block of docs/dba.md."""
    match = re.search(rf"```sql {name}\n(.*?)```", DBA_GUIDE.read_text(), re.S)
    if match is None:
        raise RuntimeError(f"docs/dba.md has no {name} block")
    return match.group(1)


#: Roles of the guide's scripts, created once per server (roles are cluster-wide).
GUIDE_ROLES = ("pybatch_runtime", "pybatch_retention", "pybatch_operator")


def isolate(dsn: str, role: str, prefix: str) -> str:
    """Enable docs/dba.md's isolation in the database of `dsn`, for family `role`.

    Runs the guide's runtime, retention, per-family and enabling blocks as written, except
    that roles already present on the server are reused (they are cluster-wide, and a
    benchmark may isolate two databases of one server). Returns the family role's DSN.
    """
    with admin_connect(dsn) as admin:
        for name in (*GUIDE_ROLES, role):
            exists = admin.execute("SELECT FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            if exists is None:
                admin.execute(f"CREATE ROLE {name} LOGIN")
        admin.execute(f"GRANT pybatch_runtime TO {role}, pybatch_operator, pybatch_retention")
        admin.execute(guide_block("runtime-grants"))
        admin.execute(_without_create_role(guide_block("retention-grants")))
        family = (
            guide_block("isolation-family")
            .replace("pybatch_orders", role)
            .replace("'orders.'", f"'{prefix}'")
        )
        admin.execute(_without_create_role(family))
        admin.execute(_without_create_role(guide_block("isolation-enable")))
    return make_conninfo(dsn, user=role)


def _without_create_role(script: str) -> str:
    """`script` without its CREATE ROLE and role-membership statements."""
    kept = [
        statement
        for statement in script.split(";\n")
        if not statement.strip().startswith(("CREATE ROLE", "GRANT pybatch_runtime TO"))
    ]
    return ";\n".join(kept)


def cpu_ns(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


#: A family check that joins up to the mapping itself (for policies whose reads of the
#: parent tables are not filtered, `rls-writes`).
FAMILY = (
    "EXISTS (SELECT FROM pybatch.job_family_grant AS f WHERE f.role_name = CURRENT_USER"
    " AND starts_with({name}, f.job_name_prefix))"
)
JOINED = {
    "job_instance": FAMILY.format(name="job_instance.job_name"),
    "job_execution": "EXISTS (SELECT FROM pybatch.job_instance AS i"
    " WHERE i.id = job_execution.job_instance_id AND " + FAMILY.format(name="i.job_name") + ")",
    "step_execution": "EXISTS (SELECT FROM pybatch.job_execution AS e"
    " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
    " WHERE e.id = step_execution.job_execution_id AND " + FAMILY.format(name="i.job_name") + ")",
}


def policies(mechanism: str, table: str) -> list[str]:
    """CREATE POLICY statements of `mechanism` for `table`."""
    on = f"ON pybatch.{table}"
    name = f"{table}_job_family"
    if mechanism == "rls-definer":
        return [f"CREATE POLICY {name} {on} USING ({DEFINER_TABLES[table]})"]
    if mechanism == "rls-split":
        qual = ORIGINAL[table]
        return [
            f"CREATE POLICY {name}_read {on} FOR SELECT USING ({qual})",
            f"CREATE POLICY {name}_insert {on} FOR INSERT WITH CHECK ({qual})",
            f"CREATE POLICY {name}_update {on} FOR UPDATE USING ({qual}) WITH CHECK (TRUE)",
            f"CREATE POLICY {name}_delete {on} FOR DELETE USING ({qual})",
        ]
    if mechanism == "rls-writes":
        qual = JOINED[table]
        return [
            f"CREATE POLICY {name}_read {on} FOR SELECT USING (TRUE)",
            f"CREATE POLICY {name}_insert {on} FOR INSERT WITH CHECK ({qual})",
            f"CREATE POLICY {name}_update {on} FOR UPDATE USING ({qual}) WITH CHECK (TRUE)",
            f"CREATE POLICY {name}_delete {on} FOR DELETE USING ({qual})",
        ]
    return [f"CREATE POLICY {name} {on} USING ({ORIGINAL[table]})"]


def set_mechanism(admin: psycopg.Connection[Any], mechanism: str) -> None:
    """Switch the scratch database to `mechanism` (DDL by the owner, untimed)."""
    enable = "DISABLE" if mechanism in ("off", "definer-write") else "ENABLE"
    # One statement per transaction (autocommit): the run's lease renewer keeps going, and
    # a transaction holding several of these locks could deadlock with it.
    for table in ISOLATED_TABLES:
        admin.execute(f"ALTER TABLE pybatch.{table} {enable} ROW LEVEL SECURITY")
    for table in DEFINER_TABLES:
        existing = admin.execute(
            "SELECT policyname FROM pg_policies WHERE schemaname = 'pybatch' AND tablename = %s",
            (table,),
        ).fetchall()
        for (policy,) in existing:
            admin.execute(f"DROP POLICY {policy} ON pybatch.{table}")
        for statement in policies(mechanism, table):
            admin.execute(statement)


#: The 0008 policy expressions, read back before any change (pg_policies.qual).
ORIGINAL: dict[str, str] = {}


class Measured:
    """Per mechanism and statement: CPU and wall time per statement, one value per batch."""

    def __init__(self) -> None:
        self.cpu: dict[tuple[str, str], list[float]] = {}
        self.wall: dict[tuple[str, str], list[float]] = {}

    def add(self, mechanism: str, name: str, count: int, cpu: int | None, wall: float) -> None:
        key = (mechanism, name)
        if cpu is not None:
            self.cpu.setdefault(key, []).append(cpu / count / 1000)
        self.wall.setdefault(key, []).append(wall / count * 1e6)


class Probe:
    """The measured statements on one STARTED step, as the family role's connection."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        step_id: int,
        execution_id: int,
        version: int,
        owner: bytes,
    ) -> None:
        statements = load_statements()
        self.conn = conn
        self.step_id = step_id
        self.execution_id = execution_id
        self.version = version
        self.owner = owner
        self.progress_sql = statements.update_step_chunk_progress.query
        self.lease_sql = statements.renew_execution_lease.query

    def progress_params(self) -> dict[str, Any]:
        return {
            "read_count": 1,
            "processed_count": 1,
            "write_count": 1,
            "filter_count": 0,
            "commit_count": 1,
            "checkpoint_schema": ETL_STATE_SCHEMA.value,
            "checkpoint_schema_version": 1,
            "checkpoint_payload": Jsonb({"offset": self.version}),
            "now": None,
            "step_execution_id": self.step_id,
            "job_execution_id": self.execution_id,
            "expected_version": self.version,
            "owner_token": self.owner,
        }

    def progress(self, mechanism: str) -> None:
        definer = mechanism == "definer-write"
        query = DEFINER_CHUNK_CALL if definer else self.progress_sql
        cursor = self.conn.execute(query, self.progress_params(), prepare=True)
        if definer:
            row = cursor.fetchone()
            affected = None if row is None else row[0]
        else:
            affected = cursor.rowcount
        if affected != 1:
            raise RuntimeError(f"{mechanism}: the chunk UPDATE matched no row")
        self.version += 1

    def renew(self, mechanism: str) -> None:
        query = DEFINER_LEASE_CALL if mechanism == "definer-write" else self.lease_sql
        params = {
            "lease_ms": 30_000,
            "job_execution_id": self.execution_id,
            "owner_token": self.owner,
        }
        if self.conn.execute(query, params, prepare=True).fetchone() is None:
            raise RuntimeError(f"{mechanism}: the lease renewal matched no row")

    def fence(self, mechanism: str) -> None:
        params = {"job_execution_id": self.execution_id, "owner_token": self.owner}
        if self.conn.execute(FENCE_READ, params, prepare=True).fetchone() is None:
            raise RuntimeError(f"{mechanism}: the fence read found no row")

    def explain(self, mechanism: str) -> str:
        """EXPLAIN ANALYZE of the chunk UPDATE (rolled back)."""
        query = self.progress_sql if mechanism != "definer-write" else DEFINER_CHUNK_CALL
        text = query if isinstance(query, bytes) else query.encode()
        with self.conn.transaction(force_rollback=True):
            plan = self.conn.execute(
                b"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + text,
                self.progress_params(),
            ).fetchall()
        return "\n".join(str(line[0]) for line in plan)


def run(args: argparse.Namespace, dsn: str, local: bool) -> dict[str, Any]:
    """Set up the scratch database, measure every mechanism, return the summary."""
    migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
    family_dsn = isolate(dsn, FAMILY_ROLE, FAMILY_PREFIX)
    with admin_connect(dsn) as admin:
        for statement in (*DEFINER_POLICY_SQL, *DEFINER_WRITE_SQL):
            admin.execute(statement)
        for table in DEFINER_TABLES:
            row = admin.execute(
                "SELECT qual FROM pg_policies WHERE schemaname = 'pybatch' AND tablename = %s",
                (table,),
            ).fetchone()
            if row is None:
                raise RuntimeError(f"migration 0008 has no policy on {table}")
            ORIGINAL[table] = str(row[0])
    measured = Measured()
    plans: dict[str, str] = {}

    def measure(step: StepRun) -> None:
        with admin_connect(dsn) as admin, psycopg.connect(family_dsn, autocommit=True) as conn:
            row = admin.execute(
                "SELECT s.id, s.job_execution_id, s.version, e.owner_token"
                " FROM pybatch.step_execution AS s"
                " JOIN pybatch.job_execution AS e ON e.id = s.job_execution_id"
                " WHERE s.job_execution_id = %s",
                (step.execution.id,),
            ).fetchone()
            if row is None:
                raise RuntimeError("the step's row is missing")
            probe = Probe(conn, *row)
            work: dict[str, Callable[[str], None]] = {
                "update_step_chunk_progress": probe.progress,
                "renew_execution_lease": probe.renew,
                "fence read of job_execution": probe.fence,
            }
            pid = conn.info.backend_pid
            for number in range(args.statements // args.batch * len(MECHANISMS)):
                rotation = number // len(MECHANISMS)
                mechanism = MECHANISMS[(number + rotation) % len(MECHANISMS)]
                set_mechanism(admin, mechanism)
                if args.explain and rotation == 0:
                    plans[mechanism] = probe.explain(mechanism)
                for name, call in work.items():
                    call(mechanism)  # untimed: plans are rebuilt after the DDL
                    before_cpu = cpu_ns(pid) if local else None
                    began = time.perf_counter()
                    for _ in range(args.batch):
                        call(mechanism)
                    wall = time.perf_counter() - began
                    after_cpu = cpu_ns(pid) if local else None
                    cpu = (
                        None if before_cpu is None or after_cpu is None else after_cpu - before_cpu
                    )
                    measured.add(mechanism, name, args.batch, cpu, wall)
            set_mechanism(admin, "rls")
            # Give the step back the version pybatch knows, so that it ends normally.
            admin.execute(
                "UPDATE pybatch.step_execution SET version = %s WHERE id = %s", (row[2], row[0])
            )

    family_config = ConnectionConfig(dsn=family_dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=2)
    with JobRepository.connect(family_config) as repository:
        with Job(repository, f"{FAMILY_PREFIX}isolation", {"run": 1}).launch() as job:
            job.step("measure", measure)
    for mechanism, plan in plans.items():
        print(f"--- {mechanism}: EXPLAIN ANALYZE update_step_chunk_progress\n{plan}")
    return summarise(measured)


def summarise(measured: Measured) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for (mechanism, name), walls in measured.wall.items():
        cpus = measured.cpu.get((mechanism, name), [])
        rows.setdefault(name, {})[mechanism] = {
            "server_cpu_us": statistics.median(cpus) if cpus else None,
            "wall_us": statistics.median(walls),
            "batches": len(walls),
        }
    return rows


def table(rows: dict[str, Any]) -> str:
    header = "| statement | " + " | ".join(MECHANISMS) + " |"
    lines = [
        "Median per statement: server CPU us / wall us (cost vs off)",
        "",
        header,
        "|---|" + "---:|" * len(MECHANISMS),
    ]
    for name, cells in rows.items():
        base = cells["off"]["server_cpu_us"]
        shown = []
        for mechanism in MECHANISMS:
            cell = cells[mechanism]
            cpu = cell["server_cpu_us"]
            extra = "" if base is None or cpu is None else f" ({cpu - base:+.1f})"
            cpu_text = "n/a" if cpu is None else f"{cpu:.1f}"
            shown.append(f"{cpu_text}{extra} / {cell['wall_us']:.0f}")
        lines.append(f"| {name} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.isolation", description=__doc__)
    parser.add_argument("--dsn", help="a server to use (its role needs CREATEDB, CREATEROLE)")
    parser.add_argument("--statements", type=int, default=2000, help="per statement and mechanism")
    parser.add_argument("--batch", type=int, default=100, help="statements per timed batch")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="also print EXPLAIN ANALYZE of the chunk UPDATE under each mechanism",
    )
    args = parser.parse_args(argv)
    if args.batch < 1 or args.statements < args.batch:
        parser.error("need --statements >= --batch >= 1")
    with postgres_server(args.dsn, fsync=False) as server, scratch_database(server, "iso") as dsn:
        rows = run(args, dsn, local=args.dsn is None)
        server_version = admin_connect(dsn).execute("SHOW server_version").fetchone()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"server {server_version[0] if server_version else '?'}, load average at end {load}")
    print(table(rows))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"load_average_end": load, "statements": rows}, indent=2))
    print(f"\nresults: {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
