"""Trajectories through the warehouse: what a rollout stores beside its steps (the final screen, the
spec version, failed steps) comes back as it went in, and a file written before those columns
existed reads them as absent."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow.parquet as pq

from warehouse.catalog import Materialization, Warehouse
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.purposes import EpisodePurpose
from warehouse.trajectories import FAILED_STEP_PROBLEM, Trajectory, load_trajectories, trajectories_to_tables

ROOT = UIElement(ref="0", role="body", bounds=(0, 0, 160, 210))


def page(*texts: str) -> Screen:
    return Screen(
        (
            ROOT,
            *(
                UIElement(ref=str(i + 1), role="link", text=t, bounds=(0, 10 * i, 50, 10 * i + 9), depth=1)
                for i, t in enumerate(texts)
            ),
        )
    )


def rollout(episode_id: str, source: str = "rollout") -> Trajectory:
    first, second = page("a", "b"), page("b", "c")
    return Trajectory(
        episode_id=episode_id,
        task_id="click-link",
        instruction='Click the link "c"',
        source=source,
        success=True,
        actions=(
            Action(ActionType.CLICK, target=first.elements[1]),
            Action(ActionType.CLICK, target=second.elements[2]),
        ),
        screens=(first, second),
        milestones_hit=((), ("clicked",)),
        final_screen=page("done"),
        spec_digest="0123456789abcdef",
        failed_steps=frozenset({0}),
    )


def publish(warehouse: Warehouse, trajectories: list[Trajectory], dataset: str) -> str:
    episodes, steps = trajectories_to_tables(
        trajectories, created_at=datetime.now(UTC), run_id=None, purpose=EpisodePurpose.EXPLORATION
    )
    m = Materialization(asset="t")
    outputs = [
        warehouse.stage_table("episodes", dataset, episodes, m),
        warehouse.stage_table("steps", dataset, steps, m),
    ]
    warehouse.publish(m, outputs)
    return str(outputs[0].path)


def test_a_rollouts_final_screen_spec_version_and_failed_steps_come_back_as_stored(tmp_path):
    warehouse = Warehouse(tmp_path / "home")
    stored = rollout("r")
    publish(warehouse, [stored, rollout("d", source="human_demo")], "a")
    loaded = {t.episode_id: t for t in load_trajectories(warehouse)}
    back = loaded["r"]
    assert back.final_screen == stored.final_screen and back.spec_digest == stored.spec_digest
    assert back.failed_steps == frozenset({0}) and back.milestones_hit == stored.milestones_hit
    problems = warehouse.query("SELECT episode_id, step_idx, problem FROM steps ORDER BY episode_id, step_idx")
    assert problems.to_pylist()[2:] == [
        {"episode_id": "r", "step_idx": 0, "problem": FAILED_STEP_PROBLEM},
        {"episode_id": "r", "step_idx": 1, "problem": None},
    ]
    # a recording's step problem is the importer's: its action did happen
    assert loaded["d"].failed_steps == frozenset()
    # without screens nothing of the final screen is read
    unloaded = list(load_trajectories(warehouse, with_screens=False))
    assert all(t.final_screen is None and not t.screens_loaded for t in unloaded)
    assert all(back.screens_loaded for back in loaded.values())


def test_episodes_written_before_the_final_screen_and_spec_version_read_them_as_absent(tmp_path):
    warehouse = Warehouse(tmp_path / "home")
    path = publish(warehouse, [rollout("old")], "old")
    older = pq.read_table(path).drop_columns(["final_screen", "spec_digest"])  # what an older version wrote
    pq.write_table(older, path)
    publish(warehouse, [rollout("new")], "new")
    loaded = {t.episode_id: t for t in load_trajectories(Warehouse(tmp_path / "home"))}
    assert loaded["old"].final_screen is None and loaded["old"].spec_digest is None
    assert loaded["new"].final_screen == page("done") and loaded["new"].spec_digest == "0123456789abcdef"
