"""Chaos: faults from a seeded RNG while a partitioned step and two loaders run, then exactness.

Three jobs run in processes of their own (tests/chaos/worker.py), each loading a
deterministic source into a table without a unique key: a partitioned step (a launcher with
forked local workers, plus two processes that join with `join_partitioned_step`), a COPY
loader and an `executemany` loader, all with two-second leases. For CHAOS_S seconds a
seeded RNG injects faults: SIGKILL of any of those processes (launchers, forked workers,
joiners), SIGINT of a launcher's process group (Ctrl-C: its run ends STOPPED),
pg_terminate_backend of one pybatch backend or of every backend of one process (its pooled
connections, among them the one its lease keeper renews through),
`pg_ctl restart -m immediate` of the server, and SIGSTOP of a process for longer than its
lease (then SIGCONT). A supervisor starts a new process for a job whenever the job has no
live, unpaused one (a paused owner's rival retries ExecutionAlreadyActive until the lease
runs out and then recovers it), until every job completed. Each relaunch comes from a spare
process that is already imported (an immediate relaunch, as an operator's after Ctrl-C).

Then it checks what a user relies on:
- every table equals its source: rows == source rows == distinct ids, and the sha256 of the
  ordered rows equals the source's (a chunk applied twice or lost cannot hide);
- no step or worker step is left active under a finished execution, no partition is left
  claimed (STARTED, STOPPING) under a finished parent step, and no execution is left unresolved;
- the completed step's counters equal the rows (a restarted step carries its predecessor's
  counters, so the completed step of the lineage holds the whole run), and for the
  partitioned step every partition and the worker step that completed it count exactly its
  rows;
- the audit chain verifies intact (the service behind `pybatch audit verify`).

Every violation is collected and reported together with the seed and the fault counts.

Seeds: PYBATCH_CHAOS_SEED (default 20261201) is the first; PYBATCH_CHAOS_SEEDS (default 1)
runs that many consecutive seeds. Deselected by default (marker `chaos`); run with
`pytest -m chaos tests/chaos -s` (`-s` prints the fault counts of a passing seed).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pytest_postgresql import factories

from pybatch import JobRepository
from pybatch._services.audit import verify_audit_chain
from tests.chaos import worker as w
from tests.conftest import dsn_for
from tests.faults.harness import FaultServer

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.crash]

ROOT = Path(__file__).resolve().parents[2]
FIRST_SEED = int(os.environ.get("PYBATCH_CHAOS_SEED", "20261201"))
SEEDS = [FIRST_SEED + i for i in range(int(os.environ.get("PYBATCH_CHAOS_SEEDS", "1")))]

#: How long faults are injected; then the chunks stop sleeping and the jobs finish.
CHAOS_S = 30.0
#: How long the jobs may take to complete after the fault phase.
SETTLE_S = 60.0
MAX_FAULTS = 40
MAX_RESTARTS = 3
#: Seconds between two faults.
GAP_S = (0.4, 1.8)
#: How far past the lease a paused process stays paused.
PAUSE_PAST_LEASE_S = (1.5, 3.0)
#: Fault kinds and their weights.
KINDS = {
    "sigkill": 4,
    "terminate_backend": 2,
    "terminate_process_backends": 3,
    "restart_immediate": 1,
    "sigstop": 2,
    "sigint": 2,
}
#: Processes kept live per role (a job role gets a new process while its job is unfinished).
WANTED = {"partitions": 1, "join": 2, "copy": 1, "many": 1}
JOB_OF_ROLE = {"partitions": w.PARTITIONED, "join": w.PARTITIONED, "copy": w.COPY, "many": w.MANY}
ACTIVE = "('STARTING', 'STARTED', 'STOPPING')"
#: A partition is STARTING until a worker claims it: only a claimed one can still be written.
WORKING = "('STARTED', 'STOPPING')"
FINISHED = "('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED')"

chaos_proc = factories.postgresql_proc(
    port=None, postgres_options="-c fsync=off -c max_connections=300"
)


class Proc:
    """One process started by the supervisor, leader of its own process group.

    It starts as a spare: imported and waiting for `go` on stdin, so a relaunch starts its
    run at once, as an operator's immediate relaunch would, instead of seconds later.
    """

    def __init__(self, role: str, env: dict[str, str], log: Path) -> None:
        self.role = role
        self.log = log
        self.going = False
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.worker", role],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def go(self) -> None:
        self.going = True
        stdin = self.popen.stdin
        if stdin is None:
            return
        try:
            stdin.write(b"go\n")
            stdin.close()
        except OSError:  # it died as a spare; the supervisor notices and replaces it
            pass

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def launched(self) -> bool:
        """Whether its job run started (the process printed `launched`)."""
        try:
            return b"launched " in self.log.read_bytes()
        except OSError:
            return False


def group_members(groups: set[int]) -> dict[int, int]:
    """Live (not zombie) processes of these process groups: pid -> group."""
    members: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        state, _parent, group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(group) in groups and state not in ("Z", "X"):
            members[int(entry.name)] = int(group)
    return members


def signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


class Chaos:
    """The fault injector and the supervisor of one seed's run."""

    def __init__(self, seed: int, server: FaultServer, tmp_path: Path) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.server = server
        self.tmp = tmp_path
        self.slow = tmp_path / "slow"
        self.slow.touch()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "CHAOS_"))}
        self.env.update(
            PYBATCH_DSN=dsn_for(**server.fields),
            PYBATCH_TLS="plaintext",
            PYBATCH_POOL_SIZE="4",
            CHAOS_RUN=f"seed-{seed}",
            CHAOS_SLOW_FILE=str(self.slow),
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        )
        self.procs: list[Proc] = []
        self.paused: dict[int, float] = {}  # pid -> when to resume it
        self.faults: collections.Counter[str] = collections.Counter()
        self.targets: collections.Counter[str] = collections.Counter()
        self.started: collections.Counter[str] = collections.Counter()
        self.exits: collections.Counter[str] = collections.Counter()
        self.complete: set[str] = set()
        self.next_start: dict[str, float] = {}
        self.reaped: set[int] = set()
        self.spawned = 0

    # ------------------------------------------------------------------ supervision

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.server.admin() as conn:
            return conn.execute(sql, params).fetchall()

    def refresh_complete(self) -> None:
        try:
            rows = self.query(
                "SELECT DISTINCT i.job_name FROM pybatch.job_instance AS i"
                " JOIN pybatch.job_execution AS e ON e.job_instance_id = i.id"
                " WHERE e.status = 'COMPLETED'"
            )
        except psycopg.OperationalError:
            return  # the server is restarting
        self.complete = {row[0] for row in rows}

    def active(self, role: str) -> list[Proc]:
        return [
            p
            for p in self.procs
            if p.role == role and p.going and p.alive() and p.pid not in self.paused
        ]

    def supervise(self, now: float) -> None:
        for proc in self.procs:
            if proc.pid not in self.reaped and not proc.alive():
                self.reaped.add(proc.pid)
                if not proc.going:
                    continue
                self.exits[f"{proc.role}:{proc.popen.returncode}"] += 1
                if proc.popen.returncode != 0:  # back off while the server restarts
                    self.next_start[proc.role] = now + 0.3
        for role, wanted in WANTED.items():
            if JOB_OF_ROLE[role].job in self.complete:
                continue
            if now < self.next_start.get(role, 0.0):
                continue
            for _ in range(wanted - len(self.active(role))):
                (self.spare(role) or self.spawn(role)).go()
                self.started[role] += 1
            if self.spare(role) is None:
                self.spawn(role)
        for role, job in JOB_OF_ROLE.items():
            if job.job in self.complete:  # nothing left to do: no spare, and no joiner
                for proc in self.procs:
                    if proc.role == role and proc.alive() and (role == "join" or not proc.going):
                        kill_group(proc.pid, signal.SIGKILL)

    def spare(self, role: str) -> Proc | None:
        return next((p for p in self.procs if p.role == role and not p.going and p.alive()), None)

    def spawn(self, role: str) -> Proc:
        self.spawned += 1
        proc = Proc(role, self.env, self.tmp / f"{role}-{self.spawned}.log")
        self.procs.append(proc)
        return proc

    def groups(self, *, spares: bool = False) -> set[int]:
        """The process groups faults aim at (spares only when asked: they do nothing yet)."""
        return {p.pid for p in self.procs if spares or p.going}

    def role_of(self, pid: int, group: int) -> str:
        role = next(p.role for p in self.procs if p.pid == group)
        return role if pid == group else f"{role}-forked-worker"

    def choose_process(
        self, members: dict[int, int], pick: float, pick_process: float
    ) -> tuple[int, str]:
        """A role first, then one of its processes: a launcher is hit as often as a worker."""
        by_role: dict[str, list[int]] = collections.defaultdict(list)
        for pid, group in members.items():
            by_role[self.role_of(pid, group)].append(pid)
        role = sorted(by_role)[int(pick * len(by_role))]
        pids = sorted(by_role[role])
        return pids[int(pick_process * len(pids))], role

    def resume_due(self, now: float, *, all_of_them: bool = False) -> None:
        for pid, due in list(self.paused.items()):
            if all_of_them or now >= due:
                signal_quietly(pid, signal.SIGCONT)
                del self.paused[pid]

    # ------------------------------------------------------------------ faults

    def inject(self, now: float) -> None:
        """One fault; the same number of draws whatever happens, to keep the stream aligned."""
        kinds = list(KINDS)
        kind = self.rng.choices(kinds, weights=[KINDS[k] for k in kinds])[0]
        pick, pick_process = self.rng.random(), self.rng.random()
        pause = w.LEASE.total_seconds() + self.rng.uniform(*PAUSE_PAST_LEASE_S)
        if kind == "restart_immediate" and self.faults[kind] >= MAX_RESTARTS:
            kind = "sigkill"
        if kind in ("sigkill", "sigstop", "sigint"):
            members = group_members(self.groups())
            if kind == "sigstop":
                members = {p: g for p, g in members.items() if p not in self.paused}
            if kind == "sigint":  # Ctrl-C of a launched run: it ends STOPPED on that path
                leaders = {p.pid for p in self.procs if p.role != "join" and p.launched()}
                members = {
                    p: g for p, g in members.items() if p in leaders and p not in self.paused
                }
            if not members:
                return
            pid, target = self.choose_process(members, pick, pick_process)
            if kind == "sigkill":
                signal_quietly(pid, signal.SIGKILL)
                self.paused.pop(pid, None)
            elif kind == "sigint":  # Ctrl-C reaches the whole group: the forked workers too
                kill_group(pid, signal.SIGINT)
            else:
                signal_quietly(pid, signal.SIGSTOP)
                self.paused[pid] = now + pause
            self.targets[f"{kind}:{target}"] += 1
        elif kind == "terminate_backend":
            backends = self.backends()
            if not backends:
                return
            self.terminate([backends[int(pick * len(backends))]])
        elif kind == "terminate_process_backends":
            members = group_members(self.groups())
            if not members:
                return
            pid, target = self.choose_process(members, pick, pick_process)
            ports = client_ports(pid)
            try:
                rows = self.query(
                    "SELECT pid, client_port FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND backend_type = 'client backend' ORDER BY pid"
                )
            except psycopg.OperationalError:
                return
            backends = [int(row[0]) for row in rows if row[1] in ports]
            if not backends:
                return
            self.terminate(backends)
            self.targets[f"{kind}:{target}"] += 1
        else:
            self.server.restart_immediate()
        self.faults[kind] += 1

    def backends(self) -> list[int]:
        try:
            rows = self.query(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend' ORDER BY pid"
            )
        except psycopg.OperationalError:
            return []
        return [int(row[0]) for row in rows]

    def terminate(self, backends: list[int]) -> None:
        try:
            self.query(
                "SELECT pg_terminate_backend(pid) FROM UNNEST(CAST(%s AS integer[])) AS t (pid)",
                (backends,),
            )
        except psycopg.OperationalError:
            pass

    # ------------------------------------------------------------------ the run

    def run(self) -> float:
        start = time.monotonic()
        chaos_end = start + CHAOS_S
        hard_end = chaos_end + SETTLE_S
        next_fault = start + self.rng.uniform(1.0, 2.0)
        last_refresh = 0.0
        while True:
            now = time.monotonic()
            if now - last_refresh > 0.3:
                self.refresh_complete()
                last_refresh = now
            if self.complete >= {spec.job for spec in w.SPECS}:
                break
            self.resume_due(now)
            if now >= chaos_end and self.slow.exists():
                self.slow.unlink()
                self.resume_due(now, all_of_them=True)
            self.supervise(now)
            if now < chaos_end and now >= next_fault and sum(self.faults.values()) < MAX_FAULTS:
                self.inject(now)
                next_fault = time.monotonic() + self.rng.uniform(*GAP_S)
            if now > hard_end:
                raise AssertionError(
                    f"seed {self.seed}: jobs still unfinished {SETTLE_S} s after the faults;"
                    f" complete: {sorted(self.complete)}; {self.summary()}; logs in {self.tmp}"
                )
            time.sleep(0.05)
        elapsed = time.monotonic() - start
        self.stop_everything()
        return elapsed

    def stop_everything(self) -> None:
        """Resume the paused, give the job processes a moment to exit, then kill the rest."""
        if self.slow.exists():
            self.slow.unlink()
        self.resume_due(0.0, all_of_them=True)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            p.alive() for p in self.procs if p.role != "join"
        ):
            time.sleep(0.05)
        for group in self.groups(spares=True):
            kill_group(group, signal.SIGKILL)
        for proc in self.procs:
            proc.popen.wait(timeout=30)
            if proc.popen.stdin is not None and not proc.popen.stdin.closed:
                proc.popen.stdin.close()
        deadline = time.monotonic() + 30
        while group_members(
            self.groups(spares=True)
        ):  # orphaned forked workers die with their group
            assert time.monotonic() < deadline, "orphaned workers survived SIGKILL"
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        while self.query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ):
            assert time.monotonic() < deadline, "the killed processes' sessions did not end"
            time.sleep(0.05)

    def summary(self) -> str:
        return (
            f"faults {dict(sorted(self.faults.items()))} (total {sum(self.faults.values())});"
            f" targets {dict(sorted(self.targets.items()))};"
            f" runs started {dict(sorted(self.started.items()))};"
            f" exits {dict(sorted(self.exits.items()))}"
        )


