"""The write side: one module per capability, each a class of operations bound to a unit of work.

`pybatch/_repository/<capability>.py` runs `queries/<capability>.sql`; its rows are decoded by
`pybatch/_codecs/<capability>.py`. Nothing here opens, commits or rolls back a transaction:
each operation runs in its unit of work's `operation()` (a savepoint), and the few functions
of (statements, connection) that several capabilities share run inside one.
"""
