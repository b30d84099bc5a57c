"""Label families as tasks on a real Ray cluster (a loopback node of its own): a run that brings
several families up to date runs each as a Ray task, with the rows of running them here."""

from __future__ import annotations

import shutil

import pytest
import ray
from dagster import DagsterInstance, materialize

from assets.labels import LABEL_CHECKS, all_label_families_tags, recipes_and_progress_labels
from assets.resources import WarehouseResource
from envs.ray_local import LocalRayCluster
from tests.annotation.helpers import publish_tiny_episodes
from warehouse.catalog import Warehouse

pytestmark = pytest.mark.e2e

ROW = "episode_id, step_idx, source, method, progress, is_key_step, recipe_id, completion_ratio, label_version"


def _labels(home, instance=None, **config):
    return materialize(
        [recipes_and_progress_labels, *LABEL_CHECKS],
        selection=["recipe_library", "progress_labels"],
        resources={"warehouse": WarehouseResource(home=str(home))},
        run_config={"ops": {"recipes_and_progress_labels": {"config": {"embedder": "hashing"} | config}}},
        tags=all_label_families_tags(),
        instance=instance or DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def test_families_brought_up_to_date_as_ray_tasks_give_the_local_rows(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    publish_tiny_episodes(here, "first", "", seed=7, n_login=12, n_button=8)
    assert _labels(here).success  # every family labelled once: each has its recipe library now
    publish_tiny_episodes(here, "second", "new-", seed=8, n_login=4, n_button=2)  # new in two families
    shutil.copytree(here, there)

    local = _labels(here)
    instance = DagsterInstance.ephemeral()
    with LocalRayCluster(cpus=(2,)) as cluster:
        try:
            on_ray = _labels(there, instance, ray_address=cluster.address)
        finally:
            ray.shutdown()
    assert local.success and on_ray.success
    failed = [e.check_name for e in on_ray.get_asset_check_evaluations() if not e.passed]
    assert failed == []
    said = [entry.user_message for entry in instance.all_logs(on_ray.run_id)]
    fanned = [m for m in said if m.startswith("bringing 7 label families up to date at once:")]
    assert len(fanned) == 1 and "miniwob-forms" in fanned[0] and "other" in fanned[0]  # each a Ray task
    rows = [Warehouse(h).query(f"SELECT {ROW} FROM progress_labels ORDER BY ALL").to_pylist() for h in (here, there)]
    assert rows[0] == rows[1] and any(r["episode_id"].startswith("new-") for r in rows[1])
    families = (
        Warehouse(there)
        .query(
            "SELECT DISTINCT partition_key FROM lineage_materializations WHERE asset = 'progress_labels' "
            "AND partition_key IN ('miniwob-forms', 'other')"
        )
        .to_pylist()
    )
    assert {r["partition_key"] for r in families} == {"miniwob-forms", "other"}  # one materialization per family


def test_a_cluster_that_is_not_there_fails_the_run_naming_the_address(tmp_path):
    home = tmp_path / "home"
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    assert _labels(home).success
    publish_tiny_episodes(home, "second", "new-", seed=8, n_login=4, n_button=2)
    before = Warehouse(home).current_versions("progress_labels")
    result = _labels(home, ray_address="127.0.0.2:1")
    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error.message
    assert "no Ray cluster at 127.0.0.2:1" in failure
    assert Warehouse(home).current_versions("progress_labels") == before  # nothing published
