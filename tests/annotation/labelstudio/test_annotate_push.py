"""`stepwise annotate push` (:func:`annotation.labelstudio.human_labels.push_from_cli`): selection and push without
Dagster, against the real server; the first task an annotator is given is from a real trajectory."""

from __future__ import annotations

from collections import Counter

import pytest

from annotation.labelstudio.human_labels import (
    AnnotatePushOptions,
    PushOptions,
    SelectionOptions,
    cli_site,
    push_from_cli,
)
from tests.annotation.labelstudio.conftest import build_small_warehouse

pytestmark = pytest.mark.e2e

SOURCES = ("synthetic:mismatched_instruction", "synthetic:random_walk", "rollout", "human_demo")


def test_annotate_push_queues_real_trajectories_first(ls_server, ls_home, namespace, tmp_path):
    for source in SOURCES:
        warehouse = build_small_warehouse(tmp_path / "stepwise", source=source)
    source_of = {
        r["episode_id"]: r["source"] for r in warehouse.query("SELECT episode_id, source FROM episodes").to_pylist()
    }
    site = cli_site(ls_home, namespace=namespace, start=False)
    options = AnnotatePushOptions(
        selection=SelectionOptions(budget=20, spot_check_share=0.0), push=PushOptions(interfaces=("step_correctness",))
    )
    lines: list[str] = []
    result = push_from_cli(warehouse, site, options, log=lines.append)
    outcome = result["push"]["by_interface"]["step_correctness"]
    assert outcome["pushed"] == 20 and result["selection"]["selected"] == 20

    client = site.connect()
    try:
        tasks = sorted(client.iter_tasks(outcome["project_id"]), key=lambda t: t["id"])
        pushed = [source_of[t["data"]["episode_id"]] for t in tasks]
        assert Counter(pushed) == {"human_demo": 12, "rollout": 6, "synthetic:random_walk": 2}
        assert pushed[:18] == ["human_demo"] * 12 + ["rollout"] * 6  # in import order: real ones first
        first = client._raw("GET", f"api/projects/{outcome['project_id']}/next/", what="next task")
        assert source_of[first["data"]["episode_id"]] == "human_demo"  # what the annotator is shown first
    finally:
        client.close()
    assert any("human_demo" in line and "60.0% of the selection" in line for line in lines)
    assert lines[-1].startswith(f"annotators log in at {result['push']['label_studio']}/user/login/")
