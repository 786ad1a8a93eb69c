"""Where `queries/` and `migrations/` are: `pybatch/_sql/` in a wheel, else the repo top."""

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
