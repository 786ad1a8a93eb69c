"""`pybatch migrate` and `pybatch schema-version` (pybatch._migrator)."""

from __future__ import annotations

import argparse

from pybatch import _migrator as migrator
from pybatch._cli._connection import Commands, add_command, config_from_args


def register(commands: Commands) -> None:
    migrate = add_command(commands, "migrate", _migrate, help="apply pending schema migrations")
    mode = migrate.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="list pending files, change nothing")
    mode.add_argument("--sql", action="store_true", help="print the exact SQL for a DBA to apply")
    add_command(
        commands, "schema-version", _schema_version, help="print the installed schema version"
    )


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
    print(f"installed: {installed if installed is not None else 'none'}")
    print(f"supported: {migrator.supported_schema_version()}")
    return 0
