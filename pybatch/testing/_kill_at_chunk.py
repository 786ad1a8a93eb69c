"""`python -m pybatch.testing._kill_at_chunk N POINT SCRIPT ARGS...`: run SCRIPT, die at chunk N.

The job runner's child: it wraps `pybatch.etl.Chunk.commit` so that this process SIGKILLs
itself at its N-th chunk (0: never), right after the COMMIT returned or just before it is
sent, then runs SCRIPT as `__main__`. SIGKILL, not an exception: nothing of the job's own
error handling runs, exactly as when a machine or an OOM killer takes a process down.
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
    """Install the kill point and run the script."""
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
