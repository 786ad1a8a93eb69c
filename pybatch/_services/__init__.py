"""Services above the repository (operator, retention, audit, flow): units of work, no SQL."""
