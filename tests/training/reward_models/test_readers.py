"""What reward models read from the warehouse: a rollout's stored final screen reaches the state
after its last action, as RL serves it (``training.rl.rewards.base``), so training and serving see
the same input."""

from __future__ import annotations

import dataclasses

from tests.warehouse.test_trajectories import page, publish, rollout
from training.base.states import progress_state, screen_lines
from training.reward_models.readers import read_trajectories
from warehouse.catalog import Warehouse


def test_the_state_after_the_last_action_shows_the_stored_final_screen(tmp_path):
    warehouse = Warehouse(tmp_path / "home")
    stored = rollout("r")
    publish(warehouse, [stored, dataclasses.replace(rollout("old"), final_screen=None)], "a")
    read = read_trajectories(warehouse)
    assert read["r"].final_screen_lines == screen_lines(page("done"))
    assert progress_state(read["r"], 1).screen_lines == screen_lines(page("done"))
    # without a stored final screen the last recorded screen stands in, as before
    assert read["old"].final_screen_lines is None
    assert progress_state(read["old"], 1).screen_lines == screen_lines(stored.screens[1])
    # a restricted read keeps it too
    assert read_trajectories(warehouse, ["r"])["r"].final_screen_lines == screen_lines(page("done"))
    assert read_trajectories(warehouse, ["old"])["old"].final_screen_lines is None
