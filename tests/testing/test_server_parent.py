"""Where the plugin's throwaway server keeps its files: in memory when it can, else on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

import pybatch.testing as testing
from pybatch.testing import TMPDIR_ENV, server_parent


@pytest.fixture
def memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /dev/shm and a mount table that says what it is."""
    directory = tmp_path / "shm"
    directory.mkdir()
    monkeypatch.setattr(testing, "MEMORY_DIRECTORY", directory)
    monkeypatch.setattr(testing, "_MOUNTS", tmp_path / "mounts")
    monkeypatch.setattr(testing, "MEMORY_MIN_FREE", 0)
    monkeypatch.delenv(TMPDIR_ENV, raising=False)
    return directory


def mount(memory: Path, *kinds: str) -> None:
    lines = ["/dev/vda / ext4 rw,relatime 0 0"]
    lines += [f"{kind} {memory} {kind} rw,relatime 0 0" for kind in kinds]
    (memory.parent / "mounts").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("kind", ["tmpfs", "ramfs"])
def test_a_memory_filesystem_is_chosen(memory: Path, kind: str) -> None:
    mount(memory, kind)
    assert server_parent() == str(memory)


def test_a_disk_filesystem_or_no_mount_leaves_the_system_default(memory: Path) -> None:
    mount(memory)
    assert server_parent() is None
    mount(memory, "ext4")
    assert server_parent() is None
    mount(memory, "tmpfs", "ext4")  # mounted over: the last mount is what is there
    assert server_parent() is None


def test_too_little_free_memory_leaves_the_system_default(
    memory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount(memory, "tmpfs")
    monkeypatch.setattr(testing, "MEMORY_MIN_FREE", 1 << 60)
    assert server_parent() is None


def test_the_environment_variable_wins(memory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mount(memory, "tmpfs")
    monkeypatch.setenv(TMPDIR_ENV, "/var/tmp")
    assert server_parent() == "/var/tmp"


def test_no_mount_table_leaves_the_system_default(memory: Path) -> None:
    assert server_parent() is None  # no mounts file was written
