"""Where the shipped `queries/` and `migrations/` folders are.

In a wheel they are packaged as `pybatch/_sql/queries` and `pybatch/_sql/migrations`;
in a source checkout (or an editable install) they sit at the repository's top level,
where DBAs review them.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _locate(name: str) -> Path:
    for candidate in (_PACKAGE / "_sql" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"pybatch is installed without its {name}/ folder")


def queries_dir() -> Path:
    """The folder of named pugsql statements."""
    return _locate("queries")


def migrations_dir() -> Path:
    """The folder of numbered migration files."""
    return _locate("migrations")
