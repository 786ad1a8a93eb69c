"""Immutable, validated domain values (no I/O, SQL or driver types); import each from its module."""
