"""`pybatch migrate` and `pybatch schema-version` (pybatch.migrator)."""

from __future__ import annotations

import argparse

from pybatch import migrator
from pybatch.cli._connection import add_connection_arguments, config_from_args


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the schema commands."""
    migrate = commands.add_parser("migrate", help="apply pending schema migrations")
    add_connection_arguments(migrate)
    mode = migrate.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="list pending files, change nothing")
    mode.add_argument("--sql", action="store_true", help="print the exact SQL for a DBA to apply")
    migrate.set_defaults(handler=_migrate)

    version = commands.add_parser("schema-version", help="print the installed schema version")
    add_connection_arguments(version)
    version.set_defaults(handler=_schema_version)


def _migrate(args: argparse.Namespace) -> int:

    config = config_from_args(args)
    if args.sql:
        print(migrator.migration_sql(config), end="")
        return 0
    files = migrator.migrate(config, dry_run=args.dry_run)
    verb = "pending" if args.dry_run else "applied"
    for migration in files:
        print(f"{verb} {migration.version:04d}_{migration.name}")
    if not files:
        print(f"schema is at version {migrator.supported_schema_version()}; nothing to do")
    return 0


def _schema_version(args: argparse.Namespace) -> int:

    installed = migrator.installed_schema_version(config_from_args(args))
    supported = migrator.supported_schema_version()
    print(f"installed: {installed if installed is not None else 'none'}")
    print(f"supported: {supported}")
    return 0
