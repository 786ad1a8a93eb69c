"""`pybatch worker`: join a running partitioned step from any host, as its local workers do."""

from __future__ import annotations

import argparse
import datetime
import importlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import NoReturn

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


def _refuse(message: str) -> NoReturn:
    raise SystemExit(f"pybatch worker: {message}")


def _pairs(values: list[str]) -> Iterator[tuple[str, str]]:
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name:
            _refuse(f"expected NAME=VALUE, got {value!r}")
        yield name, text


def parameters(args: argparse.Namespace) -> dict[str, str | int | bool]:
    """The identifying parameters given with --param, --param-int and --param-bool."""
    result: dict[str, str | int | bool] = dict(_pairs(args.param))
    for name, text in _pairs(args.param_int):
        try:
            result[name] = int(text)
        except ValueError:
            _refuse(f"--param-int {name} is not an integer")
    for name, text in _pairs(args.param_bool):
        if text not in ("true", "false"):
            _refuse(f"--param-bool {name} is true or false")
        result[name] = text == "true"
    return result


def load_function(spec: str) -> Callable[..., None]:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        _refuse("--function is MODULE:NAME")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        _refuse(f"cannot import {spec}: {type(error).__name__}")
    if not callable(function):
        _refuse(f"{spec} is not callable")
    return function  # type: ignore[no-any-return]


def _worker(args: argparse.Namespace) -> int:
    params = parameters(args)
    work = load_function(args.function)
    if not 0.0 <= args.wait <= 86400.0:
        _refuse("--wait is 0 to 86400 seconds")
    if not 1.0 <= args.lease <= 3600.0:
        _refuse("--lease is 1 to 3600 seconds")
    lease = datetime.timedelta(seconds=args.lease)
    with connect(args) as repository:
        ran = join_partitioned_step(
            repository, args.job, params, args.step, work, wait_seconds=args.wait, lease=lease
        )
    print(f"worked on {ran} partitions of {args.job} step {args.step}")
    return 0
