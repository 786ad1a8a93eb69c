"""`pybatch worker`: join a running partitioned step from any host, as its local workers do."""

from __future__ import annotations

import argparse
import datetime
import importlib
from collections.abc import Callable
from functools import partial
from typing import Any

from pybatch._cli._connection import Commands, add_command, connect
from pybatch.etl import join_partitioned_step


def register(commands: Commands) -> None:
    worker = add_command(
        commands, "worker", _worker, help="work on the partitions of a running partitioned step"
    )
    worker.add_argument("--job", required=True, help="job name")
    for flag, metavar, kind in (
        ("--param", "NAME=TEXT", "string"),
        ("--param-int", "NAME=N", "integer"),
        ("--param-bool", "NAME=true|false", "boolean"),
    ):
        worker.add_argument(
            flag, action="append", default=[], metavar=metavar, help=f"{kind} parameter"
        )
    worker.add_argument("--step", required=True, help="name of the partitioned step")
    worker.add_argument(
        "--function", required=True, metavar="MODULE:NAME", help="the partition function"
    )
    seconds = partial(worker.add_argument, type=float, metavar="SECONDS")
    seconds(
        "--wait", default=60.0, help="how long to wait for the job to publish the plan (default 60)"
    )
    seconds(
        "--lease",
        default=10.0,
        help="this worker's lease on each partition it runs, 1 to 3600 (default 10): after "
        "a crash its partition is recovered at most this long after the last renewal",
    )


def _pairs(values: list[str], parser_error: Callable[[str], Any]) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name:
            parser_error(f"expected NAME=VALUE, got {value!r}")
        pairs.append((name, text))
    return pairs


def parameters(args: argparse.Namespace) -> dict[str, str | int | bool]:
    """The identifying parameters given with --param, --param-int and --param-bool."""

    def refuse(message: str) -> None:
        raise SystemExit(f"pybatch worker: {message}")

    result: dict[str, str | int | bool] = dict(_pairs(args.param, refuse))
    for name, text in _pairs(args.param_int, refuse):
        try:
            result[name] = int(text)
        except ValueError:
            refuse(f"--param-int {name} is not an integer")
    for name, text in _pairs(args.param_bool, refuse):
        if text not in ("true", "false"):
            refuse(f"--param-bool {name} is true or false")
        result[name] = text == "true"
    return result


def load_function(spec: str) -> Callable[..., None]:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise SystemExit("pybatch worker: --function is MODULE:NAME")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise SystemExit(f"pybatch worker: cannot import {spec}: {type(error).__name__}") from None
    if not callable(function):
        raise SystemExit(f"pybatch worker: {spec} is not callable")
    return function  # type: ignore[no-any-return]


def _worker(args: argparse.Namespace) -> int:
    params = parameters(args)
    work = load_function(args.function)
    if not 0.0 <= args.wait <= 86400.0:
        raise SystemExit("pybatch worker: --wait is 0 to 86400 seconds")
    if not 1.0 <= args.lease <= 3600.0:
        raise SystemExit("pybatch worker: --lease is 1 to 3600 seconds")
    lease = datetime.timedelta(seconds=args.lease)
    with connect(args) as repository:
        ran = join_partitioned_step(
            repository, args.job, params, args.step, work, wait_seconds=args.wait, lease=lease
        )
    print(f"worked on {ran} partitions of {args.job} step {args.step}")
    return 0
