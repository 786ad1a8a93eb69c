"""The demo job and the embedded PostgreSQL it runs on: shipped, out of the core's way."""
