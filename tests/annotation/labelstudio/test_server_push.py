"""The project's own Label Studio server, and pushing tasks from the pipeline into it (real server, no mocks)."""

from __future__ import annotations

import stat

import httpx
import pytest
from dagster import DagsterInstance

from annotation.labelstudio.interfaces import INTERFACES
from annotation.labelstudio.push import ProjectHandle, ensure_project
from annotation.labelstudio.server import LOG_FILE
from tests.annotation.labelstudio.helpers import push, queued_tasks

pytestmark = pytest.mark.e2e


def _listen_addresses(port: int) -> set[str]:
    """Local addresses listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
                found.add(address)
    return found


def test_server_runs_locally_with_an_admin_token(ls_server, ls_credentials, ls_home):
    status = ls_server.status()
    assert status.running and status.url == ls_credentials.url
    assert _listen_addresses(status.port) == {"0100007F"}, "bound to 127.0.0.1 only"
    data = ls_home / "labelstudio"
    assert (data / "label_studio.sqlite3").is_file() and (data / LOG_FILE).is_file()
    secrets_file = data / "stepwise-credentials.json"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    # one signing key, so tokens survive a restart (Label Studio's first start can append two)
    env_file = data / ".env"
    assert [line.split("=")[0] for line in env_file.read_text().split()] == ["SECRET_KEY"]
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    from annotation.labelstudio.client import LabelStudioClient

    assert LabelStudioClient(ls_credentials).whoami()["email"] == "admin@stepwise.local"
    assert ls_credentials.api_key not in (data / LOG_FILE).read_text()
    assert ls_server.start() == status.url and ls_server.status().pid == status.pid  # idempotent
    assert httpx.get(f"{status.url}/user/login/").status_code == 200  # where an annotator logs in


def test_push_from_the_pipeline_is_idempotent_with_pre_annotations(small_warehouse, ls_resource):
    instance = DagsterInstance.ephemeral()
    summary = push(small_warehouse, ls_resource, budget=12, instance=instance)
    assert summary["step_correctness"]["pushed"] == 12 and summary["step_progress"]["pushed"] == 12
    client = ls_resource.client()
    queued = queued_tasks(small_warehouse, "step_correctness")
    project_id = queued[0]["ls_project_id"]
    in_label_studio = list(client.iter_tasks(project_id))
    assert sorted(t["id"] for t in in_label_studio) == [q["ls_task_id"] for q in queued]
    assert {t["data"]["item_key"] for t in in_label_studio} == {q["item_key"] for q in queued}
    task = client._raw("GET", f"api/tasks/{queued[0]['ls_task_id']}/", what="read task")
    assert "screen_html" in task["data"] and 'class="d2 t"' in task["data"]["screen_html"]  # the target highlighted
    predictions = client._raw("GET", "api/predictions/", params={"task": queued[0]["ls_task_id"]}, what="predictions")
    assert predictions and predictions[0]["model_version"] == "rm-test-1"  # the current model as pre-annotation
    assert queued[0]["prediction_model"] == "rm-test-1" and queued[0]["prediction_label"] in ("positive", "negative")

    # the same selection pushed again: nothing new
    again = push(small_warehouse, ls_resource, instance=instance, selection=False)
    assert again["step_correctness"]["pushed"] == 0 and again["step_correctness"]["already_queued"] == 12
    assert client.project(project_id)["task_number"] == 12

    # a push that died after Label Studio imported but before the queue was written:
    # its tasks are adopted, not re-imported
    push_selection_only(small_warehouse, ls_resource, instance)
    candidate = small_warehouse.query("SELECT episode_id, step_idx FROM annotation_candidates LIMIT 1").to_pylist()[0]
    orphan_key = f"step:{candidate['episode_id']}:{candidate['step_idx']}"
    client.import_tasks(
        project_id,
        [
            {
                "data": {
                    "item_key": orphan_key,
                    "instruction": "x",
                    "history_html": "",
                    "action_html": "",
                    "screen_html": "",
                    "interface_version": "step_correctness@1",
                }
            }
        ],
    )
    resumed = push(small_warehouse, ls_resource, instance=instance, selection=False)
    assert resumed["step_correctness"]["adopted"] == 1 and resumed["step_correctness"]["pushed"] == 11
    queued = queued_tasks(small_warehouse, "step_correctness")
    assert len(queued) == 24 == client.project(project_id)["task_number"]
    assert len({q["item_key"] for q in queued}) == 24  # never queued twice
    client.close()


def push_selection_only(warehouse, label_studio, instance):
    from dagster import materialize

    from assets.human_labels import annotation_candidates
    from assets.resources import WarehouseResource

    result = materialize(
        [annotation_candidates],
        resources={"warehouse": WarehouseResource(home=str(warehouse.home)), "label_studio": label_studio},
        run_config={"ops": {"annotation_candidates": {"config": {"budget": 12}}}},
        instance=instance,
    )
    assert result.success


def test_milestone_interfaces_are_pushed(small_warehouse, ls_resource, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "login-user.yaml").write_text(
        "task_id: login-user\nbackend: miniwob\n"
        "milestones:\n  - name: username typed\n    when: {typed: {element: {element_id: username}, equals: x}}\n"
        "  - name: login clicked\n    when: {clicked: {element_id: subbtn}}\n"
    )
    from dagster import materialize

    from assets.human_labels import annotation_queue
    from assets.resources import WarehouseResource

    result = materialize(
        [annotation_queue],
        resources={"warehouse": WarehouseResource(home=str(small_warehouse.home)), "label_studio": ls_resource},
        run_config={
            "ops": {
                "annotation_queue": {
                    "config": {
                        "interfaces": ["milestone_review", "milestone_match"],
                        "match_embedder": "hashing",
                        "match_budget": 6,
                        "task_specs_dir": str(specs),
                    }
                }
            }
        },
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    summary = result.asset_materializations_for_node("annotation_queue")[0].metadata["by_interface"].value
    assert summary["milestone_review"]["pushed"] == 1 and summary["milestone_match"]["pushed"] == 6
    review = queued_tasks(small_warehouse, "milestone_review")[0]
    assert review["item_key"] == "milestones:login-user:spec"
    pairs = queued_tasks(small_warehouse, "milestone_match")
    assert {p["prediction_label"] for p in pairs} <= {"yes", "no"} and all(
        p["prediction_model"].startswith("matcher:") for p in pairs
    )


def test_config_changes_keep_the_project_of_the_same_version(ls_resource):
    client = ls_resource.client()
    interface = INTERFACES["step_progress"]
    first: ProjectHandle = ensure_project(client, interface, ls_resource.project_namespace)
    client.update_project(
        first.project_id, label_config=interface.label_config().replace("Latest action", "Last action")
    )
    second = ensure_project(client, interface, ls_resource.project_namespace)
    assert (first.created, second.created, second.project_id) == (True, False, first.project_id)
    assert "Latest action" in client.project(first.project_id)["label_config"]  # restored to the current config
    client.close()


def test_screenshots_are_served_to_the_projects_annotators(ls_server, ls_home, ls_resource):
    from tests.annotation.labelstudio.conftest import PNG, build_small_warehouse

    warehouse = build_small_warehouse(ls_home / "with-screenshots", episodes_per_stratum=1, screenshots=True)
    push(warehouse, ls_resource, budget=2, interfaces=("step_correctness",))
    client = ls_resource.client()
    task_id = queued_tasks(warehouse, "step_correctness")[0]["ls_task_id"]
    html = client._raw("GET", f"api/tasks/{task_id}/", what="read task")["data"]["screen_html"]
    client.close()
    src = html.split('<img class="sw-shot" src="', 1)[1].split('"', 1)[0]
    assert src.startswith(f"/data/local-files/?d={ls_home.name}/with-screenshots/screenshots/")
    from annotation.labelstudio.secrets import read_local_secrets

    admin = read_local_secrets(ls_server.data_dir)
    with httpx.Client(base_url=ls_server.url, follow_redirects=False) as browser:  # as an annotator's browser would
        browser.get("/user/login/")
        browser.post(
            "/user/login/",
            data={
                "email": admin.username,
                "password": admin.password,
                "csrfmiddlewaretoken": browser.cookies.get("csrftoken"),
            },
            headers={"Referer": f"{ls_server.url}/user/login/"},
        )
        image = browser.get(src.replace("&amp;", "&"))
    assert image.status_code == 200 and image.content == PNG


def test_a_users_own_server_from_the_environment(ls_credentials, small_warehouse, tmp_path, monkeypatch, namespace):
    from assets.resources import LabelStudioResource

    monkeypatch.setenv("LABEL_STUDIO_URL", ls_credentials.url)
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", ls_credentials.api_key)
    own = LabelStudioResource(home=str(tmp_path / "elsewhere"), autostart=True, project_namespace=namespace)
    summary = push(small_warehouse, own, budget=2, interfaces=("step_correctness",))
    assert summary["step_correctness"]["pushed"] == 2
    server = small_warehouse.query("SELECT DISTINCT ls_server FROM annotation_queue").to_pylist()
    assert server == [{"ls_server": f"127.0.0.1:{ls_credentials.url.rsplit(':', 1)[1]}"}]  # not "local"
    assert not (tmp_path / "elsewhere" / "labelstudio" / "stepwise-server.json").exists()  # nothing was started
