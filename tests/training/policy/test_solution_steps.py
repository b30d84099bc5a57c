"""How long a task's solution is, for the sparse rule's "long task" (``sparse_min_solution_steps``):
human demonstrations first, the experts' exploration rollouts for a task nobody demonstrated, and
never what a policy did (its own or its evaluation episodes)."""

from __future__ import annotations

import pyarrow as pa

from training.policy.sft_stage import demonstration_solution_steps
from warehouse.catalog import Materialization, Warehouse
from warehouse.purposes import EpisodePurpose
from warehouse.schema import EPISODES


def _episodes(rows: list[tuple[str, EpisodePurpose, bool, int]]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {name: None for name in EPISODES.names}
            | {
                "episode_id": f"e{i}",
                "task_id": task,
                "purpose": purpose.value,
                "source": "human_demo" if purpose is EpisodePurpose.DEMONSTRATION else "rollout",
                "success": success,
                "n_steps": steps,
            }
            for i, (task, purpose, success, steps) in enumerate(rows)
        ],
        schema=EPISODES,
    )


def test_human_demonstrations_first_then_the_experts_rollouts_never_a_policys_episodes(tmp_path):
    human, expert = EpisodePurpose.DEMONSTRATION, EpisodePurpose.EXPLORATION
    rows = [
        ("demonstrated", human, True, 4),
        ("demonstrated", human, True, 6),
        ("demonstrated", human, True, 5),
        ("demonstrated", expert, True, 11),  # an expert rollout does not outvote the humans
        ("demonstrated", human, False, 30),  # nor does a failed demonstration count
        ("expert-only", expert, True, 10),
        ("expert-only", expert, True, 8),
        ("expert-only", expert, True, 12),
        ("expert-only", expert, False, 2),
        ("failed-humans", human, False, 7),  # no successful demonstration: the experts' median
        ("failed-humans", expert, True, 3),
        ("policy-only", EpisodePurpose.EVALUATION, True, 9),
        ("policy-only", EpisodePurpose.RL_TRAINING, True, 9),
        ("policy-only", EpisodePurpose.POLICY_ROLLOUT, True, 9),
    ]
    warehouse = Warehouse(tmp_path / "home")
    m = Materialization(asset="human_demonstrations", run_id=None)
    warehouse.publish(m, [warehouse.stage_table("episodes", "test", _episodes(rows), m)])

    assert demonstration_solution_steps(warehouse) == {"demonstrated": 5.0, "expert-only": 10.0, "failed-humans": 3.0}
