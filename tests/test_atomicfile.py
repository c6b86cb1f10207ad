"""A file or a directory is the old one or the new one, never half of either;
a failed write leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.atomicfile import atomic_directory, atomic_path


class Failed(Exception):
    pass


def write_half_then_fail(path: Path) -> None:
    path.write_text("half")
    raise Failed


def test_a_file_appears_whole_when_the_block_ends(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old")
    with atomic_path(path) as temporary:
        temporary.write_text("new")
        assert path.read_text() == "old"
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_failed_file_write_leaves_the_old_file_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(Failed), atomic_path(path) as temporary:
        write_half_then_fail(temporary)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_directory_replaces_the_old_one_when_the_block_ends(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with atomic_directory(out) as temporary:
        assert temporary.is_dir() and list(temporary.iterdir()) == []
        (temporary / "new.txt").write_text("new")
        assert [p.name for p in out.iterdir()] == ["old.txt"]
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_directory_is_written_where_none_was_parents_included(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "a" / "model"
    with atomic_directory(out) as temporary:
        (temporary / "weights").write_text("w")
    assert (out / "weights").read_text() == "w"
    assert [p.name for p in out.parent.iterdir()] == ["model"]


def test_a_failed_directory_write_leaves_the_old_directory_and_nothing_else(
    tmp_path: Path,
) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(Failed), atomic_directory(out) as temporary:
        write_half_then_fail(temporary / "half.txt")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in out.iterdir()] == ["old.txt"]


def test_what_a_killed_directory_writer_left_is_removed_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "model"
    for left in (".model.tmp", ".model.old"):
        (tmp_path / left).mkdir()
        (tmp_path / left / "stale.txt").write_text("stale")
    with atomic_directory(out) as temporary:
        assert list(temporary.iterdir()) == []
        (temporary / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in out.iterdir()] == ["new.txt"]
