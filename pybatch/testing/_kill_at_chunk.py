"""`python -m pybatch.testing._kill_at_chunk N POINT SCRIPT ARGS...`: run SCRIPT, die at chunk N.

SIGKILL (N 0: never), not an exception: none of the job's error handling runs, as when an OOM
killer takes the process down.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from typing import Any

from pybatch import etl


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    kill_at, point, script, *args = argv
    target = int(kill_at)
    original = etl.Chunk.commit
    seen = 0

    def commit(self: etl.Chunk, /, **kwargs: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == target and point == "before_commit":
            _die()
        original(self, **kwargs)
        if seen == target and point == "after_commit":
            _die()

    if target:
        etl.Chunk.commit = commit  # type: ignore[method-assign,assignment]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
