"""After the whole flow on one STEPWISE_HOME, no token or password appears outside Label Studio's own data folder.

Selection, push, annotations, the sensor, the sync asset, the downstream assets and their checks
all run against one home (warehouse, plots and a file-backed Dagster instance under it); then
every file under the home except ``labelstudio/`` is searched, Parquet and DuckDB decoded first.
"""

from __future__ import annotations

import re

import httpx
import pytest
from dagster import DagsterInstance, materialize

from annotation.labelstudio.audit import file_text, files_containing
from annotation.labelstudio.interfaces import correctness_prediction
from annotation.labelstudio.secrets import read_local_secrets
from assets.human_labels import HUMAN_LABEL_ASSETS, HUMAN_LABEL_CHECKS, build_label_studio_sensor
from assets.resources import WarehouseResource
from tests.annotation.labelstudio.conftest import build_small_warehouse
from tests.annotation.labelstudio.helpers import push, queued_tasks, tick

pytestmark = pytest.mark.e2e
JWT_SHAPE = re.compile(rb"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")


def test_no_token_anywhere_in_stepwise_home_outside_labelstudio(ls_server, ls_home, ls_resource):
    warehouse = build_small_warehouse(ls_home)  # the same home as the server: as on embedded defaults
    (ls_home / "dagster").mkdir(exist_ok=True)
    with DagsterInstance.local_temp(tempdir=str(ls_home / "dagster")) as instance:
        push(warehouse, ls_resource, budget=4, instance=instance)
        client = ls_resource.client()
        for task in queued_tasks(warehouse, "step_correctness"):
            client.create_annotation(task["ls_task_id"], correctness_prediction("positive"))
        access_token = client.sdk._client_wrapper._tokens_client.api_key  # the short-lived token the SDK really sent
        client.close()
        assert tick(
            build_label_studio_sensor(name="secrets_test_sensor"), warehouse, ls_resource, instance
        ).asset_events
        result = materialize(
            [*HUMAN_LABEL_ASSETS, *HUMAN_LABEL_CHECKS],
            instance=instance,
            resources={"warehouse": WarehouseResource(home=str(ls_home)), "label_studio": ls_resource},
            selection=["human_labels", "human_step_labels", "annotation_agreement", "label_source_comparison"],
        )
        assert result.success
        assert all(c.passed for c in result.get_asset_check_evaluations())
    local = read_local_secrets(ls_server.data_dir)
    secrets = [local.api_key, local.password, access_token]
    assert files_containing(ls_home, secrets, exclude=[ls_server.data_dir]) == []
    assert "stepwise-credentials.json" in files_containing(
        ls_server.data_dir, [local.api_key]
    )  # kept there (and in its database)
    jwt_like = [
        str(p.relative_to(ls_home))
        for p in ls_home.rglob("*")
        if p.is_file()
        and not p.resolve().is_relative_to(ls_server.data_dir.resolve())
        and JWT_SHAPE.search(file_text(p))
    ]
    assert jwt_like == []
    assert httpx.get(f"{ls_server.url}/health").status_code == 200
