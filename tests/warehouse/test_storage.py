"""The one atomic write every module uses: the old file or the whole new one, never a half."""

from __future__ import annotations

import os
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from warehouse.storage import atomic_path, write_atomic, write_parquet_atomic


def test_write_atomic_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "deep" / "config.json"
    write_atomic(path, "first")
    write_atomic(path, b"second \xc3\xa9")
    assert path.read_text() == "second é"
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.json"]


def test_a_failing_writer_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    path = tmp_path / "table.parquet"
    write_parquet_atomic(pa.table({"x": [1, 2]}), path)
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"half a file")
            raise RuntimeError("disk full")
    assert pq.read_table(path).column("x").to_pylist() == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.parquet"]


def test_modes_follow_the_umask_and_secrets_stay_private(tmp_path):
    umask = os.umask(0o022)
    try:
        plain = write_atomic(tmp_path / "plain.txt", "x")
        secret = write_atomic(tmp_path / "secret.json", "{}", mode=0o600)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(plain.stat().st_mode) == 0o644
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_a_required_extension_is_kept_on_the_temporary(tmp_path):
    import numpy as np

    with atomic_path(tmp_path / "embeddings.npy", suffix=".tmp.npy") as tmp:
        np.save(tmp, np.arange(3))
        assert tmp.exists()  # np.save added no second extension
    assert np.load(tmp_path / "embeddings.npy").tolist() == [0, 1, 2]


def test_a_folder_is_swapped_in_whole_and_a_failed_write_keeps_the_old_one(tmp_path):
    from warehouse.storage import replace_dir_atomic

    target = tmp_path / "model"
    replace_dir_atomic(target, lambda d: (d / "weights").write_text("v1"))
    replace_dir_atomic(target, lambda d: (d / "weights").write_text("v2"))
    assert (target / "weights").read_text() == "v2" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]

    def killed(d):
        (d / "weights").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_dir_atomic(target, killed)
    assert (target / "weights").read_text() == "v2" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_an_old_folder_left_by_a_killed_delete_never_blocks_a_save_and_modes_are_mkdirs(tmp_path):
    """The old folder goes to a name of its own (one left behind by a killed ``rmtree`` used to make
    every later save fail), and the new folder has ``mkdir``'s mode, not ``mkdtemp``'s 0700."""
    from warehouse.storage import replace_dir_atomic

    target = tmp_path / "final"
    replace_dir_atomic(target, lambda d: (d / "config.json").write_text("{}"))
    stale = tmp_path / ".final.old"
    (stale / "backbone").mkdir(parents=True)  # as a killed save of the former code left it
    replace_dir_atomic(target, lambda d: (d / "config.json").write_text('{"v": 2}'))
    assert (target / "config.json").read_text() == '{"v": 2}'
    reference = tmp_path / "made-by-mkdir"
    reference.mkdir()
    assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(reference.stat().st_mode)
