"""Writing outputs (reflact.core.files): permissions as a plain open() gives them, and a full disk."""

from __future__ import annotations

import errno
import os
import pickle
import stat
from pathlib import Path

import pytest

from reflact.core import files
from reflact.core.errors import UserError, exits_on_user_error
from reflact.core.files import atomic_writer, write_json, write_text


@pytest.fixture
def umask():
    """Sets the process umask for one test and restores it after."""
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def write_each_way(root: Path) -> list[Path]:
    """One file per public writer, each in a folder that does not exist yet."""
    write_text(root / "a" / "text.md", "text")
    write_json(root / "b" / "patch.json", {"x": 1}, durable=True)
    with atomic_writer(root / "c" / "d" / "items.jsonl") as handle:
        handle.write("{}\n")
    return [root / "a" / "text.md", root / "b" / "patch.json", root / "c" / "d" / "items.jsonl"]


@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                     (0o002, 0o664, 0o775)], ids=["022", "077", "002"])
def test_outputs_honour_the_umask(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    written = write_each_way(tmp_path)
    assert [mode_of(p) for p in written] == [file_mode] * 3
    assert [mode_of(p.parent) for p in written] == [dir_mode] * 3
    assert mode_of(tmp_path / "c") == dir_mode


def test_rewriting_a_file_gives_it_the_umask_mode_not_the_temporary_files(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "summary.json"
    write_json(path, {"n": 1})
    write_json(path, {"n": 2})
    assert mode_of(path) == 0o644 and path.read_text() == '{\n  "n": 2\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


# ---------------------------------------------------------------- a full disk


class FullHandle:
    """A text handle on a device that is full: every write fails as the kernel says it."""

    def __init__(self, fd: int, code: int) -> None:
        self.fd, self.code = fd, code

    def write(self, text: str) -> int:
        raise OSError(self.code, os.strerror(self.code))

    def fileno(self) -> int:
        return self.fd

    def flush(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


@pytest.fixture
def full_disk(monkeypatch):
    """Writes fail with ENOSPC (or the errno the test sets), as on a full disk."""
    state = {"code": errno.ENOSPC}
    monkeypatch.setattr(files.os, "fdopen", lambda fd, *a, **k: FullHandle(fd, state["code"]))
    return state


def test_full_disk_is_one_line_naming_the_file_and_what_to_do(tmp_path, full_disk):
    path = tmp_path / "patches" / "minibatch_fail_000.json"
    with pytest.raises(UserError) as caught:
        write_json(path, {"patch": {}}, durable=True)
    message = str(caught.value)
    assert message == (f"no space left on the device writing {path}: free space and rerun with the same "
                       "hydra.run.dir")
    assert isinstance(caught.value, files.DiskFull) and caught.value.path == path
    again = pickle.loads(pickle.dumps(caught.value))  # as a launcher's worker process would send it
    assert isinstance(again, files.DiskFull) and str(again) == message


def test_full_disk_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path, full_disk, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old, whole\n")
    with pytest.raises(files.DiskFull):
        write_text(path, "new")
    with pytest.raises(files.DiskFull):
        with atomic_writer(path) as handle:
            handle.write("new")
    assert path.read_text() == "old, whole\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.skipif(not hasattr(errno, "EDQUOT"), reason="no disk quotas here")
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_real_enospc_from_the_kernel_when_the_buffer_is_flushed(tmp_path, monkeypatch):
    def on_full_device(fd, *args, **kwargs):  # the temporary file's handle writes to /dev/full instead
        os.close(fd)
        return open("/dev/full", *args, **kwargs)

    monkeypatch.setattr(files.os, "fdopen", on_full_device)
    path = tmp_path / "kept_items.jsonl"
    with pytest.raises(files.DiskFull, match="no space left on the device writing .*kept_items.jsonl"):
        with atomic_writer(path) as handle:
            handle.write("{}\n")  # buffered: the kernel refuses it when the handle is closed
    assert not list(tmp_path.iterdir())


def test_exceeded_quota_is_reported_like_a_full_disk(tmp_path, full_disk):
    full_disk["code"] = errno.EDQUOT
    with pytest.raises(files.DiskFull, match=r"quota .* writing .*report\.md: free space and rerun"):
        write_text(tmp_path / "report.md", "text")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_full_disk_when_syncing_or_renaming_is_reported_too(tmp_path, monkeypatch, where):
    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, where, full)
    path = tmp_path / "patch.json"
    with pytest.raises(files.DiskFull, match="no space left"):
        write_json(path, {}, durable=True)
    assert not list(tmp_path.iterdir())


def test_other_write_errors_keep_their_own_exception(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "fdopen", lambda fd, *a, **k: FullHandle(fd, errno.EIO))
    with pytest.raises(OSError) as caught:
        write_text(tmp_path / "x.md", "text")
    assert not isinstance(caught.value, UserError) and caught.value.errno == errno.EIO
    assert not list(tmp_path.iterdir())


def test_full_disk_ends_a_command_with_exit_code_2_and_one_line(tmp_path, full_disk, capsys):
    path = tmp_path / "report.md"
    command = exits_on_user_error(lambda: write_text(path, "text"))
    with pytest.raises(SystemExit) as caught:
        command()
    err = capsys.readouterr().err
    assert caught.value.code == 2
    assert err == f"reflact: error: no space left on the device writing {path}: free space and rerun with the " \
                  "same hydra.run.dir\n"


def test_a_file_already_holding_the_bytes_is_left_as_it_is(tmp_path):
    path = tmp_path / "out" / "summary.json"
    write_text(path, "same\n")
    first = path.stat().st_ino
    write_text(path, "same\n")  # a rerun that changes nothing changes no file
    assert path.stat().st_ino == first and path.read_text() == "same\n"
    write_text(path, "other\n")
    assert path.stat().st_ino != first and path.read_text() == "other\n"
    assert not list(path.parent.glob(".*.tmp"))
