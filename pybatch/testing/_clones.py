"""Fresh test databases cloned from the template ahead of the tests that will use them.

`CREATE DATABASE ... TEMPLATE` copies the template's files, a few hundred milliseconds on a
busy machine, so one background thread keeps `depth` clones ready and drops used databases
after their tests; a test then takes a ready database at once. One thread does all of it,
in order, so the template is never copied twice at the same time and a drop never races a
clone. With `depth` 0 every clone and drop happens in the fixture itself.
"""

from __future__ import annotations

import queue
import threading
import uuid
from typing import Any, Protocol

__all__ = ["ClonePool"]

_STOP = "stop"
_CLONE = "clone"
_DROP = "drop"


class _Janitors(Protocol):
    def janitor(self, dbname: str, *, template: str | None = None) -> Any: ...


class ClonePool:
    """Hands out fresh clones of `template` and drops them when they are given back."""

    def __init__(self, server: _Janitors, template: str, *, depth: int) -> None:
        self._server = server
        self._template = template
        self._depth = depth
        self._ready: queue.Queue[tuple[str | None, BaseException | None]] = queue.Queue()
        self._tasks: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failed_drops: list[str] = []
        if depth > 0:
            self._thread = threading.Thread(target=self._work, name="pybatch-clones", daemon=True)
            self._thread.start()
            for _ in range(depth):
                self._tasks.put((_CLONE, None))

    def _clone(self) -> str:
        name = f"pybatch_test_{uuid.uuid4().hex[:16]}"
        self._server.janitor(name, template=self._template).init()
        return name

    def _drop(self, name: str) -> None:
        self._server.janitor(name).drop()

    def _work(self) -> None:
        while True:
            kind, name = self._tasks.get()
            if kind == _STOP:
                return
            if kind == _CLONE:
                try:
                    self._ready.put((self._clone(), None))
                except BaseException as error:  # handed to the test that takes it
                    self._ready.put((None, error))
            elif name is not None:
                try:
                    self._drop(name)
                except Exception:  # retried once more when the session ends
                    self._failed_drops.append(name)

    def take(self, *, timeout: float = 600.0) -> str:
        """A fresh database name; the caller gives it back with `give_back`."""
        if self._thread is None:
            return self._clone()
        self._tasks.put((_CLONE, None))  # keep `depth` clones in flight
        name, error = self._ready.get(timeout=timeout)
        if error is not None:
            raise error
        if name is None:
            raise RuntimeError("the clone thread returned no database")
        return name

    def give_back(self, name: str) -> None:
        """Drop a used database (in the background when prefetching)."""
        if self._thread is None:
            self._drop(name)
        else:
            self._tasks.put((_DROP, name))

    def close(self) -> None:
        """Finish the queued work, then drop the clones no test took."""
        if self._thread is None:
            return
        self._tasks.put((_STOP, None))
        self._thread.join()
        for failed in self._failed_drops:
            self._drop(failed)
        while True:
            try:
                unused, _error = self._ready.get_nowait()
            except queue.Empty:
                return
            if unused is not None:
                self._drop(unused)
