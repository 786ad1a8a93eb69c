"""Command-line values refused as `CommandArgumentInvalid` (exit 2), never echoing the value."""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Sequence

from pybatch._config import encodes_as_utf8
from pybatch.errors import CommandArgumentInvalid

#: The longest duration any option accepts: 100 years, well inside `timedelta` and `interval`.
MAX_DURATION_DAYS = 36_500
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_MAX_SECONDS = MAX_DURATION_DAYS * 86400
#: More digits than any accepted duration (in seconds) has: longer ones never reach `int()`.
_MAX_DIGITS = len(str(_MAX_SECONDS))


def duration_type(option: str, *, unit_required: bool = True) -> Callable[[str], _dt.timedelta]:
    """An argparse `type` for `90s`, `15m`, `2h`, `90d` (bare seconds unless `unit_required`)."""
    pattern = re.compile(r"([0-9]+)([smhd])" if unit_required else r"([0-9]+)([smhd]?)")
    form = "90s, 15m, 1h, 90d" if unit_required else "90s, 10m, 2h, 1d"
    expected = f"a duration of at most {MAX_DURATION_DAYS}d ({form})"

    def parse(text: str) -> _dt.timedelta:
        if match := pattern.fullmatch(text.strip()):
            digits = match.group(1).lstrip("0") or "0"
            seconds = int(digits) * _SECONDS[match.group(2)] if len(digits) <= _MAX_DIGITS else None
            if seconds is not None and seconds <= _MAX_SECONDS:
                return _dt.timedelta(seconds=seconds)
        raise CommandArgumentInvalid(argument=option, expected=expected)

    return parse


def check_argv(argv: Sequence[str]) -> None:
    """Refuse (by position, never text) an argument with undecodable bytes (lone surrogates)."""
    for position, argument in enumerate(argv, start=1):
        if not encodes_as_utf8(argument):
            raise CommandArgumentInvalid(argument=f"#{position}", expected="valid UTF-8 text")
