"""No evaluation episode (or its seed) reaches a table anything is trained on.

A warehouse holds real human demonstrations, greedy evaluation episodes and guided-agent episodes
on held-out seeds (copies of successful demonstrations, so they would make recipes and examples if
they leaked), and evaluation episodes written before ``episodes.purpose`` existed. Then synthesis,
recipes and labels, the split, three reward-model datasets, the SFT reader and the Label Studio
candidates run on it, and none of them may hold an evaluation episode.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dagster import DagsterInstance, materialize

from annotation.labelstudio.reads import read_step_candidates, read_task_episodes
from annotation.progress.label_io import label_families
from annotation.progress.label_partitions import families_with_new_episodes, run_label_partitions
from annotation.progress.labels import check_progress_labels, run_split, run_synthesis
from assets.demonstrations import DEMONSTRATION_ASSETS
from assets.resources import WarehouseResource
from training.policy.store import HELD_OUT_SEED_BASE, imitation_trajectories
from training.reward_models.dataset import build_reward_model_dataset
from warehouse.catalog import Materialization, Warehouse
from warehouse.purposes import EVALUATION_PURPOSES, TRAINING_PURPOSES, EpisodePurpose, purpose_filter
from warehouse.trajectories import load_trajectories, trajectories_to_tables


def _publish_copies(wh: Warehouse, prefix: str, purpose: EpisodePurpose | None, dataset: str, seed0: int) -> set[str]:
    """Copies of every successful demonstration under new ids and held-out seeds; ``purpose=None``
    writes them as a home from before the column did (null purpose)."""
    demos = [t for t in load_trajectories(wh, "e.source = 'human_demo' AND e.success")]
    copies = [replace(t, episode_id=f"{prefix}:{t.task_id}:{seed0 + i}", source="rollout") for i, t in enumerate(demos)]
    episodes, steps = trajectories_to_tables(
        copies, created_at=datetime.now(UTC), run_id=None, purpose=purpose or EpisodePurpose.EVALUATION
    )
    episodes = episodes.set_column(
        episodes.schema.get_field_index("seed"), "seed", pa.array(range(seed0, seed0 + len(copies)), pa.int64())
    )
    if purpose is None:
        index = episodes.schema.get_field_index("purpose")
        episodes = episodes.set_column(index, episodes.schema.field(index), pa.nulls(len(copies), pa.string()))
    m = Materialization(asset="policy_sft", run_id=None)
    wh.publish(m, [wh.stage_table("episodes", dataset, episodes, m), wh.stage_table("steps", dataset, steps, m)])
    return {c.episode_id for c in copies}


@pytest.fixture
def mixed_home(small_demos, home) -> tuple[Warehouse, set[str]]:
    result = materialize(
        DEMONSTRATION_ASSETS,
        resources={"warehouse": WarehouseResource(home=str(home))},
        run_config={"ops": {"human_demonstrations": {"config": {"demos_dir": str(small_demos), "workers": 1}}}},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    wh = Warehouse(home)
    held_out = HELD_OUT_SEED_BASE
    evaluation = _publish_copies(wh, "eval:sft-test:held_out", EpisodePurpose.EVALUATION, "eval/a", held_out)
    guided = _publish_copies(wh, "guide:sft-test:prm:N=3", EpisodePurpose.GUIDANCE_EVALUATION, "guide/a", held_out)
    legacy = _publish_copies(wh, "eval:sft-old:held_out", None, "eval/old", held_out + 500)
    return wh, evaluation | guided | legacy


def test_purposes_are_stored_or_inferred(mixed_home):
    wh, held_out = mixed_home
    rows = wh.query("SELECT episode_id, source, purpose FROM episodes").to_pylist()
    purpose = {r["episode_id"]: r["purpose"] for r in rows}
    assert all(purpose[e] in EVALUATION_PURPOSES for e in held_out)
    assert {purpose[e] for e in held_out if e.startswith("eval:sft-old")} == {"evaluation"}  # inferred
    assert {r["purpose"] for r in rows if r["source"] == "human_demo"} == {"demonstration"}
    assert set(TRAINING_PURPOSES).isdisjoint(EVALUATION_PURPOSES)
    with pytest.raises(ValueError, match="unknown episode purposes"):
        purpose_filter(purposes=("held_out",))


def test_no_evaluation_episode_reaches_a_training_table(mixed_home):
    wh, held_out = mixed_home
    run_synthesis(wh, log=lambda _: None)
    run_label_partitions(wh, label_families(), mode="full", embedder="hashing", log=lambda _: None)
    run_split(wh, log=lambda _: None)

    def ids(sql: str) -> set[str]:
        return set(wh.query(sql).column(0).to_pylist())

    # Sanity: the stages ran on the demonstrations (an empty table would pass vacuously).
    labelled = ids("SELECT DISTINCT episode_id FROM progress_labels")
    assert len(labelled) > 20
    assert ids("SELECT DISTINCT episode_id FROM progress_split") >= {e for e in labelled if not e.startswith("syn")}
    assert not held_out & labelled
    assert not held_out & ids("SELECT DISTINCT episode_id FROM progress_split")
    assert not held_out & ids("SELECT DISTINCT episode_id FROM label_ledger")
    assert not held_out & ids("SELECT DISTINCT unnest(member_episode_ids) FROM recipes")
    assert not held_out & ids("SELECT DISTINCT parent_episode_id FROM episodes WHERE source LIKE 'synthetic:%'")
    assert check_progress_labels(wh)["every_episode_labelled_or_explained"].passed
    assert families_with_new_episodes(wh) == {}  # evaluation episodes are not "new work" for the labels stage
    for kind in ("orm", "progrm_lcs", "prm"):
        dataset = build_reward_model_dataset(wh, kind)
        examples = dataset.examples
        assert examples.num_rows > 0, kind
        mix = dataset.stats.examples_by_purpose  # the data mix, by split and episode purpose
        assert sum(n for split in mix.values() for n in split.values()) == examples.num_rows, kind
        assert {p for split in mix.values() for p in split} <= set(TRAINING_PURPOSES), kind
        assert not held_out & set(pc.unique(examples.column("episode_id")).to_pylist()), kind
    imitated = {t.episode_id for task in ("login-user", "search-engine") for t in imitation_trajectories(wh, task, 400)}
    assert imitated and not held_out & imitated
    candidates = {c.episode_id for c in read_step_candidates(wh)}
    assert candidates and not held_out & candidates
    assert not held_out & {r["episode_id"] for rows in read_task_episodes(wh, ["login-user"]).values() for r in rows}
    # Seeds: no training table's episode was drawn from the held-out range.
    trained_seeds = wh.query(
        "SELECT e.seed FROM episodes e WHERE e.seed >= ? AND e.episode_id IN "
        "(SELECT episode_id FROM progress_split UNION SELECT episode_id FROM progress_labels)",
        [HELD_OUT_SEED_BASE],
    )
    assert trained_seeds.num_rows == 0


def test_figures_print_the_sections_whose_stages_ran(mixed_home, capsys):
    from pipelines.figures import RL_SECTION, print_figures

    wh, _ = mixed_home
    assert print_figures(wh, "demonstrations") == 1
    out = capsys.readouterr().out
    assert "| human_demo | demonstration |" in out and "| rollout | evaluation |" in out
    assert "| rollout | guidance_evaluation |" in out
    print_figures(wh, "reward models on agent episodes")  # no report yet: said, not raised
    assert "_(nothing yet)_" in capsys.readouterr().out
    assert print_figures(wh, RL_SECTION, sft_policy_id="sft-0123456789") == 0  # the RL section of a named policy
    assert "not available: no policy sft-0123456789 in the warehouse" in capsys.readouterr().out
