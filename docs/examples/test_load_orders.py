"""Testing a job with pybatch.testing: it runs, it is killed part-way, it resumes."""

from pathlib import Path

import psycopg

from pybatch import JobExplorer

JOB = Path(__file__).with_name("load_orders.py")


def test_load_orders_survives_a_kill(pybatch_dsn, pybatch_repository, pybatch_job_runner, tmp_path):
    with psycopg.connect(pybatch_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount NUMERIC NOT NULL)")
    source = tmp_path / "orders.csv"
    source.write_text("".join(f"{i},{i % 97}.50\n" for i in range(1, 1001)))

    killed = pybatch_job_runner.run(JOB, str(source), kill_at_chunk=3)
    assert killed.killed
    with psycopg.connect(pybatch_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (300,)

    resumed = pybatch_job_runner.run(JOB, str(source))
    assert resumed.returncode == 0, resumed.stderr
    with psycopg.connect(pybatch_dsn) as conn:
        count, total = conn.execute("SELECT count(*), sum(amount) FROM orders").fetchone()
    assert count == 1000
    assert total == sum(i % 97 for i in range(1, 1001)) + 500

    explorer = JobExplorer(pybatch_repository)
    (instance,) = explorer.instances("load_orders").items
    latest = explorer.executions(instance.id).items[0]
    assert (latest.attempt, latest.status.value) == (2, "COMPLETED")
    assert latest.counts.written == 1000 - 300 + 300  # counters carry over across the restart
