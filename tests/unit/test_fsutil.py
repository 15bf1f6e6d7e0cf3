"""Atomic replacement of several private files at once (``replace_files``), on real files:
every target is replaced or none is, and nothing is left behind."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from intloom.fsutil import WRITE_FAULT_ENV, PrivacyError, replace_file, replace_files

pytestmark = pytest.mark.timeout(30)


def _state(directory: Path) -> dict[str, tuple[bytes, int] | str]:
    """Every entry: a file's bytes and inode, or where a link points."""
    out: dict[str, tuple[bytes, int] | str] = {}
    for path in directory.iterdir():
        if path.is_symlink():
            out[path.name] = os.readlink(path)
        else:
            out[path.name] = (path.read_bytes(), path.stat().st_ino)
    return out


def _old_files(directory: Path, names: list[str]) -> None:
    for name in names:
        (directory / name).write_bytes(f"old {name}".encode())


def test_every_file_is_replaced_by_a_new_private_inode(tmp_path: Path) -> None:
    _old_files(tmp_path, ["a", "b"])
    before = _state(tmp_path)
    replace_files(tmp_path, [("a", b"new a"), ("b", b"new b"), ("c", b"new c")])
    after = _state(tmp_path)
    assert sorted(after) == ["a", "b", "c"]  # no temp file left
    assert {name: value[0] for name, value in after.items() if isinstance(value, tuple)} == {
        "a": b"new a", "b": b"new b", "c": b"new c"}
    for name in ("a", "b"):  # renamed over, not written in place
        assert isinstance(after[name], tuple) and isinstance(before[name], tuple)
        assert after[name][1] != before[name][1]
    assert all(stat.S_IMODE((tmp_path / n).stat().st_mode) == 0o600 for n in after)


def test_a_failed_write_replaces_nothing_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _old_files(tmp_path, ["a", "b", "c"])
    before = _state(tmp_path)
    monkeypatch.setenv(WRITE_FAULT_ENV, "b=ENOSPC")  # half of b's bytes, then the error
    with pytest.raises(OSError) as info:
        replace_files(tmp_path, [("a", b"new a"), ("b", b"new b"), ("c", b"new c")])
    assert info.value.errno == 28
    assert _state(tmp_path) == before  # a was written and fsynced, but never renamed


def test_a_link_at_any_target_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "theirs").write_bytes(b"not ours")
    work = tmp_path / "work"
    work.mkdir()
    _old_files(work, ["a"])
    (work / "b").symlink_to(outside / "theirs")
    before = _state(work)
    with pytest.raises(PrivacyError) as info:
        replace_files(work, [("a", b"new a"), ("b", b"new b")])
    assert info.value.path == work / "b" and "symbolic link" in info.value.fact
    assert _state(work) == before
    assert (outside / "theirs").read_bytes() == b"not ours"


def test_a_failed_rename_leaves_the_renamed_ones_and_no_temp_file(tmp_path: Path) -> None:
    _old_files(tmp_path, ["a"])
    (tmp_path / "b").mkdir()  # a directory: a file cannot be renamed over it
    with pytest.raises(IsADirectoryError):
        replace_files(tmp_path, [("a", b"new a"), ("b", b"new b"), ("c", b"new c")])
    assert (tmp_path / "a").read_bytes() == b"new a"  # renamed before b failed
    assert (tmp_path / "b").is_dir() and not (tmp_path / "c").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_replace_file_is_one_item_of_replace_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _old_files(tmp_path, ["a"])
    replace_file(tmp_path, "a", b"new a")
    assert (tmp_path / "a").read_bytes() == b"new a"
    monkeypatch.setenv(WRITE_FAULT_ENV, "a=EIO")
    with pytest.raises(OSError):
        replace_file(tmp_path, "a", b"newer a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert (tmp_path / "a").read_bytes() == b"new a"


def test_metadata_that_is_not_a_private_file_names_the_fix_its_fact_calls_for(
    tmp_path: Path,
) -> None:
    """Each way a metadata path can be wrong gets its own fix: chmod only fixes a mode."""
    from intloom.errors import IntloomError
    from intloom.host.metadata import read_connection

    root = tmp_path
    path = root / "connection.json"
    def empty() -> None:
        path.write_bytes(b"")

    def loose() -> None:
        path.chmod(0o644)

    def link() -> None:
        path.unlink()
        path.symlink_to(root / "elsewhere")

    def directory() -> None:
        path.unlink()
        path.mkdir()

    cases: list[tuple[Callable[[], None], str, str]] = [
        (empty, "is empty (a crash or a full disk", "left as it is"),
        (loose, "has mode 0644", f"Run chmod 600 {path}"),
        (link, "is a symbolic link", f"Move it aside (mv {path} {path}.bad)"),
        (directory, "is not a regular file", f"Move it aside (mv {path} {path}.bad)"),
    ]
    path.write_bytes(b"x")
    path.chmod(0o600)
    for make, fact, fix in cases:
        make()
        with pytest.raises(IntloomError) as info:
            read_connection(path, root)
        message = info.value.message
        assert info.value.code == "CLI_SERVICE_METADATA_INVALID"
        assert fact in message and fix in message, message
        assert "Input data was truncated" not in message
        if fact != "has mode 0644":
            assert "chmod" not in message, message
