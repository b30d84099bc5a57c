"""The Dagster code location and the `stepwise` command, as users run them."""

import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from assets.ingest import INGEST_CHECKS, human_demonstrations
from assets.resources import WarehouseResource
from pipelines.definitions import defs
from warehouse.catalog import Warehouse

REPO_ROOT = Path(__file__).resolve().parents[1]
STEPWISE = Path(sys.executable).with_name("stepwise")


def test_definitions_load_and_group_assets_by_stage():
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    groups = {node.key.to_user_string(): node.group_name for node in graph.asset_nodes}
    assert groups["human_demonstrations"] == "ingest"
    for name in (
        "synthetic_trajectories",
        "recipe_library",
        "progress_labels",
        "progress_split",
        "label_quality_report",
    ):
        assert groups[name] == "labels"
    checks = {c.name for c in repo.asset_graph.asset_check_keys}
    assert {
        "demonstrations_schema",
        "demonstrations_no_empty_episodes",
        "demonstrations_action_types_known",
        "demonstrations_success_and_failure",
    } <= checks
    assert defs.resolve_job_def("stepwise_main") is not None


def test_materialize_ingest_with_checks(small_demos, home):
    result = materialize(
        [human_demonstrations, *INGEST_CHECKS],
        resources={"warehouse": WarehouseResource(home=str(home))},
        run_config={"ops": {"human_demonstrations": {"config": {"demos_dir": str(small_demos), "workers": 1}}}},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations == dict.fromkeys(evaluations, True) and len(evaluations) == 4
    metadata = result.asset_materializations_for_node("human_demonstrations")[0].metadata
    assert metadata["files"].value == 23 and metadata["episodes"].value > 0
    lineage = Warehouse(home).query("SELECT run_id FROM lineage_materializations").to_pylist()
    assert lineage == [{"run_id": result.run_id}]


def test_checks_fail_on_bad_data(home):
    """The checks are not rubber stamps: an episode without steps is caught."""
    import pyarrow as pa

    from warehouse.catalog import Materialization
    from warehouse.schema import EPISODES, STEPS

    warehouse = Warehouse(home)
    m = Materialization(asset="test")
    row = {name: None for name in EPISODES.names} | {
        "episode_id": "e1",
        "task_id": "t",
        "source": "human_demo",
        "success": True,
        "n_steps": 0,
    }
    outputs = [
        warehouse.stage_table("episodes", "x", pa.Table.from_pylist([row], schema=EPISODES), m),
        warehouse.stage_table("steps", "x", STEPS.empty_table(), m),
    ]
    warehouse.publish(m, outputs)
    from assets.ingest import demonstrations_no_empty_episodes, demonstrations_success_and_failure

    resource = WarehouseResource(home=str(home))
    assert not demonstrations_no_empty_episodes(warehouse=resource).passed
    assert not demonstrations_success_and_failure(warehouse=resource).passed


def test_cli_import_demos_and_sql(small_demos, home):
    env = {"STEPWISE_HOME": str(home), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [STEPWISE, "import-demos", str(small_demos)], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "23 files" in out.stdout and "quarantined" in out.stdout
    out = subprocess.run(
        [STEPWISE, "sql", "SELECT action_type, count(*) AS n FROM steps GROUP BY 1 ORDER BY 1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "CLICK" in out.stdout and "INPUT" in out.stdout
    bad = subprocess.run(
        [STEPWISE, "sql", "SELECT nope FROM steps"], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == 2 and "nope" in bad.stderr
    missing = subprocess.run(
        [STEPWISE, "import-demos", str(home / "nowhere")], capture_output=True, text=True, env=env, timeout=120
    )
    assert missing.returncode == 2 and "not a folder" in missing.stderr


@pytest.mark.e2e
def test_full_import_of_the_shared_demonstrations(demos_dir, home):
    """All 10,466 files are accounted for; failures are kept; under 2% of steps are untyped."""
    warehouse = Warehouse(home)
    from envs.miniwob.demo_import import import_demonstrations

    report = import_demonstrations(demos_dir, warehouse, workers=2)
    files = warehouse.query("SELECT status, count(*) n FROM source_files GROUP BY 1").to_pylist()
    assert sum(r["n"] for r in files) == 10_466 == report.files
    assert report.imported + report.duplicates + report.quarantined == 10_466
    assert report.episodes > 8_000 and report.tasks == 51
    assert report.successes > 0 and report.failures > 1_000
    assert report.untyped_share < 0.02
    # Every quarantined file says why.
    unexplained = warehouse.query(
        "SELECT count(*) n FROM source_files f WHERE status = 'quarantined' AND NOT EXISTS "
        "(SELECT 1 FROM quarantine q WHERE q.source_file = f.source_file AND q.severity = 'file')"
    ).to_pylist()[0]["n"]
    assert unexplained == 0
