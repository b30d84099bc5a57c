"""The rollout assets as users run them: in-process, from the Dagster CLI, from the webserver's
launchpad (its GraphQL API), with checks, lineage and partition replacement."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dagster import DagsterInstance, MultiPartitionKey, materialize

from assets.resources import EnvPoolResource, WarehouseResource
from assets.rollouts import (
    ANDROID_PARTITIONS,
    BATCH_KEYS,
    MINIWOB_PARTITIONS,
    ROLLOUT_ASSETS,
    ROLLOUT_CHECKS,
    ROLLOUT_JOBS,
    android_rollouts,
    rollouts,
)
from envs.task_catalog import MINIWOB_FAMILIES
from warehouse.catalog import Warehouse

REPO_ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).with_name("dagster")
WEBSERVER = Path(sys.executable).with_name("dagster-webserver")


def test_definitions_and_partitions():
    from tests.assets.rollout_defs import defs

    repo = defs.get_repository_def()
    groups = {n.key.to_user_string(): n.group_name for n in repo.asset_graph.asset_nodes}
    assert groups == {"rollouts": "rollouts", "android_rollouts": "rollouts"}
    checks = {k.name for k in repo.asset_graph.asset_check_keys}
    assert {
        "rollouts_whole_episodes",
        "rollouts_attempts_accounted",
        "rollouts_rewards_and_milestones",
        "rollouts_success_and_failure",
        "rollouts_attempts_schema",
    } <= checks
    keys = MINIWOB_PARTITIONS.get_partition_keys()
    assert len(keys) == len(BATCH_KEYS) * len(MINIWOB_FAMILIES) and "b00|miniwob-forms" in keys
    assert "android-tools" in ANDROID_PARTITIONS.get_partitions_def_for_dimension("family").get_partition_keys()
    assert {j.name for j in ROLLOUT_JOBS} == {"miniwob_rollouts_job", "android_rollouts_job"}
    assert len(ROLLOUT_ASSETS) == 2 and len(ROLLOUT_CHECKS) == 4  # the run checks and the key checks, per asset


# Three forms tasks, a noisy expert: a batch with successes and failures (the Ray backend's test runs it too).
NOISY_FORMS_BATCH = {
    "ops": {
        "rollouts": {
            "config": {
                "tasks": ["login-user-popup", "enter-date", "use-spinner"],
                "episodes_per_task": 3,
                "noise": 0.35,
            }
        }
    }
}


def _checks_for(asset_name):
    return [c for c in ROLLOUT_CHECKS if any(k.asset_key.path[-1] == asset_name for k in c.check_keys)]


@pytest.mark.e2e
def test_materialize_a_partition_with_checks_lineage_and_replacement(tmp_path):
    warehouse = WarehouseResource(home=str(tmp_path / "home"))
    partition = MultiPartitionKey({"family": "miniwob-forms", "batch": "b01"})
    run_config = NOISY_FORMS_BATCH

    def run():
        return materialize(
            [rollouts, *_checks_for("rollouts")],
            resources={"warehouse": warehouse, "env_pool": EnvPoolResource()},
            partition_key=partition,
            run_config=run_config,
            instance=DagsterInstance.ephemeral(),
        )

    result = run()
    assert result.success
    evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations == dict.fromkeys(evaluations, True) and len(evaluations) == 8, evaluations
    assert {"episodes_key_unique", "steps_key_unique", "rollout_attempts_key_unique"} <= set(evaluations)
    metadata = result.asset_materializations_for_node("rollouts")[0].metadata
    assert metadata["episodes"].value == 9 and metadata["milestone_hits"].value > 0
    store = Warehouse(tmp_path / "home")
    rows = store.query(
        "SELECT count(*) AS n, count(*) FILTER (WHERE success) AS ok, count(*) FILTER (WHERE NOT success) AS failed, "
        "count(DISTINCT task_id) AS tasks, any_value(source) AS source, any_value(env_backend) AS backend FROM episodes"
    ).to_pylist()[0]
    assert rows == {
        "n": 9,
        "ok": rows["ok"],
        "failed": rows["failed"],
        "tasks": 3,
        "source": "rollout",
        "backend": "miniwob",
    }
    assert rows["ok"] > 0 and rows["failed"] > 0, "a noisy expert yields both successes and failures"
    hits = store.query("SELECT count(*) AS n FROM steps, unnest(milestones_hit) AS t(m)").to_pylist()[0]["n"]
    assert hits > 0
    lineage = store.query(
        "SELECT input_kind, input_path, input_version, partition_key, run_id FROM lineage"
    ).to_pylist()
    assert {Path(r["input_path"]).name for r in lineage} == {
        "login-user-popup.yaml",
        "enter-date.yaml",
        "use-spinner.yaml",
    }
    assert all(r["input_kind"] == "file" and len(r["input_version"]) == 64 for r in lineage)
    assert lineage[0]["partition_key"] == "b01|miniwob-forms" and lineage[0]["run_id"] == result.run_id

    again = run()  # the same partition again: the same seeds, ids and outcomes; replaced, not added
    assert again.success
    after = store.query(
        "SELECT count(*) AS n, count(DISTINCT episode_id) AS d, count(DISTINCT run_id) AS runs FROM episodes"
    ).to_pylist()[0]
    assert after == {"n": 9, "d": 9, "runs": 1}
    assert all(e.passed for e in again.get_asset_check_evaluations() if e.check_name.endswith("_key_unique"))


def test_android_rollouts_without_devices_fail_with_a_clear_message(tmp_path):
    result = materialize(
        [android_rollouts],
        resources={"warehouse": WarehouseResource(home=str(tmp_path)), "env_pool": EnvPoolResource()},
        partition_key=MultiPartitionKey({"family": "android-tools", "batch": "b00"}),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "no Android devices configured" in str(failure.event_specific_data.error)


def _environment(tmp_path):
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    # Runs launched from the UI go straight to a run process (no daemon in a test).
    (dagster_home / "dagster.yaml").write_text(
        "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: DefaultRunCoordinator\n"
        "telemetry:\n  enabled: false\n"
    )
    return {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        "STEPWISE_HOME": str(tmp_path / "home"),
        "HF_HUB_OFFLINE": "1",
    }


@pytest.mark.e2e
def test_materialize_from_the_dagster_cli(tmp_path):
    config = {"ops": {"rollouts": {"config": {"tasks": ["click-collapsible"], "episodes_per_task": 2, "workers": 1}}}}
    completed = subprocess.run(
        [
            str(DAGSTER),
            "asset",
            "materialize",
            "-m",
            "tests.assets.rollout_defs",
            "--select",
            "rollouts",
            "--partition",
            "b02|miniwob-navigation",
            "--config-json",
            json.dumps(config),
        ],
        cwd=REPO_ROOT,
        env=_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "rollouts miniwob-navigation|b02 [##########] 2/2 episodes" in completed.stderr  # the progress bar
    rows = Warehouse(tmp_path / "home").query("SELECT task_id, seed FROM episodes ORDER BY seed").to_pylist()
    assert rows == [{"task_id": "click-collapsible", "seed": 20000}, {"task_id": "click-collapsible", "seed": 20001}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
STATUS = "query Status($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"


@pytest.mark.e2e
def test_materialize_from_the_ui_launchpad(tmp_path):
    """What the launchpad sends: launchRun for the asset job with a partition and run config."""
    port = _free_port()
    server = subprocess.Popen(
        [str(WEBSERVER), "-m", "tests.assets.rollout_defs", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO_ROOT,
        env=_environment(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the webserver did not come up"
                time.sleep(0.5)
        location = _graphql(port, "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }")
        location_name = location["data"]["workspaceOrError"]["locationEntries"][0]["name"]
        params = {
            "selector": {
                "repositoryLocationName": location_name,
                "repositoryName": "__repository__",
                "jobName": "miniwob_rollouts_job",
                "assetSelection": [{"path": ["rollouts"]}],
            },
            "runConfigData": {
                "ops": {
                    "rollouts": {
                        "config": {
                            "tasks": ["click-button-sequence"],
                            "episodes_per_task": 2,
                            "workers": 1,
                            "exploration_policy": "random_walk",
                        }
                    }
                }
            },
            "executionMetadata": {
                "tags": [
                    {"key": "dagster/partition", "value": "b03|miniwob-choice"},
                    {"key": "dagster/partition/batch", "value": "b03"},
                    {"key": "dagster/partition/family", "value": "miniwob-choice"},
                ]
            },
            "mode": "default",
        }
        launched = _graphql(port, LAUNCH, {"params": params})["data"]["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]
        deadline = time.monotonic() + 200
        status = None
        while time.monotonic() < deadline:
            status = _graphql(port, STATUS, {"id": run_id})["data"]["runOrError"]["status"]
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            time.sleep(1)
        assert status == "SUCCESS"
        rows = Warehouse(tmp_path / "home").query("SELECT policy_id, seed FROM episodes ORDER BY seed").to_pylist()
        assert rows == [{"policy_id": "random_walk", "seed": 30000}, {"policy_id": "random_walk", "seed": 30001}]
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
