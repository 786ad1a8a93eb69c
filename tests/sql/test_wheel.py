"""The wheel ships queries/ and migrations/ and loads them from the installed package."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from pybatch._migrator import shipped_migrations
from pybatch._statements import load_statements

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, pybatch
from pybatch._statements import load_statements, queries_dir
from pybatch._migrator import shipped_migrations
print(json.dumps({
    "package": pybatch.__file__,
    "queries": str(queries_dir()),
    "statements": sorted(s.name for s in load_statements()),
    "migrations": [[m.version, m.name, m.checksum.hex()] for m in shipped_migrations()],
}))
"""


@pytest.mark.slow
def test_wheel_ships_every_statement_and_migration(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        check=True,
    )
    [wheel] = dist.glob("pybatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for path in (ROOT / "queries").rglob("*.sql"):  # the demo's and the test plugin's too
        assert f"pybatch/_sql/queries/{path.relative_to(ROOT / 'queries').as_posix()}" in names
    for path in (ROOT / "migrations").glob("*.sql"):
        assert f"pybatch/_sql/migrations/{path.name}" in names

    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    python = target / "bin" / "python"
    constraints = ROOT / "constraints.txt"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-c", str(constraints), str(wheel)],
        check=True,
    )
    probe = subprocess.run(
        [str(python), "-c", PROBE], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    installed = json.loads(probe.stdout)
    assert installed["package"].startswith(str(target))
    assert installed["queries"].startswith(str(target))
    assert installed["statements"] == sorted(s.name for s in load_statements())
    assert installed["migrations"] == [
        [m.version, m.name, m.checksum.hex()] for m in shipped_migrations()
    ]
