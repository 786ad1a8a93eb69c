"""Services above the repository: composition of units of work, no SQL of their own."""
