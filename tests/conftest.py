import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
DEMOS_DIR = SHARED / "data" / "miniwob-demos"


@pytest.fixture(scope="session")
def demos_dir() -> Path:
    if not DEMOS_DIR.is_dir():
        pytest.fail(f"the shared demonstrations are missing: {DEMOS_DIR} (tests read ../shared directly)")
    return DEMOS_DIR


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A private STEPWISE_HOME for one test."""
    path = tmp_path / "stepwise-home"
    monkeypatch.setenv("STEPWISE_HOME", str(path))
    monkeypatch.setenv("DAGSTER_HOME", str(path / "dagster"))
    return path


@pytest.fixture(scope="session")
def small_demos(demos_dir, tmp_path_factory) -> Path:
    """A small folder in the demonstrations' format: a few real files of four tasks, including a
    git-style link file and its target, so imports run in seconds."""
    root = tmp_path_factory.mktemp("small-demos")
    for batch, task, count in (
        ("2017-10-16_second-turk", "login-user", 6),
        ("2017-10-16_second-turk", "search-engine", 6),
        ("2017-10-16_second-turk", "click-checkboxes-soft", 6),
        ("2017-10-26_third-turk", "social-media", 4),
    ):
        candidates = sorted((demos_dir / batch / task).glob("*.json.gz"))
        failures = [f for f in candidates[:200] if _raw_reward(f) <= 0][:2]
        files = [f for f in candidates[:count] if f not in failures][: count - len(failures)] + failures
        (root / batch / task).mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(f, root / batch / task / f.name)
    linked = sorted((root / "2017-10-26_third-turk" / "social-media").glob("*.json.gz"))[0]
    link_dir = root / "2017-11-05_fourth-turk" / "social-media"
    link_dir.mkdir(parents=True)
    (link_dir / linked.name).write_text(f"../../2017-10-26_third-turk/social-media/{linked.name}")
    return root


def _raw_reward(path: Path) -> float:
    try:
        return float(json.loads(gzip.decompress(path.read_bytes()))["rawReward"])
    except (OSError, ValueError, KeyError):
        return 0.0


def write_recording(path: Path, recording: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(recording).encode()))
    return path


# pytest-xdist (`make test` runs two workers): tests are handed out in groups (xdist_group_of), so
# a module's tests stay on one worker and its module-scoped fixtures (a Dagster run, a trained
# model) are built once; the tests that start a Ray cluster form one group, as do those of the
# session's Label Studio server, so neither runs twice at once; each benchmark smoke (an
# independent script) is a group of its own. xdist's own --dist loadgroup reads xdist_group marks
# into node ids that pytest 9.2 no longer uses (Node._nodeid became Node._id), so groups are
# given to the scheduler directly (pytest_xdist_make_scheduler).
_SHARED_GROUPS = {
    "tests/envs/test_ray_pool.py": "ray",
    "tests/assets/test_label_families_ray.py": "ray",
    "tests/envs/test_ray_local.py": "ray",
    "tests/benchmarks/test_benchmarks_smoke.py::test_benchmark_smoke_run[bench_rollouts]": "ray",
}

#: Groups of a minute and more, longest first (seconds from the STEPWISE_TEST_TIMES of a two-worker
#: CI run, 2026-11-28), handed out before the rest so that no worker starts one while the other has
#: nothing left; the rest follow in collection order.
SLOW_GROUPS_FIRST: tuple[str, ...] = (
    "ray",  # 375 s
    "tests/assets/test_rl.py",  # 286 s
    "labelstudio",  # 232 s
    "tests/training/reward_models/test_train.py",  # 162 s
    "tests/assets/test_reward_models.py",  # 119 s
    "tests/envs/test_demonstrations.py",  # 105 s
    "tests/assets/test_guidance.py",  # 100 s
    "tests/benchmarks/test_benchmarks_smoke.py::test_benchmark_smoke_run[bench_guidance]",  # 88 s
)


def xdist_group_of(nodeid: str) -> str:
    """The xdist group of a test: a shared group where one is named above, each benchmark smoke its
    own, Label Studio's tests one, every other module its own."""
    module = nodeid.split("::")[0]
    for key in (nodeid, module):
        if key in _SHARED_GROUPS:
            return _SHARED_GROUPS[key]
    if module.startswith("tests/annotation/labelstudio/"):
        return "labelstudio"
    if module == "tests/benchmarks/test_benchmarks_smoke.py":
        return nodeid
    return module


def pytest_collection_modifyitems(config, items):
    """The slow groups first (a stable sort: every other test keeps its place and order)."""
    rank = {group: i for i, group in enumerate(SLOW_GROUPS_FIRST)}
    items.sort(key=lambda item: rank.get(xdist_group_of(item.nodeid), len(rank)))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown where it is not installed
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadgroup``: xdist's scope scheduler over :func:`xdist_group_of`'s groups, in
    collection order (``loadscopereorder`` off: the slow groups were put first)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


def pytest_runtest_logreport(report):
    """With STEPWISE_TEST_TIMES=<file>, each test phase's seconds are appended as it ends (a run's
    slowest tests are known while it runs, and from a run that was stopped)."""
    path = os.environ.get("STEPWISE_TEST_TIMES")
    # under pytest-xdist the controller gets every worker's reports too: written once, there
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a") as sink:
            sink.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")