def client_ports(pid: int) -> set[int]:
    """The local TCP ports of a process's sockets: its backends' `client_port`s."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# ---------------------------------------------------------------------- the checks


def table_violations(chaos: Chaos) -> list[str]:
    found = []
    for spec in w.SPECS:
        rows = chaos.query(spec.select_rows)
        distinct = len({row[0] for row in rows})
        if (len(rows), distinct) != (spec.rows, spec.rows) or w.rows_sha256(rows) != w.rows_sha256(
            spec.source()
        ):
            found.append(
                f"{spec.table}: {len(rows)} rows for {distinct} distinct ids, source"
                f" {spec.rows} ({len(rows) - distinct} duplicates,"
                f" {spec.rows - distinct} missing; sha256 differs)"
            )
    return found


def lifecycle_violations(chaos: Chaos) -> list[str]:
    found = []
    for row in chaos.query(
        "SELECT s.id, s.step_name, s.status, e.id, e.status, i.job_name,"
        " EXTRACT(EPOCH FROM s.updated_at - e.ended_at)"
        " FROM pybatch.step_execution AS s"
        " JOIN pybatch.job_execution AS e ON e.id = s.job_execution_id"
        " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
        f" WHERE s.status IN {ACTIVE} AND e.status IN {FINISHED} ORDER BY s.id"
    ):
        late = float(row[6] or 0)
        after = f", and committed until {late:.1f} s after it ended" if late > 0 else ""
        found.append(
            f"{row[5]}: step {row[0]} ({row[1]}) is {row[2]} under execution {row[3]}"
            f" {row[4]}{after}"
        )
    for row in chaos.query(
        "SELECT p.id, p.partition_key, p.status, s.id, s.status, k.id, k.status"
        " FROM pybatch.step_partition AS p"
        " JOIN pybatch.step_execution AS s ON s.id = p.step_execution_id"
        " LEFT JOIN pybatch.step_execution AS k ON k.id = p.worker_step_execution_id"
        f" WHERE p.status IN {WORKING} AND s.status IN {FINISHED} ORDER BY p.id"
    ):
        found.append(
            f"partition {row[1]} ({row[0]}) is {row[2]} under step {row[3]} {row[4]}"
            f" (its worker step {row[5]} is {row[6]})"
        )
    for row in chaos.query(
        "SELECT e.id, e.status, i.job_name FROM pybatch.job_execution AS e"
        " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
        f" WHERE e.status NOT IN {FINISHED} ORDER BY e.id"
    ):
        found.append(f"{row[2]}: execution {row[0]} left {row[1]}")
    return found


def counter_violations(chaos: Chaos) -> list[str]:
    """The completed step of each lineage counts every row once (counters carry over)."""
    found = []
    for spec in w.SPECS:
        completed = chaos.query(
            "SELECT s.id, s.read_count, s.write_count FROM pybatch.step_execution AS s"
            " JOIN pybatch.job_execution AS e ON e.id = s.job_execution_id"
            " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
            " WHERE i.job_name = %s AND s.step_logical_id = %s AND s.status = 'COMPLETED'",
            (spec.job, w.STEP_NAME),
        )
        if len(completed) != 1:
            found.append(f"{spec.job}: {len(completed)} COMPLETED '{w.STEP_NAME}' steps, not 1")
            continue
        step_id, read, written = completed[0]
        if (read, written) != (spec.rows, spec.rows):
            found.append(
                f"{spec.job}: step {step_id} counts read {read}, written {written}"
                f" for {spec.rows} rows"
            )
        if spec is not w.PARTITIONED:
            continue
        for key, status, p_written, worker, worker_status, worker_written in chaos.query(
            "SELECT p.partition_key, p.status, p.write_count, s.id, s.status, s.write_count"
            " FROM pybatch.step_partition AS p"
            " LEFT JOIN pybatch.step_execution AS s ON s.id = p.worker_step_execution_id"
            " WHERE p.step_execution_id = %s ORDER BY p.partition_ordinal",
            (step_id,),
        ):
            expected = (w.ROWS_PER_PARTITION, "COMPLETED", w.ROWS_PER_PARTITION)
            if (p_written, worker_status, worker_written) != expected or status != "COMPLETED":
                found.append(
                    f"partition {key} {status} counts written {p_written}; its worker step"
                    f" {worker} is {worker_status} with written {worker_written}"
                    f" (expected {w.ROWS_PER_PARTITION})"
                )
    return found


def audit_violations(server: FaultServer) -> list[str]:
    with JobRepository.connect(server.config()) as repository:
        verification = verify_audit_chain(repository)
    return [] if verification.intact else [verification.describe()]


def history(chaos: Chaos) -> str:
    rows = chaos.query(
        "SELECT i.job_name, COUNT(*), STRING_AGG(e.status, ',' ORDER BY e.attempt)"
        " FROM pybatch.job_execution AS e"
        " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
        " GROUP BY i.job_name ORDER BY i.job_name"
    )
    links = chaos.query("SELECT COUNT(*) FROM pybatch.audit_chain")[0][0]
    return "; ".join(f"{name}: {n} attempts ({statuses})" for name, n, statuses in rows) + (
        f"; {links} audit links"
    )


def dump_state(chaos: Chaos, path: Path) -> None:
    """The executions, steps and partitions at the end, for a post-mortem next to the logs."""
    tables = {
        "job_execution": "SELECT e.id, i.job_name, e.attempt, e.status, e.created_at, e.ended_at"
        " FROM pybatch.job_execution AS e"
        " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id ORDER BY e.id",
        "step_execution": "SELECT id, job_execution_id, step_name, status, write_count,"
        " checkpoint_payload, failure_category, started_at, ended_at, updated_at"
        " FROM pybatch.step_execution ORDER BY id",
        "step_partition": "SELECT id, step_execution_id, partition_key, status,"
        " worker_step_execution_id, write_count FROM pybatch.step_partition ORDER BY id",
    }
    with path.open("w") as out:
        for name, sql in tables.items():
            out.write(f"== {name}\n")
            for row in chaos.query(sql):
                out.write(" | ".join(str(value) for value in row) + "\n")


@pytest.fixture(scope="module")
def proc(chaos_proc: Any) -> Any:
    return chaos_proc


@pytest.mark.parametrize("seed", SEEDS)
def test_faults_under_load_leave_exact_tables_counters_lifecycle_and_audit_chain(
    proc: Any, seed: int, tmp_path: Path
) -> None:
    server = FaultServer(proc, "pybatch_chaos", faults=False)
    with server.admin() as conn:
        for spec in w.SPECS:
            conn.execute(spec.create_table)
    chaos = Chaos(seed, server, tmp_path)
    try:
        elapsed = chaos.run()
    finally:
        chaos.stop_everything()
    dump_state(chaos, tmp_path / "state.txt")
    violations = (
        table_violations(chaos)
        + lifecycle_violations(chaos)
        + counter_violations(chaos)
        + audit_violations(server)
    )
    report = f"chaos seed {seed}: {elapsed:.1f} s to complete; {chaos.summary()}; {history(chaos)}"
    print("\n" + report)
    if violations:
        listed = "\n  ".join(violations[:40])
        more = f"\n  ... and {len(violations) - 40} more" if len(violations) > 40 else ""
        pytest.fail(
            f"{report}\n{len(violations)} violations:\n  {listed}{more}\n"
            f"logs and state.txt: {tmp_path}"
        )
