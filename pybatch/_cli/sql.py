"""`pybatch sql list | show | explain | catalogue`: the shipped statements, for DBAs."""

from __future__ import annotations

import argparse
import json
import sys

from pybatch import _sql_catalogue as sql_catalogue
from pybatch._cli._connection import Commands, add_command, config_from_args


def register(commands: Commands) -> None:
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
