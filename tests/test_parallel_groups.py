"""The suite's pytest-xdist groups (tests/conftest.py): tests that start a shared outside system stay
in one group, so two workers never start it twice at once."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO_ROOT, SLOW_GROUPS_FIRST, xdist_group_of

TESTS = REPO_ROOT / "tests"


def _modules_naming(pattern: str) -> list[str]:
    return sorted(
        path.relative_to(REPO_ROOT).as_posix()
        for path in TESTS.rglob("test_*.py")
        if path.name != Path(__file__).name and re.search(pattern, path.read_text())
    )


def test_every_module_that_starts_a_ray_cluster_is_in_the_ray_group():
    modules = _modules_naming(r"LocalRayCluster\(")
    assert modules, "no test starts a Ray cluster any more: update _SHARED_GROUPS"
    assert {m: xdist_group_of(f"{m}::test_x") for m in modules} == {m: "ray" for m in modules}
    rollouts = "tests/benchmarks/test_benchmarks_smoke.py::test_benchmark_smoke_run[bench_rollouts]"
    assert xdist_group_of(rollouts) == "ray"  # its smoke starts Ray clusters too


def test_every_module_on_the_session_label_studio_server_is_in_one_group():
    # a test or fixture taking the session server's fixtures as parameters
    modules = _modules_naming(r"def \w+\([^)]*\b(ls_server|ls_credentials|ls_resource)\b")
    assert modules
    assert {xdist_group_of(f"{m}::test_x") for m in modules} == {"labelstudio"}


def test_other_modules_are_groups_of_their_own_and_benchmark_smokes_one_each():
    assert xdist_group_of("tests/warehouse/test_storage.py::test_a") == "tests/warehouse/test_storage.py"
    assert xdist_group_of("tests/warehouse/test_storage.py::test_b") == "tests/warehouse/test_storage.py"
    a = xdist_group_of("tests/benchmarks/test_benchmarks_smoke.py::test_benchmark_smoke_run[bench_rl]")
    b = xdist_group_of("tests/benchmarks/test_benchmarks_smoke.py::test_benchmark_smoke_run[bench_llm]")
    assert a != b
    # the slow groups named first exist
    groups = {xdist_group_of(f"{p.relative_to(REPO_ROOT).as_posix()}::t") for p in TESTS.rglob("test_*.py")} | {
        "ray",
        "labelstudio",
    }
    smokes = {g for g in SLOW_GROUPS_FIRST if "test_benchmark_smoke_run[" in g}
    assert set(SLOW_GROUPS_FIRST) - smokes <= groups
