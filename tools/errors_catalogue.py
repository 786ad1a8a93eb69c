"""Regenerate docs/errors.md from pybatch/errors.py: `python tools/errors_catalogue.py`."""

from __future__ import annotations

from pathlib import Path

from pybatch.errors import catalogue

if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
    target.write_text(catalogue())
    print(f"wrote {target}")
