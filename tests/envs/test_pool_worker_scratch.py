"""The pool removes a killed worker's scratch folders itself (envs.pool_worker.ProcessWorker.kill):
the worker cannot, and an environment's own reaping (envs.scratch) is not what this checks, so the
folder here has no owner record for any reaper to act on."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from envs.pool_worker import ProcessWorker, worker_context


class _FolderEnv:
    backend = "folder"
    supported_actions = frozenset()

    def __init__(self, folder: str) -> None:
        self.scratch_paths = (folder,)
        Path(folder, "profile").mkdir(parents=True)

    def close(self) -> None:  # a worker that is killed never gets here
        pass


@dataclass(frozen=True)
class _FolderEnvConfig:
    folder: str

    def create(self) -> _FolderEnv:
        return _FolderEnv(self.folder)


def test_a_killed_workers_scratch_is_removed_by_the_pool(tmp_path):
    folder = str(Path(tempfile.mkdtemp(dir=tmp_path)) / "scratch")
    worker = ProcessWorker("w0", _FolderEnvConfig(folder), 0, worker_context())
    try:
        worker.wait_ready(60)
        assert worker.scratch == (folder,) and Path(folder, "profile").is_dir()
    finally:
        worker.kill()
    assert not worker.process.is_alive()
    assert not Path(folder).exists()
