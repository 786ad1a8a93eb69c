"""pybatch.testing as users install it: in fresh virtualenvs built from this checkout's wheel.

* Without the `testing` extra the plugin is still registered (entry points cannot depend on
  extras), and a pytest run that does not use it is unaffected: same outcome and output as
  with the plugin disabled, and no pytest-postgresql anywhere.
* With the extra, the docs example passes for an ordinary user (as root the run drops to
  `nobody`), starting its own server from the system's PostgreSQL binaries.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
SAMPLE = """
import sys

def test_addition():
    assert 1 + 1 == 2

def test_loading_the_plugin_imported_no_pybatch():
    assert "pybatch_pytest" in sys.modules
    assert "pybatch" not in sys.modules and "psycopg" not in sys.modules

def test_uses_tmp_path(tmp_path):
    (tmp_path / "f").write_text("x")
    assert (tmp_path / "f").read_text() == "x"
"""
NEEDS_EXTRA = """
def test_asks_for_a_repository(pybatch_repository):
    pass
"""


def _base_python() -> str:
    """An interpreter every user can run (as root, the tox interpreter may live under /root)."""
    if os.geteuid() != 0:
        return sys.executable
    for candidate in ("/usr/bin/python3.11", "/usr/local/bin/python3.11"):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("running as root needs a system python3.11 that other users may run")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYBATCH_", "PYTEST_", "VIRTUAL_ENV", "PYTHON"))
    }
    env.update(extra)
    return env


def _run(command: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=900, env=_clean_env(**extra)
    )


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    """A directory every user may read (the normal-user run needs the venv and the files)."""
    path = Path(tempfile.mkdtemp(prefix="pybatch-plugin-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def wheel(workspace: Path) -> Path:
    out = workspace / "dist"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        workspace,
    )
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("pybatch-*.whl")
    return path


def _venv(workspace: Path, name: str, *requirements: str) -> Path:
    venv = workspace / name
    created = _run([_base_python(), "-m", "venv", str(venv)], workspace)
    assert created.returncode == 0, created.stderr
    python = venv / "bin" / "python"
    constraints = ["-c", str(ROOT / "constraints.txt")]
    installed = _run(
        [str(python), "-m", "pip", "install", "-q", *constraints, *requirements], workspace
    )
    assert installed.returncode == 0, installed.stderr
    return python


def _summary(output: str) -> str:
    """The final pytest line without its duration."""
    last = output.strip().splitlines()[-1]
    return re.sub(r" in [0-9.]+s", "", last).strip("= ")


def test_without_the_extra_pytest_is_unaffected(workspace: Path, wheel: Path) -> None:
    python = _venv(workspace, "plain", str(wheel), "pytest")
    project = workspace / "plain-project"
    project.mkdir()
    (project / "test_sample.py").write_text(SAMPLE)
    probe = _run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, importlib.util as u;"
            "print(sorted(e.value for e in m.entry_points(group='pytest11')),"
            " u.find_spec('pytest_postgresql') is None)",
        ],
        project,
    )
    assert probe.stdout.strip() == "['pybatch_pytest'] True", probe.stdout + probe.stderr

    with_plugin = _run([str(python), "-m", "pytest", "-p", "no:cacheprovider"], project)
    without = _run(
        [
            str(python),
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:pybatch",
            "-k",
            "not plugin",
        ],
        project,
    )
    assert with_plugin.returncode == 0, with_plugin.stdout + with_plugin.stderr
    assert _summary(with_plugin.stdout) == "3 passed"
    assert _summary(without.stdout) == "2 passed, 1 deselected"
    assert "warning" not in with_plugin.stdout.lower()
    assert with_plugin.stderr == ""

    (project / "test_needs_extra.py").write_text(NEEDS_EXTRA)
    refused = _run(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_needs_extra.py"],
        project,
    )
    assert refused.returncode == 1
    assert "pip install 'pybatch[testing]'" in refused.stdout
    assert _summary(refused.stdout) == "1 error"


def test_with_the_extra_the_docs_example_passes_as_an_ordinary_user(
    workspace: Path, wheel: Path
) -> None:
    python = _venv(workspace, "testing", f"{wheel}[testing]")
    project = workspace / "user-project"
    project.mkdir()
    for name in ("load_orders.py", "test_load_orders.py"):
        shutil.copy(EXAMPLES / name, project / name)
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    extra: dict[str, str] = {}
    if os.geteuid() == 0:
        shutil.chown(project, "nobody")
        command = ["runuser", "-u", "nobody", "--", *command]
        extra = {"HOME": str(project), "TMPDIR": str(project)}
    result = _run(command, project, **extra)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _summary(result.stdout) == "1 passed"
