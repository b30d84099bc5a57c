"""Recipes and progress labels as Dagster partitions per label family: one run over every family
relabels everything, a run of one family labels only its new episodes, the sensor asks for runs of
exactly the families with new episodes, and two processes labelling two families at once both land."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
    build_sensor_context,
    materialize,
)

from annotation.progress.label_io import default_specs_dir
from annotation.progress.label_partitions import families_with_changed_specs, families_with_new_episodes, label_backlog
from assets.labels import (
    LABEL_ASSETS,
    LABEL_CHECKS,
    LABEL_FAMILIES,
    all_label_families_tags,
    new_episodes_to_label,
    recipes_and_progress_labels,
)
from assets.resources import WarehouseResource
from envs.tasks import load_task_specs
from tests.annotation.helpers import publish_tiny_episodes
from warehouse.catalog import Warehouse

REPO = Path(__file__).resolve().parents[2]
LABEL_CONFIG = {"embedder": "hashing"}


def _labels(home: Path, *, partition_key: str | None = None, mode: str = "incremental"):
    return materialize(
        [recipes_and_progress_labels, *LABEL_CHECKS],
        selection=["recipe_library", "progress_labels"],
        resources={"warehouse": WarehouseResource(home=str(home))},
        run_config={"ops": {"recipes_and_progress_labels": {"config": LABEL_CONFIG | {"mode": mode}}}},
        partition_key=partition_key,
        tags=None if partition_key else all_label_families_tags(),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def _family_versions(warehouse: Warehouse) -> dict[str, str]:
    return {dataset: mid for dataset, mid, _ in warehouse.current_versions("progress_labels")}


def _sensor(home: Path, instance: DagsterInstance | None = None):
    context = build_sensor_context(
        instance=instance or DagsterInstance.ephemeral(), resources={"warehouse": WarehouseResource(home=str(home))}
    )
    return new_episodes_to_label(context)


def test_a_family_partition_labels_only_its_new_episodes(tmp_path):
    home = tmp_path / "home"
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    warehouse = Warehouse(home)
    assert families_with_new_episodes(warehouse) == {"miniwob-forms": 12, "other": 8}

    # Every family in one run: the full streamed pass, all checks (keys of the ledger and library state too).
    full = _labels(home)
    assert full.success
    checks = {e.check_name: e.passed for e in full.get_asset_check_evaluations()}
    assert {"label_ledger_key_unique", "recipe_library_state_key_unique", "labels_non_decreasing"} <= set(checks)
    assert all(checks.values()), checks
    assert isinstance(_sensor(home), SkipReason)  # nothing new to label
    assert warehouse.query("SELECT count(*) AS n FROM label_ledger").to_pylist()[0]["n"] == 20
    states = warehouse.query("SELECT DISTINCT task_id, method, version FROM recipe_library_state").to_pylist()
    assert {("login-user", "improved", 1), ("login-user", "paper", 1)} <= {tuple(r.values()) for r in states}
    before = _family_versions(warehouse)

    # New episodes in both families: the sensor asks for one run per family, keyed by the episodes' version.
    publish_tiny_episodes(home, "second", "new-", seed=8, n_login=4, n_button=2)
    requests = _sensor(home).run_requests
    assert all(isinstance(r, RunRequest) for r in requests)
    assert sorted(r.partition_key for r in requests) == ["miniwob-forms", "other"]
    assert len({r.run_key for r in requests}) == 2 and [r.run_key for r in _sensor(home).run_requests] == [
        r.run_key for r in requests
    ]
    # A family whose run is in flight waits (a second run would only be refused when it publishes).
    busy = DagsterInstance.ephemeral()
    busy.add_run(
        DagsterRun(
            job_name="label_families", status=DagsterRunStatus.STARTED, tags={"dagster/partition": "miniwob-forms"}
        )
    )
    assert [r.partition_key for r in _sensor(home, busy).run_requests] == ["other"]

    # One partition: only that family is touched, its new episodes labelled against the stored library.
    forms = _labels(home, partition_key="miniwob-forms")
    assert forms.success
    after = _family_versions(warehouse)
    assert after["labels/other"] == before["labels/other"]
    assert after["labels/miniwob-forms"] != before["labels/miniwob-forms"]
    lineage = warehouse.query(
        "SELECT partition_key, parameters FROM lineage_materializations WHERE asset = 'progress_labels' "
        "ORDER BY created_at DESC LIMIT 1"
    ).to_pylist()[0]
    assert lineage["partition_key"] == "miniwob-forms"
    parameters = json.loads(lineage["parameters"])
    # Two new login successes on a library built from six reach the rebuild rule (max(2, 10%)): the
    # task is relabelled with version 2 and the family compacted into a new base.
    assert parameters["mode"] == "incremental" and parameters["new_episodes"] == 4
    assert parameters["rebuilt_tasks"] == {"login-user": 2} and parameters["compacted"]
    assert families_with_new_episodes(warehouse) == {"other": 2}
    labelled = warehouse.query(
        "SELECT count(DISTINCT episode_id) AS n FROM progress_labels WHERE starts_with(episode_id, 'new-')"
    ).to_pylist()[0]["n"]
    assert labelled == 4  # the four new login episodes, not the two click-button ones
    assert [r.partition_key for r in _sensor(home).run_requests] == ["other"]
    checks = {e.check_name: e.passed for e in forms.get_asset_check_evaluations()}
    assert checks and all(checks.values()), checks


def test_the_sensor_asks_for_the_family_whose_spec_changed_and_the_run_settles_it(tmp_path, monkeypatch):
    """A spec edited after its task's episodes were labelled: the sensor asks for that family's run
    (and no other), keyed by the specs' version; the incremental run relabels the task and the
    sensor is quiet again."""
    specs_dir = tmp_path / "specs"
    shutil.copytree(default_specs_dir(), specs_dir)
    monkeypatch.setenv("STEPWISE_TASK_SPECS", str(specs_dir))
    home = tmp_path / "home"
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    assert _labels(home).success
    assert isinstance(_sensor(home), SkipReason)

    login = specs_dir / "miniwob" / "login-user.yaml"
    mapping = yaml.safe_load(login.read_text())
    mapping["milestones"] = mapping["milestones"][:2]
    login.write_text(yaml.safe_dump(mapping))
    warehouse = Warehouse(home)
    assert families_with_changed_specs(warehouse, load_task_specs(specs_dir)) == {"miniwob-forms": 12}
    (request,) = _sensor(home).run_requests
    assert request.partition_key == "miniwob-forms"
    assert request.tags["stepwise/spec_changed_episodes"] == "12" and request.tags["stepwise/new_episodes"] == "0"
    assert _labels(home, partition_key="miniwob-forms").success
    parameters = json.loads(
        warehouse.query(
            "SELECT parameters FROM lineage_materializations WHERE asset = 'progress_labels' "
            "ORDER BY created_at DESC LIMIT 1"
        ).to_pylist()[0]["parameters"]
    )
    assert parameters["spec_changed_tasks"] == ["login-user"]
    assert isinstance(_sensor(home), SkipReason)

    # a spec that does not load: the sensor still asks for the new episodes' runs, and says why it
    # looks for no spec change
    (specs_dir / "miniwob" / "broken.yaml").write_text("task_id: [")
    publish_tiny_episodes(home, "second", "new-", seed=8, n_login=4, n_button=2)
    assert sorted(r.partition_key for r in _sensor(home).run_requests) == ["miniwob-forms", "other"]
    backlog = label_backlog(warehouse, specs_dir)
    assert backlog.spec_changed == {} and "broken.yaml" in (backlog.spec_error or "")
    assert "specs unreadable" in backlog.describe()


def test_unknown_mode_and_family_are_refused(tmp_path):
    from annotation.progress.label_partitions import run_label_partitions

    warehouse = Warehouse(tmp_path / "home")
    with pytest.raises(ValueError, match="unknown label families"):
        run_label_partitions(warehouse, ["miniwob-nope"], embedder="hashing")
    with pytest.raises(ValueError, match="full | incremental"):
        run_label_partitions(warehouse, ["other"], mode="sometimes", embedder="hashing")


def test_the_label_assets_declare_family_partitions():
    partitioned = {
        key.to_user_string()
        for assets_def in LABEL_ASSETS
        for key in assets_def.keys
        if assets_def.partitions_def == LABEL_FAMILIES
    }
    assert partitioned == {"recipe_library", "progress_labels"}
    assert LABEL_FAMILIES.get_partition_keys()[-1] == "other"


@pytest.mark.e2e
def test_two_families_label_in_parallel_processes(tmp_path):
    """Two `dagster asset materialize` processes, one partition each, at the same time on one home:
    both runs succeed and each family's labels are what a run of it alone gives."""
    home = tmp_path / "home"
    publish_tiny_episodes(home, "first", "", seed=7, n_login=12, n_button=8)
    env = os.environ | {"STEPWISE_HOME": str(home), "DAGSTER_HOME": str(tmp_path / "dagster"), "HF_HUB_OFFLINE": "1"}
    (tmp_path / "dagster").mkdir()
    # The Dagster instance exists before its runs start, as in any deployment (two processes that
    # both create a new instance's SQLite storage race on its schema migration).
    DagsterInstance.from_config(str(tmp_path / "dagster")).dispose()
    config = json.dumps({"ops": {"recipes_and_progress_labels": {"config": LABEL_CONFIG}}})
    dagster = Path(sys.executable).with_name("dagster")
    procs = {
        family: subprocess.Popen(
            [
                dagster,
                "asset",
                "materialize",
                "-m",
                "pipelines.definitions",
                "--select",
                "recipe_library,progress_labels",
            ]
            + ["--partition", family, "--config-json", config],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for family in ("miniwob-forms", "other")
    }
    outputs = {family: proc.communicate(timeout=600)[0] for family, proc in procs.items()}
    for family, proc in procs.items():
        assert proc.returncode == 0, outputs[family][-3000:]
    warehouse = Warehouse(home)
    runs = warehouse.query(
        "SELECT partition_key, run_id FROM lineage_materializations WHERE asset = 'progress_labels'"
    ).to_pylist()
    assert sorted(r["partition_key"] for r in runs) == ["miniwob-forms", "other"]
    assert len({r["run_id"] for r in runs}) == 2
    assert families_with_new_episodes(warehouse) == {}
    by_family = warehouse.query(
        "SELECT e.task_id, count(DISTINCT l.episode_id) AS n FROM progress_labels l JOIN episodes e USING (episode_id) "
        "GROUP BY 1 ORDER BY 1"
    ).to_pylist()
    assert by_family == [{"task_id": "click-button", "n": 8}, {"task_id": "login-user", "n": 12}]
