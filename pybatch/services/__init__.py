"""Services above the repository: composition of units of work, no SQL of their own.

The operator request, retention and audit services, and the explorer.
"""
