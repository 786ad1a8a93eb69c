"""`pybatch sql list | show | explain | catalogue`: the shipped statements, for DBAs."""

from __future__ import annotations

import argparse
import json
import sys

from pybatch import _sql_catalogue as sql_catalogue
from pybatch._cli._connection import add_connection_arguments, config_from_args


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sql = commands.add_parser("sql", help="list, show and explain the statements pybatch runs")
    actions = sql.add_subparsers(dest="sql_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every statement with its file and :doc line")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(handler=_list)
    show = actions.add_parser("show", help="a statement exactly as it runs")
    show.add_argument("name", help="the statement name (see `pybatch sql list`)")
    show.set_defaults(handler=_show)
    explain = actions.add_parser(
        "explain", help="the server's plan of a statement with representative parameters"
    )
    explain.add_argument("name", help="the statement name (see `pybatch sql list`)")
    add_connection_arguments(explain)
    explain.set_defaults(handler=_explain)
    catalogue = actions.add_parser(
        "catalogue", help="print docs/sql-catalogue.md (Markdown) generated from queries/"
    )
    catalogue.set_defaults(handler=_catalogue)


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
