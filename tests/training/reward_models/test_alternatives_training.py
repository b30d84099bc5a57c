"""Step judges trained on alternatives at one state: the examples they become (grouped, Monte-Carlo
labelled, evaluation states left out), the pairwise loss, batches that keep a state's candidates
together, and a short real training that learns to rank them."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.training.conftest import build_tiny_warehouse
from training.reward_models.dataset import build_reward_model_dataset
from training.reward_models.examples import DatasetOptions
from training.reward_models.labels import alternative_reward, alternative_verdict
from training.reward_models.models import pairwise_loss
from training.reward_models.readers import read_trajectories
from training.reward_models.train_data import GroupedLengthSampler
from warehouse.catalog import Materialization, Warehouse
from warehouse.tables_training import STEP_ALTERNATIVES


def test_the_pairwise_loss_ranks_candidates_of_one_state_only():
    logits = torch.tensor([2.0, 0.0, 5.0, -1.0], requires_grad=True)
    groups = torch.tensor([0, 0, 1, -1])
    values = torch.tensor([1.0, 0.25, 0.0, 1.0])
    loss = pairwise_loss(logits, groups, values)
    # one pair: (0 better than 1 by 0.75); the other examples are alone in their group or in none
    assert loss.item() == pytest.approx(torch.nn.functional.softplus(torch.tensor(-2.0)).item())
    loss.backward()
    assert logits.grad[0] < 0 < logits.grad[1] and logits.grad[2] == logits.grad[3] == 0  # type: ignore[index]
    swapped = pairwise_loss(torch.tensor([0.0, 2.0]), torch.tensor([3, 3]), torch.tensor([1.0, 0.0]))
    assert swapped.item() > loss.item()  # the worse candidate scored higher: a larger loss
    ties = pairwise_loss(torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([0, 0]), torch.tensor([0.5, 0.5]))
    assert ties.item() == 0.0 and ties.requires_grad  # no pair, but the graph stays whole
    weighted = pairwise_loss(torch.tensor([0.0, 0.0, 0.0]), torch.tensor([0, 0, 0]), torch.tensor([1.0, 0.0, 0.75]))
    assert weighted.item() == pytest.approx(np.log(2))  # every pair at z-difference 0, whatever its weight


def test_batches_keep_the_alternatives_of_a_state_together_and_replay_per_epoch():
    groups = np.array([-1, 0, 0, 0, -1, 1, 1, -1, 2, 2, 2, 2])
    lengths = [3, 9, 9, 9, 1, 4, 4, 7, 2, 2, 2, 2]
    sampler = GroupedLengthSampler(4, lengths, groups, seed=5)
    order = list(sampler)
    assert sorted(order) == list(range(len(groups)))
    for g in (0, 1, 2):
        where = [order.index(i) for i in np.flatnonzero(groups == g)]
        assert max(where) - min(where) == len(where) - 1  # contiguous
    assert list(sampler) == order
    sampler.set_epoch(1)
    assert sorted(sampler) == list(range(len(groups)))


def test_labels_of_alternatives_follow_math_shepherd():
    assert alternative_verdict(0.25, ended=False, ended_success=False) == "positive"  # the task can still be done
    assert alternative_verdict(0.0, ended=False, ended_success=False) == "negative"
    assert alternative_verdict(0.9, ended=True, ended_success=False) == "negative"  # its own step ended it, failed
    assert alternative_verdict(None, ended=False, ended_success=False, milestones_hit=("a",)) == "positive"
    assert alternative_verdict(None, ended=False, ended_success=False) == "unsure"
    assert alternative_reward(0.25, ended=False, ended_success=False) == 0.25
    assert alternative_reward(0.0, ended=True, ended_success=True) == 1.0
    assert alternative_reward(None, ended=False, ended_success=False) is None


def _alternatives(warehouse: Warehouse) -> list[dict]:
    """Two candidates at each of the first three steps of every login episode: the recorded action
    (which continued to success in half of its continuations) and clicking Login early (never)."""
    trajectories = read_trajectories(warehouse)
    rows = []
    created = datetime.now(UTC)
    for episode_id, traj in sorted(trajectories.items()):
        if traj.task_id != "login-user":
            continue
        for t in range(min(3, len(traj))):
            state = f"p|{episode_id}|{t}"
            for index, (description, value, recorded) in enumerate(
                ((traj.steps[t].action, 0.5, True), ('CLICK(button#subbtn "Login")', 0.0, False))
            ):
                rows.append(
                    {name: None for name in STEP_ALTERNATIVES.names}
                    | {
                        "alternative_id": f"{state}:{index}",
                        "state_id": state,
                        "episode_id": episode_id,
                        "step_idx": t,
                        "task_id": traj.task_id,
                        "purpose": "policy_rollout",
                        "proposer_policy_id": "p",
                        "round": 1,
                        "candidate": index,
                        "action_description": description,
                        "is_recorded": recorded,
                        "milestones_hit": [],
                        "ended": False,
                        "ended_success": False,
                        "continuations": 4,
                        "continuation_successes": int(4 * value),
                        "mc_value": value,
                        "created_at": created,
                    }
                )
    # a held-out state (an evaluation episode's): measured on, never trained on
    rows.append(rows[0] | {"alternative_id": "held|x:0", "state_id": "held|x", "purpose": "evaluation"})
    return rows


def _publish(warehouse: Warehouse, rows: list[dict]) -> None:
    m = Materialization(asset="step_alternatives")
    table = pa.Table.from_pylist(rows, schema=STEP_ALTERNATIVES)
    warehouse.publish(m, [warehouse.stage_table("step_alternatives", "p/forms/r01", table, m)])


@pytest.fixture(scope="module")
def home_with_alternatives(tmp_path_factory):
    warehouse = build_tiny_warehouse(tmp_path_factory.mktemp("alt-home"), n_login=16, n_button=8)
    _publish(warehouse, _alternatives(warehouse))
    return warehouse


def test_alternatives_become_grouped_examples_of_the_step_judges(home_with_alternatives):
    warehouse = home_with_alternatives
    before = build_tiny_warehouse(warehouse.home.parent / "plain", n_login=16, n_button=8)
    plain = build_reward_model_dataset(before, "prm").examples.to_pylist()
    prm = build_reward_model_dataset(warehouse, "prm")
    rows = prm.examples.to_pylist()
    alt = [r for r in rows if r["group_id"] is not None]
    assert alt and all(r["example_id"].startswith("prm:alt:") for r in alt)
    assert not any(r["group_id"] == "held|x" for r in rows)  # the evaluation state stays out
    by_state: dict[str, list[dict]] = {}
    for r in alt:
        by_state.setdefault(r["group_id"], []).append(r)
    assert {len(v) for v in by_state.values()} == {2}
    for members in by_state.values():
        good, bad = sorted(members, key=lambda r: -r["rank_value"])
        assert (good["label"], bad["label"]) == (1.0, 0.0)  # Math-Shepherd's hard estimate
        assert (good["rank_value"], bad["rank_value"]) == (0.5, 0.0)
        assert bad["action"] == 'CLICK(button#subbtn "Login")' and good["history"] == bad["history"]
        assert good["label_source"] == "alternatives:monte_carlo"
    # the derived verdict of a replayed step gives way to the alternatives' labels; the rest stay
    replayed = {(r["episode_id"], r["step_idx"]) for r in alt}
    derived = [r for r in rows if r["group_id"] is None]
    assert not {(r["episode_id"], r["step_idx"]) for r in derived} & replayed
    assert len(derived) == len([r for r in plain if (r["episode_id"], r["step_idx"]) not in replayed])
    assert prm.stats.dropped["derived verdict replaced by alternatives' labels"] > 0
    # which tasks the model saw candidates of, and how they were labelled (rows before the column: replayed)
    train_states = {r["group_id"] for r in alt if r["split"] == "train"}
    assert train_states and prm.summary()["alternative_states_by_task"] == {"login-user": {"replay": len(train_states)}}
    assert "step_alternatives" in {i.input_asset for i in prm.inputs}
    assert {r["split"] for r in alt} <= {"train", "validation", "test"}
    guidnav = build_reward_model_dataset(warehouse, "guidnav").examples.to_pylist()
    assert sorted({r["label"] for r in guidnav if r["group_id"]}) == [0.0, 0.5]  # the soft estimate
    progress = build_reward_model_dataset(warehouse, "progrm_env").examples
    assert progress["group_id"].null_count == progress.num_rows  # progress models read no alternatives
    without = build_reward_model_dataset(warehouse, "prm", DatasetOptions(alternatives=False))
    assert without.examples["group_id"].null_count == without.examples.num_rows  # the ablation: executed steps only
    assert without.examples.num_rows == len(plain) and "step_alternatives" not in {
        i.input_asset for i in without.inputs
    }


def test_a_step_judge_trained_with_the_pairwise_loss_ranks_the_alternatives(home_with_alternatives, tmp_path):
    from training.base.states import StepState
    from training.reward_models.models import RewardScorer
    from training.reward_models.train import parse_args, train_reward_model

    examples = build_reward_model_dataset(home_with_alternatives, "prm").examples
    path = tmp_path / "prm.parquet"
    pq.write_table(examples, path)
    old = tmp_path / "old.parquet"  # a dataset written before the group columns existed still trains
    pq.write_table(examples.drop_columns(["group_id", "rank_value"]), old)
    argv = [
        "--kind",
        "prm",
        "--output_dir",
        str(tmp_path / "trainer"),
        "--embedding_cache_dir",
        str(tmp_path / "cache"),
        "--max_steps",
        "40",
        "--per_device_train_batch_size",
        "16",
        "--learning_rate",
        "3e-3",
        "--save_steps",
        "1000",
        "--disable_tqdm",
        "true",
        "--eval_strategy",
        "no",
        "--warmup_steps",
        "0",
    ]
    summary = train_reward_model(*parse_args(["--examples", str(path), *argv]))
    assert summary["global_steps"] == 40
    scorer = RewardScorer.from_checkpoint(tmp_path / "trainer" / "final")
    groups: dict[str, list[dict]] = {}
    for r in examples.to_pylist():
        if r["group_id"] and r["split"] == "train":
            groups.setdefault(r["group_id"], []).append(r)
    right = 0
    for members in groups.values():
        states = [
            StepState(m["instruction"], tuple(m["history"]), tuple(m["screen_lines"]), m["action"]) for m in members
        ]
        scores = scorer.score_states(states)
        right += members[int(np.argmax(scores))]["rank_value"] == max(m["rank_value"] for m in members)
    assert right / len(groups) >= 0.8, (right, len(groups))
    plain = train_reward_model(*parse_args(["--examples", str(old), *argv[:3], str(tmp_path / "t2"), *argv[4:]]))
    assert plain["global_steps"] == 40


def test_a_limit_on_examples_takes_a_seeded_sample_with_whole_groups_not_the_first_rows():
    from training.reward_models.train_data import split_table

    n = 400
    groups = [None if i % 5 else f"g{i}" for i in range(n)]
    groups = [g if g is not None or i % 5 != 1 else f"g{i - 1}" for i, g in enumerate(groups)]  # groups of 2
    table = pa.table({"split": ["train"] * n, "episode": list(range(n)), "group_id": groups})
    sample = split_table(table, "train", 100)
    picked = sample["episode"].to_pylist()
    assert len(picked) == 100 and picked == sorted(picked)
    assert max(picked) > 300  # spread over the table, not its first rows
    for g in {g for g in sample["group_id"].to_pylist() if g}:
        assert sample["group_id"].to_pylist().count(g) == groups.count(g)  # whole
    assert split_table(table, "train", 100)["episode"].to_pylist() == picked  # seeded
    assert split_table(table, "train", None).num_rows == n == split_table(table, "train", 10**6).num_rows


def test_candidates_labelled_from_the_recording_train_the_step_judges_by_the_recordings_evidence(tmp_path):
    """Issue 42 item 2: where no replay reproduced a state, its candidates come labelled from the
    recording. The PRM learns them as the recording judges them (the plan's step right, another
    action wrong, a candidate nothing decides left out), under their own label source, and the
    dataset counts the states per task by how they were labelled."""
    warehouse = build_tiny_warehouse(tmp_path / "home", n_login=16, n_button=8)
    rows = []
    for r in _alternatives(warehouse):
        plan = r["is_recorded"] if r["candidate"] == 0 or r["step_idx"] < 2 else None  # no plan at step 2's Login
        rows.append(
            r
            | {
                "labelled_by": "recording",
                "matches_plan": plan,
                "mc_value": None,
                "continuations": 0,
                "continuation_successes": 0,
                "is_recorded": False,  # nothing here continued: only the plan decides
            }
        )
    _publish(warehouse, rows)
    prm = build_reward_model_dataset(warehouse, "prm")
    alt = [r for r in prm.examples.to_pylist() if r["group_id"] is not None]
    assert alt and {r["label_source"] for r in alt} == {"alternatives:recording"}
    by_id = {r["alternative_id"]: r for r in rows}
    for example in alt:
        source = by_id[example["example_id"].removeprefix("prm:alt:")]
        assert example["label"] == (1.0 if source["matches_plan"] else 0.0)
        assert source["matches_plan"] is not None  # the undecided ones are dropped as unsure
    assert prm.stats.dropped["unsure (alternatives)"] == sum(
        1 for r in rows if r["matches_plan"] is None and r["purpose"] != "evaluation"
    )
    train_states = {r["group_id"] for r in alt if r["split"] == "train"}
    assert prm.summary()["alternative_states_by_task"] == {"login-user": {"recording": len(train_states)}}
