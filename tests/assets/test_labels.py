"""The labels stage as users run it: Dagster assets with their checks, and the stepwise commands."""

import subprocess
import sys
from pathlib import Path

from dagster import DagsterInstance, materialize

from assets.demonstrations import DEMONSTRATION_ASSETS, DEMONSTRATION_CHECKS
from assets.labels import LABEL_ASSETS, LABEL_CHECKS, all_label_families_tags
from assets.resources import WarehouseResource
from warehouse.catalog import Warehouse

STEPWISE = Path(sys.executable).with_name("stepwise")


def test_label_assets_materialize_with_checks(small_demos, home):
    result = materialize(
        [*DEMONSTRATION_ASSETS, *DEMONSTRATION_CHECKS, *LABEL_ASSETS, *LABEL_CHECKS],
        resources={"warehouse": WarehouseResource(home=str(home))},
        run_config={
            "ops": {
                "human_demonstrations": {"config": {"demos_dir": str(small_demos), "workers": 1}},
                "recipes_and_progress_labels": {"config": {"embedder": "hashing"}},
            }
        },
        tags=all_label_families_tags(),
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    for name in ("labels_in_unit_interval", "labels_non_decreasing", "every_episode_labelled_or_explained"):
        assert checks[name], name
    warehouse = Warehouse(home)
    sources = {
        (r["source"], r["method"])
        for r in warehouse.query("SELECT DISTINCT source, method FROM progress_labels").to_pylist()
    }
    assert {("lcs", "paper"), ("lcs", "improved"), ("env", None)} <= sources
    synthetic = warehouse.query(
        "SELECT source, count(*) n, count(parent_episode_id) p FROM episodes WHERE source LIKE 'synthetic:%' GROUP BY 1"
    ).to_pylist()
    assert synthetic and all(r["n"] == r["p"] for r in synthetic)  # every synthetic episode names its parent
    recipes = warehouse.query("SELECT task_id, method, length, n_members, member_episode_ids FROM recipes").to_pylist()
    assert any(r["task_id"] == "login-user" and r["method"] == "improved" for r in recipes)
    assert all(len(r["member_episode_ids"]) == r["n_members"] >= 2 for r in recipes)
    split = warehouse.query("SELECT split, count(*) n FROM progress_split GROUP BY 1").to_pylist()
    assert sum(r["n"] for r in split) == warehouse.query("SELECT count(*) n FROM episodes").to_pylist()[0]["n"]
    quality = warehouse.query(
        "SELECT method, task_set, key_step_progress_error FROM label_quality WHERE task_set = 'login-user'"
    ).to_pylist()
    assert {r["method"] for r in quality} == {"improved"} or {r["method"] for r in quality} == {"improved", "paper"}
    # Lineage: the labels name the spec files they were scored with, and the ingest they read.
    inputs = warehouse.query(
        "SELECT input_kind, input_asset, input_path FROM lineage WHERE asset = 'progress_labels'"
    ).to_pylist()
    assert any(i["input_kind"] == "file" and i["input_path"].endswith("login-user.yaml") for i in inputs)
    assert {"human_demonstrations", "synthetic_trajectories"} <= {i["input_asset"] for i in inputs}


def test_label_report_with_users_own_specs(small_demos, home, tmp_path):
    env = {"STEPWISE_HOME": str(home), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    assert (
        subprocess.run(
            [STEPWISE, "import-demos", str(small_demos)], env=env, capture_output=True, timeout=300
        ).returncode
        == 0
    )
    out = subprocess.run(
        [STEPWISE, "label", "--embedder", "hashing"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    specs = tmp_path / "my-specs"
    specs.mkdir()
    (specs / "enter-query.yaml").write_text(
        "task_id: search-engine\n"
        'instruction: \'enter "(?P<q>[^"]*)"\'\n'
        "milestones:\n"
        "  - {name: typed, when: {field_value: {element: {element_id: search-text}, equals: '{q}'}}}\n"
    )
    out = subprocess.run(
        [STEPWISE, "label-report", "--tasks", str(specs), "--no-save"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "search-engine" in out.stdout and "improved" in out.stdout
    (specs / "broken.yaml").write_text("task_id: x\nmilestones: []\n")
    out = subprocess.run(
        [STEPWISE, "label-report", "--tasks", str(specs)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 2 and "broken.yaml" in out.stderr and "milestones" in out.stderr
