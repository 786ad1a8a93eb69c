"""For DBAs: `pybatch migrate`, `schema-version` and `sql list | show | explain | catalogue`."""

from __future__ import annotations

import argparse
import json
import sys

from pybatch import _migrator as migrator
from pybatch import _sql_catalogue as sql_catalogue
from pybatch._cli._connection import Commands, add_command, config_from_args


def register(commands: Commands) -> None:
    migrate = add_command(commands, "migrate", _migrate, help="apply pending schema migrations")
    mode = migrate.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="list pending files, change nothing")
    mode.add_argument("--sql", action="store_true", help="print the exact SQL for a DBA to apply")
    add_command(
        commands, "schema-version", _schema_version, help="print the installed schema version"
    )
    sql = commands.add_parser("sql", help="list, show and explain the statements pybatch runs")
    actions = sql.add_subparsers(dest="sql_command", required=True, metavar="ACTION")
    for name, handler, help_text in (
        ("list", _list, "every statement with its file and :doc line"),
        ("show", _show, "a statement exactly as it runs"),
        ("explain", _explain, "the server's plan of a statement with representative parameters"),
        ("catalogue", _catalogue, "print docs/sql-catalogue.md (Markdown) generated from queries/"),
    ):
        action = add_command(actions, name, handler, connects=name == "explain", help=help_text)
        if name == "list":
            action.add_argument("--json", action="store_true", help="print JSON for scripts")
        elif name != "catalogue":
            action.add_argument("name", help="the statement name (see `pybatch sql list`)")


def _list(args: argparse.Namespace) -> int:
    entries = sql_catalogue.catalogue()
    if args.json:
        print(json.dumps({"items": [e.as_json() for e in entries]}, ensure_ascii=False))
        return 0
    width = max(len(e.name) for e in entries)
    file_width = max(len(e.file) for e in entries)
    for entry in entries:
        print(f"{entry.name.ljust(width)}  {entry.file.ljust(file_width)}  {entry.doc}")
    return 0


def _show(args: argparse.Namespace) -> int:
    entry = sql_catalogue.find(args.name)
    sys.stdout.write(entry.text if entry.text.endswith("\n") else entry.text + "\n")
    return 0


def _explain(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    entry = sql_catalogue.find(args.name)
    params = sql_catalogue.representative_parameters(entry)
    print(f"-- {entry.file} {entry.name}; representative parameters: {json.dumps(params)}")
    print(sql_catalogue.explain(config, entry, params))
    return 0


def _catalogue(args: argparse.Namespace) -> int:
    sys.stdout.write(sql_catalogue.render_markdown())
    return 0


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
