"""Immutable, validated domain values; no I/O, no SQL, no driver types.

Import each value from its module (`pybatch.values.names`, `pybatch.values.records`, ...).
"""
