"""Services: end-to-end operations composed of units of work (operator requests, retention)."""
