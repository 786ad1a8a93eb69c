"""Benchmarks: performance claims are shown by programs that print a table, never by tests.

Timed assertions in a test suite fail on a busy machine and pass on a fast one, so they
prove nothing; each module here is run by hand (`python -m bench.<name>`), prints its
figures with the machine they were measured on, and writes them as JSON under
bench/results/ (git-ignored). docs/benchmarks.md records the runs.
"""
