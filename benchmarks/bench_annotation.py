"""Benchmark: push 10,000 tasks to a real Label Studio and ingest 10,000 annotations back.

What is timed, against a private Label Studio server started for the run (and stopped after):

1. **push**: the ``annotation_queue`` asset for 10,000 selected steps (reading steps, rendering
   the HTML of each task, bulk import in chunks of 1,000 with pre-annotations, writing the queue);
2. **ingest**: one tick of the ``label_studio_sync`` sensor after 10,000 annotations exist
   (change check, snapshot export, download, parse, diff by annotation id, atomic publish);
   then a second tick with nothing changed (the cost of the sensor's cheap path).

Not timed (set-up): starting the server, building the warehouse, the selection, and creating
the 10,000 annotations (Label Studio's "predictions to annotations" bulk action turns every
pre-annotation into an annotation, as if annotators accepted them).

Steps are synthetic MiniWoB++-like screens of ~40 elements by default; ``--warehouse DIR``
takes real steps from an existing STEPWISE_HOME instead. Goal: each timed part under 60 s.
Run: ``.venv/bin/python benchmarks/bench_annotation.py [--tasks 10000] [--warehouse ~/.stepwise]``;
``--smoke`` pushes and ingests 20 tasks (the server's start, about a minute, is most of it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.compute  # noqa: E402,F401
from dagster import DagsterInstance, build_sensor_context, materialize  # noqa: E402

from annotation.labelstudio.server import LocalLabelStudio, free_port  # noqa: E402
from assets.human_labels import (  # noqa: E402
    annotation_candidates,
    annotation_queue,
    build_label_studio_sensor,
)
from assets.resources import LabelStudioResource, WarehouseResource  # noqa: E402
from warehouse.catalog import Materialization, Warehouse  # noqa: E402
from warehouse.model import Screen, UIElement  # noqa: E402
from warehouse.schema import EPISODES, PROGRESS_LABELS, STEPS, element_records  # noqa: E402
from warehouse.tables_training import RM_PREDICTIONS  # noqa: E402

TASKS = (
    "login-user",
    "click-checkboxes",
    "search-engine",
    "book-flight",
    "social-media",
    "enter-date",
    "email-inbox",
    "choose-list",
)


def synthetic_screen(seed: int, n: int = 40) -> Screen:
    """A MiniWoB++-sized screen: a form of ``n`` elements with labels, inputs, buttons and text."""
    elements = [
        UIElement(ref="1", role="body", bounds=(0, 0, 160, 210)),
        UIElement(
            ref="2",
            role="div",
            element_id="query",
            text=f"Instruction number {seed} for the task",
            bounds=(0, 0, 160, 50),
            depth=1,
        ),
        UIElement(ref="3", role="div", element_id="area", bounds=(0, 50, 160, 210), depth=1),
    ]
    for i in range(4, n + 1):
        kind = i % 4
        y = 50 + (i * 37) % 150
        if kind == 0:
            elements.append(UIElement(ref=str(i), role="label", text=f"Field {i}", bounds=(2, y, 60, y + 10), depth=2))
        elif kind == 1:
            elements.append(
                UIElement(
                    ref=str(i),
                    role="textbox",
                    element_id=f"f{i}",
                    bounds=(62, y, 150, y + 14),
                    clickable=True,
                    editable=True,
                    depth=2,
                    value="abc" if seed % 3 else "",
                )
            )
        elif kind == 2:
            elements.append(
                UIElement(
                    ref=str(i),
                    role="button",
                    element_id=f"b{i}",
                    text=f"Button {i}",
                    bounds=(5, y, 70, y + 16),
                    clickable=True,
                    depth=2,
                )
            )
        else:
            elements.append(
                UIElement(
                    ref=str(i), role="span", text=f"some text {seed % 97} {i}", bounds=(80, y, 155, y + 9), depth=3
                )
            )
    return Screen(tuple(elements))


def synthetic_warehouse(home: Path, n_steps: int) -> Warehouse:
    warehouse = Warehouse(home)
    episodes, steps, labels, predictions = [], [], [], []
    per_episode = 4
    for e in range((n_steps + per_episode - 1) // per_episode):
        task = TASKS[e % len(TASKS)]
        success = e % 3 != 0
        episode_id = f"bench:{task}:{e:06d}"
        episodes.append(
            {name: None for name in EPISODES.names}
            | {
                "episode_id": episode_id,
                "task_id": task,
                "instruction": f"Do {task} number {e}",
                "source": "synthetic:bench",
                "success": success,
                "n_steps": per_episode,
            }
        )
        for s in range(per_episode):
            screen = synthetic_screen(e * 10 + s)
            target = screen.elements[5 + s]
            steps.append(
                {name: None for name in STEPS.names}
                | {
                    "episode_id": episode_id,
                    "step_idx": s,
                    "action_type": "CLICK",
                    "action_text": f"CLICK({target.role}#{target.element_id})",
                    "target_ref": target.ref,
                    "screen": element_records(screen),
                    "n_elements": len(screen.elements),
                }
            )
            labels.append(
                {
                    "episode_id": episode_id,
                    "step_idx": s,
                    "source": "lcs",
                    "method": "improved",
                    "progress": (s + 1) / 4,
                    "is_key_step": True,
                    "recipe_id": None,
                    "completion_ratio": None,
                    "label_version": "bench",
                }
            )
            predictions.append(
                {
                    "model_id": "rm-bench",
                    "kind": "progrm_lcs",
                    "episode_id": episode_id,
                    "step_idx": s,
                    "score": ((s + 1) / 4) if success else 0.2 * s,
                }
            )
    m = Materialization(asset="bench_fixture")
    warehouse.publish(
        m,
        [
            warehouse.stage_table("episodes", "bench", pa.Table.from_pylist(episodes, schema=EPISODES), m),
            warehouse.stage_table("steps", "bench", pa.Table.from_pylist(steps, schema=STEPS), m),
            warehouse.stage_table("progress_labels", "bench", pa.Table.from_pylist(labels, schema=PROGRESS_LABELS), m),
            warehouse.stage_table(
                "rm_predictions", "rm-bench", pa.Table.from_pylist(predictions, schema=RM_PREDICTIONS), m
            ),
        ],
    )
    return warehouse


def copied_warehouse(home: Path, source: Path, n_steps: int) -> Warehouse:
    """Real steps (and their episodes) from another STEPWISE_HOME, at least ``n_steps`` of them."""
    origin = Warehouse(source)
    steps = origin.query(f"SELECT * FROM steps ORDER BY hash(episode_id), step_idx LIMIT {int(n_steps * 1.2)}")
    episode_ids = pa.compute.unique(steps.column("episode_id"))
    episodes = origin.query(
        "SELECT * FROM episodes WHERE episode_id IN (SELECT unnest(?::VARCHAR[]))", [episode_ids.to_pylist()]
    )
    n = steps.num_rows
    predictions = pa.Table.from_pydict(
        {name: [None] * n for name in RM_PREDICTIONS.names}
        | {
            "model_id": ["rm-bench"] * n,
            "kind": ["progrm_lcs"] * n,
            "episode_id": steps.column("episode_id"),
            "step_idx": steps.column("step_idx"),
            "score": [(i % 5) / 4 for i in range(n)],
        },
        schema=RM_PREDICTIONS,
    )
    warehouse = Warehouse(home)
    m = Materialization(asset="bench_fixture")
    warehouse.publish(
        m,
        [
            warehouse.stage_table("episodes", "bench", episodes, m),
            warehouse.stage_table("steps", "bench", steps, m),
            warehouse.stage_table("rm_predictions", "rm-bench", predictions, m),
        ],
    )
    return warehouse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--warehouse", type=Path, default=None, help="take real steps from this STEPWISE_HOME")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (and leave nothing running)")
    parser.add_argument("--smoke", action="store_true", help="20 synthetic tasks (the test suite)")
    args = parser.parse_args()
    if args.smoke:
        args.tasks = min(args.tasks, 20)

    root = Path(tempfile.mkdtemp(prefix="bench-annotation-"))
    home = root / "stepwise"
    results: dict[str, float | int | str] = {"tasks": args.tasks, "data": str(args.warehouse or "synthetic")}
    server = LocalLabelStudio(home, port=free_port())
    try:
        started = time.perf_counter()
        server.credentials(progress=lambda m: print(f"[label-studio] {m}", flush=True))
        results["server_start_s"] = round(time.perf_counter() - started, 1)

        started = time.perf_counter()
        warehouse = (
            copied_warehouse(home, args.warehouse, args.tasks)
            if args.warehouse
            else synthetic_warehouse(home, args.tasks)
        )
        results["warehouse_build_s"] = round(time.perf_counter() - started, 1)
        resources = {
            "warehouse": WarehouseResource(home=str(home)),
            "label_studio": LabelStudioResource(home=str(home), autostart=False, project_namespace="Bench"),
        }
        instance = DagsterInstance.ephemeral()

        started = time.perf_counter()
        selected = materialize(
            [annotation_candidates],
            resources=resources,
            instance=instance,
            run_config={
                "ops": {
                    "annotation_candidates": {
                        "config": {"budget": args.tasks, "max_per_episode": 100, "spot_check_share": 0.0}
                    }
                }
            },
        )
        results["selection_s"] = round(time.perf_counter() - started, 1)
        results["selected"] = (
            selected.asset_materializations_for_node("annotation_candidates")[0].metadata["selected"].value
        )

        print(f"pushing {results['selected']} tasks ...", flush=True)
        started = time.perf_counter()
        pushed = materialize(
            [annotation_queue],
            resources=resources,
            instance=instance,
            run_config={
                "ops": {"annotation_queue": {"config": {"interfaces": ["step_correctness"], "chunk_size": 1000}}}
            },
        )
        results["push_s"] = round(time.perf_counter() - started, 1)
        summary = (
            pushed.asset_materializations_for_node("annotation_queue")[0]
            .metadata["by_interface"]
            .value["step_correctness"]
        )
        results["pushed"] = summary["pushed"]
        results["push_import_requests_s"] = summary["seconds"]

        client = resources["label_studio"].client()
        project_id = summary["project_id"]
        task_bytes = len(
            json.dumps(
                client._raw(
                    "GET",
                    "api/tasks/",
                    params={"project": project_id, "page_size": 1, "fields": "task_only"},
                    what="sample",
                )["tasks"][0]["data"]
            )
        )
        results["bytes_per_task"] = task_bytes
        print("creating the annotations (set-up, not timed as ingest) ...", flush=True)
        started = time.perf_counter()
        created = client.predictions_to_annotations(project_id)
        results["annotations_created"] = created
        if created < results["pushed"]:
            raise RuntimeError(f"only {created} annotations were created from {results['pushed']} pre-annotations")
        results["create_annotations_setup_s"] = round(time.perf_counter() - started, 1)
        client.close()

        stages: dict[str, float] = {}
        sensor = build_label_studio_sensor(
            name="bench_sensor", on_stage=lambda stage, info: stages.setdefault(stage, time.perf_counter())
        )
        print("ingesting ...", flush=True)
        started = time.perf_counter()
        cursor = None
        ticks = 0
        while True:
            ticks += 1
            with build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
                outcome = sensor(context)
            cursor = outcome.cursor
            if getattr(outcome, "asset_events", None):
                break
            if ticks > 60:
                raise RuntimeError(f"ingest did not finish: {outcome}")
            time.sleep(1.0)
        results["ingest_s"] = round(time.perf_counter() - started, 1)
        results["ingest_ticks"] = ticks
        results["ingested"] = outcome.asset_events[0].metadata["created"].value
        for a, b in (
            ("counted", "export_requested"),
            ("export_requested", "export_ready"),
            ("export_ready", "downloaded"),
            ("downloaded", "published"),
        ):
            if a in stages and b in stages:
                results[f"ingest_{a}_to_{b}_s"] = round(stages[b] - stages[a], 2)
        started = time.perf_counter()
        with build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
            quiet = sensor(context)
        results["unchanged_tick_s"] = round(time.perf_counter() - started, 2)
        results["unchanged_tick"] = str(getattr(quiet, "skip_reason", None) and quiet.skip_reason.skip_message)
        rows = warehouse.query(
            "SELECT count(*) AS n, count(DISTINCT annotation_id) AS d FROM human_labels"
        ).to_pylist()[0]
        assert rows["n"] == rows["d"] == results["annotations_created"], rows
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    width = max(len(k) for k in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value}")
    ok = results["push_s"] < 60 and results["ingest_s"] < 60
    print(f"goal (push and ingest each under 60 s): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
