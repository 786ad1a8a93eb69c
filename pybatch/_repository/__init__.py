"""The write side: `<capability>.py` runs `queries/<capability>.sql` in its unit of work.

Nothing here opens, commits or rolls back a transaction (docs/architecture.md).
"""
