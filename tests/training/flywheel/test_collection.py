"""Policy rollouts: which checkpoint, which tasks, which seeds, checked before any browser starts."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from training.flywheel.collection import (
    MAX_ROUNDS,
    SEEDS_PER_ROUND,
    CollectionError,
    CollectionRequest,
    collection_tasks,
    policy_keys,
    resolve_policy,
    run_collection,
)
from training.policy.evaluation import sample_seeds
from training.policy.store import HELD_OUT_SEED_BASE, POLICY_ROLLOUT_SEED_BASE, SELECTION_SEED_BASE, TRAIN_SEED_BASE
from warehouse.catalog import Materialization, Warehouse
from warehouse.tables_rl import POLICIES


def _policies(wh: Warehouse, rows: list[dict]) -> None:
    base = {name: None for name in POLICIES.names}
    table = pa.Table.from_pylist([base | r for r in rows], schema=POLICIES)
    m = Materialization(asset="policy_sft")
    wh.publish(m, [wh.stage_table("policies", "p", table, m)])


def _row(
    policy_id: str, kind: str, created: int, reward_source: str | None = None, estimator: str | None = None
) -> dict:
    return {
        "policy_id": policy_id,
        "kind": kind,
        "reward_source": reward_source,
        "estimator": estimator or ("reinforce_pp" if reward_source else None),
        "checkpoint_path": f"policies/{policy_id}",
        "tasks": ["login-user", "click-tab-2-medium"],
        "created_at": datetime(2026, 1, created, tzinfo=UTC),
    }


def test_the_seed_range_meets_no_other_range():
    rounds = [CollectionRequest("sft", "miniwob-forms", round=r, episodes_per_task=SEEDS_PER_ROUND) for r in (0, 99)]
    collected = {s for r in rounds for s in r.seeds}
    assert min(collected) == POLICY_ROLLOUT_SEED_BASE
    for base in (TRAIN_SEED_BASE, SELECTION_SEED_BASE, HELD_OUT_SEED_BASE):
        # every other range draws from [base, base + 100_000) (training also adds 10_000 per RL seed)
        assert not collected & set(range(base, base + 200_000))
        assert not collected & set(sample_seeds(base, 50, "held_out"))
    assert max(collected) < POLICY_ROLLOUT_SEED_BASE + SEEDS_PER_ROUND * MAX_ROUNDS <= 5_000_000
    # same round, same instances, whichever policy: common random numbers
    assert CollectionRequest("sft", "f").seeds == CollectionRequest("rl-orm", "f").seeds


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"round": -1}, "round must be"),
        ({"round": MAX_ROUNDS}, "round must be"),
        ({"episodes_per_task": 0}, "episodes_per_task"),
        ({"temperature": 0.0}, "temperature must be positive"),
        ({"workers": 0}, "workers"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(CollectionError, match=message):
        CollectionRequest("sft", "miniwob-forms", **kwargs)


def test_the_policy_named_by_a_partition_is_the_newest_of_its_kind(tmp_path):
    wh = Warehouse(tmp_path / "home")
    _policies(
        wh,
        [
            _row("sft-old", "sft", 1),
            _row("sft-new", "sft", 2),
            _row("rl-orm-a", "rl", 3, "orm"),
            _row("rl-orm-b", "rl", 4, "orm"),
            _row("rl-outcome-a", "rl", 5, "outcome"),
            _row("rl-outcome-kl-apart", "rl", 6, "outcome", "reinforce_pp_kl_apart"),  # newer, another estimator
        ],
    )
    assert resolve_policy(wh, "rl-outcome")["policy_id"] == "rl-outcome-a"
    assert resolve_policy(wh, "sft")["policy_id"] == "sft-new"
    assert resolve_policy(wh, "rl-orm")["policy_id"] == "rl-orm-b"
    assert resolve_policy(wh, "sft-old")["policy_id"] == "sft-old"
    with pytest.raises(CollectionError, match="rl policy trained with reward prm"):
        resolve_policy(wh, "rl-prm")
    assert policy_keys(("outcome", "orm")) == ["sft", "rl-outcome", "rl-orm"]


def test_tasks_default_to_the_policys_own_in_the_family():
    row = _row("p", "sft", 1)
    ids = [t.task_id for t in collection_tasks(CollectionRequest("p", "miniwob-navigation"), row)]
    assert ids == ["click-tab-2-medium"]
    everything = collection_tasks(CollectionRequest("p", "miniwob-navigation", all_tasks=True), row)
    assert len(everything) > 1
    with pytest.raises(CollectionError, match="has no task in family miniwob-choice"):
        collection_tasks(CollectionRequest("p", "miniwob-choice"), row)
    with pytest.raises(CollectionError, match="not in the catalog"):
        collection_tasks(CollectionRequest("p", "miniwob-choice", tasks=("no-such-task",)), row)


def test_a_missing_policy_fails_before_any_environment(tmp_path):
    wh = Warehouse(tmp_path / "home")

    def no_pool(workers):
        raise AssertionError("no environment may start")

    with pytest.raises(CollectionError, match="no sft policy"):
        run_collection(wh, CollectionRequest("sft", "miniwob-forms"), no_pool, run_id=None, partition_key=None)


def test_a_checkpoint_that_does_not_load_fails_before_any_environment(tmp_path):
    wh = Warehouse(tmp_path / "home")
    _policies(wh, [_row("sft-broken", "sft", 1)])
    folder = wh.resolve("policies/sft-broken")
    folder.mkdir(parents=True)
    (folder / "policy_config.json").write_text('{"scorer": {}}')
    (folder / "policy.pt").write_bytes(b"not a checkpoint")  # truncated, or another program's file

    def no_pool(workers):
        raise AssertionError("no environment may start")

    request = CollectionRequest("sft", "miniwob-forms")
    with pytest.raises(CollectionError, match="sft-broken: its checkpoint .* cannot be loaded"):
        run_collection(wh, request, no_pool, run_id=None, partition_key=None)
