"""The write side: one module per capability, each a set of functions of (statements, values).

`pybatch/repository/<capability>.py` runs `queries/<capability>.sql`; its rows are decoded by
`pybatch/codecs/<capability>.py`. Nothing here opens, commits or rolls back a transaction:
`UnitOfWork` (pybatch/unit_of_work.py) runs each function under a savepoint, and
`JobRepository` lives in pybatch/job_repository.py.
"""
