"""A killed RL run resumes from its last checkpoint and loses no iteration (nor records one twice)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from envs.miniwob.demonstrations import import_demonstrations
from envs.miniwob.live import MiniWoBConfig
from envs.pool import EnvPool
from envs.pool_jobs import PoolConfig
from training.policy.sft import SFTSettings
from training.policy.sft_stage import PolicySettings, run_policy_sft
from training.rl.runs import RLSettings, run_rl
from warehouse.catalog import Warehouse

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[3]
ITERATIONS = 4


def pool_factory(workers: int) -> EnvPool:
    return EnvPool(MiniWoBConfig(), PoolConfig(workers=workers, spares=0))


RUN = textwrap.dedent(
    """
    from tests.training.rl.test_rl_resume import pool_factory, settings
    from training.rl.runs import run_rl
    from warehouse.catalog import Warehouse
    import sys
    if __name__ == "__main__":
        run_rl(Warehouse(sys.argv[1]), settings(), pool_factory, run_id="killed")
    """
)


def settings() -> RLSettings:
    return RLSettings(reward_source="outcome", iterations=ITERATIONS, instances_per_task=2, group_size=2)


def _iterations(home: Path) -> list[int]:
    try:
        rows = Warehouse(home).query("SELECT iteration FROM rl_iterations ORDER BY iteration").to_pylist()
    except Exception:  # noqa: BLE001 - the writer holds the file for a moment
        return []
    return [r["iteration"] for r in rows]


def test_a_killed_run_resumes_and_loses_no_iteration(small_demos, tmp_path):
    home = tmp_path / "home"
    warehouse = Warehouse(home)
    import_demonstrations(small_demos, warehouse, workers=1)
    run_policy_sft(
        warehouse,
        PolicySettings(
            tasks=("login-user",),
            sft=SFTSettings(epochs=3),
            selection_seeds=2,
            sparse_selection_seeds=0,
            sparse_min_solution_steps=1.0,  # login-user is long here, and
            sparse_sampled=False,  # not sampled: no selection_sampled episodes (checked below)
            held_out_seeds=2,
            low=-1,
            high=2,
        ),
        pool_factory,
        run_id="sft",
        log=lambda _: None,
    )
    sampled = warehouse.query("SELECT count(*) AS n FROM agent_eval WHERE evaluation = 'selection_sampled'")
    assert sampled.to_pylist()[0]["n"] == 0
    script = tmp_path / "run.py"
    script.write_text(RUN)
    env = os.environ | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, str(script), str(home)], cwd=REPO, env=env, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and len(_iterations(home)) < 1 and proc.poll() is None:
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # the run, its browsers and workers, as an OOM kill would
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done_before = _iterations(home)
    assert 1 <= len(done_before) < ITERATIONS

    messages: list[str] = []
    result = run_rl(warehouse, settings(), pool_factory, run_id="resumed", log=messages.append)
    assert any("resuming after iteration" in m for m in messages)
    assert _iterations(home) == list(range(ITERATIONS)) and result["iterations"] == ITERATIONS
    counts = warehouse.query(
        "SELECT count(*) AS n, count(DISTINCT episode_id) AS d FROM episodes WHERE policy_id LIKE 'rl:%'"
    ).to_pylist()[0]
    assert counts["n"] == counts["d"] == ITERATIONS * 2 * 2

    # asked again for fewer iterations: nothing trains, and the policy still says what it trained
    fewer = replace(settings(), iterations=ITERATIONS - 1)
    run_rl(warehouse, fewer, pool_factory, run_id="fewer", log=messages.append)
    assert any(
        f"has trained {ITERATIONS} iterations already, more than the {ITERATIONS - 1} asked" in m for m in messages
    )
    assert _iterations(home) == list(range(ITERATIONS))
    recorded = warehouse.query(
        "SELECT DISTINCT json_extract_string(parameters, '$.iterations') AS n FROM policies WHERE kind = 'rl'"
    ).to_pylist()
    assert recorded == [{"n": str(ITERATIONS)}]
