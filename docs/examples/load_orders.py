"""Load a CSV of orders into the table `orders`, 100 rows per chunk; safe to kill and rerun.

PYBATCH_DSN=... python load_orders.py orders.csv
"""

import csv
import sys

from pybatch import ConnectionConfig, Job, JobRepository, StepRun

CHUNK_ROWS = 100


def load(step: StepRun) -> None:
    offset = step.checkpoint.get("offset", 0)
    with open(sys.argv[1], newline="") as source:
        rows = list(csv.reader(source))[offset:]
    for start in range(0, len(rows), CHUNK_ROWS):
        batch = rows[start : start + CHUNK_ROWS]
        with step.chunk() as chunk:
            chunk.executemany("INSERT INTO orders (id, amount) VALUES (%s, %s)", batch)
            offset += len(batch)
            chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})


if __name__ == "__main__":
    with JobRepository.connect(ConnectionConfig.from_env()) as repository:
        with Job(repository, "load_orders", {"file": sys.argv[1]}).launch() as run:
            run.step("load", load)
