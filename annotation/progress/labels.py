"""The labels stage: synthetic trajectories, recipe library and progress labels, the RM split, and
the label-quality report (ProgRM §2.2, App. B-C), read from and published to the warehouse.

The ``run_*`` functions are the stage's edge: they read the warehouse, call the pure functions
of this package (``synthesis``, ``labeling``, ``split``) and publish the results with lineage.
The ``stepwise label`` / ``stepwise label-report`` commands and the Dagster assets of
``assets/labels.py`` call them; nothing here knows Dagster.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from annotation.progress.label_increments import run_family_labels as run_family_labels
from annotation.progress.label_io import default_specs_dir as default_specs_dir
from annotation.progress.label_io import label_families as label_families
from annotation.progress.label_partitions import LABEL_MODE_HELP as LABEL_MODE_HELP
from annotation.progress.label_partitions import REPLAY_MILESTONES_HELP as REPLAY_MILESTONES_HELP
from annotation.progress.label_partitions import episodes_version as episodes_version
from annotation.progress.label_partitions import families_with_new_episodes as families_with_new_episodes
from annotation.progress.label_partitions import family_labels_version as family_labels_version
from annotation.progress.label_partitions import label_backlog as label_backlog
from annotation.progress.label_partitions import run_label_partitions as run_label_partitions
from annotation.progress.label_runs import LABELS_CODE_VERSION as LABELS_CODE_VERSION
from annotation.progress.label_runs import LabelSummary as LabelSummary
from annotation.progress.label_runs import family_where, spec_inputs
from annotation.progress.label_runs import make_embedder as make_embedder
from annotation.progress.label_runs import run_labeling as run_labeling
from annotation.progress.labeling import LabelQuality, env_labels, label_quality
from annotation.progress.plots import quality_plot
from annotation.progress.split import training_split
from annotation.progress.synthesis import synthesize
from envs.tasks import load_task_specs
from warehouse.catalog import Materialization, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.plotting import Markdown
from warehouse.purposes import EpisodePurpose, purpose_filter
from warehouse.schema import LABEL_QUALITY, PROGRESS_SPLIT
from warehouse.storage import git_revision
from warehouse.trajectories import load_trajectories, trajectories_to_tables

SYNTHETIC_DATASET = "synthetic"
Log = Callable[[str], None]


# -- synthetic trajectories -------------------------------------------------------------------


def run_synthesis(warehouse: Warehouse, *, seed: int = 0, run_id: str | None = None, log: Log = print) -> dict:
    """ProgRM App. B over the real trajectories in the warehouse; replaces the synthetic dataset."""
    real = list(load_trajectories(warehouse, f"e.source NOT LIKE 'synthetic:%' AND {purpose_filter()}"))
    synthetic = synthesize(real, seed=seed)
    episodes, steps = trajectories_to_tables(
        synthetic, created_at=datetime.now(UTC), run_id=run_id, purpose=EpisodePurpose.SYNTHETIC
    )
    m = Materialization(
        asset="synthetic_trajectories",
        run_id=run_id,
        code_version=f"{LABELS_CODE_VERSION}+{git_revision()}",
        parameters={"seed": seed},
        inputs=warehouse.current_inputs(["episodes", "steps"], exclude_dataset=SYNTHETIC_DATASET),
    )
    warehouse.publish(
        m,
        [
            warehouse.stage_table("episodes", SYNTHETIC_DATASET, episodes, m),
            warehouse.stage_table("steps", SYNTHETIC_DATASET, steps, m),
        ],
    )
    kinds = Counter(t.source for t in synthetic)
    log(f"synthesised {len(synthetic)} trajectories from {len(real)} real ones: {dict(kinds)}")
    return {
        "episodes": len(synthetic),
        "steps": steps.num_rows,
        "kinds": dict(kinds),
        "materialization_id": m.materialization_id,
    }


# -- recipes and labels: annotation.progress.label_runs (streamed, per label family, incremental) ----------


# -- the reward-model split ---------------------------------------------------------------------


def run_split(
    warehouse: Warehouse, *, by: str = "goal", seed: int = 0, run_id: str | None = None, log: Log = print
) -> dict:
    """ProgRM App. C: split by task goal, failed steps sampled to ~1:1 with successful ones."""
    trajectories = list(load_trajectories(warehouse, purpose_filter(), with_screens=False))
    rows = training_split(trajectories, by=by, seed=seed)
    table = pa.Table.from_pylist(
        [
            {
                "episode_id": r.episode_id,
                "task_id": r.task_id,
                "goal_key": r.goal_key,
                "split": r.split,
                "success": r.success,
                "n_steps": r.n_steps,
                "n_steps_sampled": len(r.sampled_steps),
                "sampled_steps": list(r.sampled_steps),
            }
            for r in rows
        ],
        schema=PROGRESS_SPLIT,
    )
    m = Materialization(
        asset="progress_split",
        run_id=run_id,
        code_version=f"{LABELS_CODE_VERSION}+{git_revision()}",
        parameters={"by": by, "seed": seed},
        inputs=warehouse.current_inputs(["episodes", "steps"]),
    )
    warehouse.publish(m, [warehouse.stage_table("progress_split", "all", table, m)])
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"episodes": 0, "success_steps": 0, "failure_steps": 0})
    for r in rows:
        c = counts[r.split]
        c["episodes"] += 1
        c["success_steps" if r.success else "failure_steps"] += len(r.sampled_steps)
    log(f"split by {by}: {dict(counts)}")
    return {"splits": dict(counts), "materialization_id": m.materialization_id}


# -- label quality ----------------------------------------------------------------------------


def run_label_report(
    warehouse: Warehouse,
    *,
    specs_dir: str | Path | None = None,
    run_id: str | None = None,
    publish: bool = True,
    log: Log = print,
) -> list[dict]:
    """Score the current LCS labels against the milestone ground truth of the specs in
    ``specs_dir`` (one YAML file per task): per task and per task set (the specs' ``tuning``:
    dev or held_out), paper-faithful mode next to the improved one."""
    specs_dir = str(specs_dir or default_specs_dir())
    specs = load_task_specs(specs_dir)
    tasks = sorted(specs)
    # Real trajectories only: a synthetic one (another task's instruction, a random walk over
    # recorded screens) has no environment behind it to define ground truth.
    trajectories = list(
        load_trajectories(
            warehouse,
            f"list_contains(?, e.task_id) AND e.source NOT LIKE 'synthetic:%' AND {purpose_filter()}",
            [tasks],
        )
    )
    if not trajectories:
        log(f"no episodes of the tasks with specs in {specs_dir} ({', '.join(tasks)})")
    # The specs in ``specs_dir`` are the truth, not the ones a rollout recorded its milestones under.
    truth = env_labels(trajectories, specs, replay_milestones=True)
    lcs_rows = warehouse.query(
        "SELECT l.episode_id, l.step_idx, l.method, l.progress, l.is_key_step FROM progress_labels l "
        "JOIN episodes e USING (episode_id) WHERE l.source = 'lcs' AND list_contains(?, e.task_id) "
        "AND e.source NOT LIKE 'synthetic:%'",
        [tasks],
    ).to_pylist()
    task_of = {t.episode_id: t.task_id for t in trajectories}
    sets = {task: str(spec.extra.get("tuning", "untagged")) for task, spec in specs.items()}
    per_task = label_quality(lcs_rows, truth.label_rows, task_of, {t: t for t in tasks})
    results = label_quality(lcs_rows, truth.label_rows, task_of, sets) + task_means(per_task, sets) + per_task
    rows = [asdict(q) | {"specs_dir": specs_dir} for q in results]
    for note, reason in truth.unlabelled.items():
        log(f"no ground truth for {note}: {reason}")
    if publish and rows:
        m = Materialization(
            asset="label_quality",
            run_id=run_id,
            code_version=f"{LABELS_CODE_VERSION}+{git_revision()}",
            parameters={"specs_dir": specs_dir},
            inputs=warehouse.current_inputs(["progress_labels", "episodes", "steps"]) + spec_inputs(specs),
        )
        warehouse.publish(
            m, [warehouse.stage_table("label_quality", "all", pa.Table.from_pylist(rows, schema=LABEL_QUALITY), m)]
        )
    return rows


def task_means(per_task: list[LabelQuality], sets: dict[str, str]) -> list[LabelQuality]:
    """Each task set's metrics averaged over its tasks (macro), next to the step-weighted rows:
    a few big, noisy tasks should not hide how the labeller does on the others."""
    grouped: dict[tuple[str, str], list[LabelQuality]] = defaultdict(list)
    for q in per_task:
        grouped[(q.method, sets[q.task_set])].append(q)
    out = []
    for (method, set_name), qs in sorted(grouped.items()):

        def mean(name: str, qs: list[LabelQuality] = qs) -> float:
            return sum(getattr(q, name) for q in qs) / len(qs)

        out.append(
            LabelQuality(
                method=method,
                task_set=f"{set_name} (task mean)",
                tasks=len(qs),
                episodes=sum(q.episodes for q in qs),
                key_step_precision=mean("key_step_precision"),
                key_step_recall=mean("key_step_recall"),
                key_step_progress_error=mean("key_step_progress_error"),
                step_progress_error=mean("step_progress_error"),
            )
        )
    return out


def quality_markdown(rows: list[dict]) -> Markdown:
    """Label-quality rows as a markdown table."""
    lines = [
        "| method | task set | tasks | episodes | key-step precision | key-step recall | key-step progress error "
        "| step progress error |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['task_set']} | {r['tasks']} | {r['episodes']} | {r['key_step_precision']:.3f} | "
            f"{r['key_step_recall']:.3f} | {r['key_step_progress_error']:.3f} | {r['step_progress_error']:.3f} |"
        )
    return Markdown("\n".join(lines))


@dataclass
class LabelReport:
    """The label-quality report: every row, the per-set summary and the per-task table, a plot."""

    rows: list[dict]
    summary: Markdown
    per_task: Markdown
    plot: Markdown


def run_label_quality_report(
    warehouse: Warehouse, *, specs_dir: str | Path | None = None, run_id: str | None = None, log: Log = print
) -> LabelReport:
    """:func:`run_label_report`, published, with its summary tables and the per-task error plot."""
    specs_dir = str(specs_dir or default_specs_dir())
    rows = run_label_report(warehouse, specs_dir=specs_dir, run_id=run_id, log=log)
    set_names = {str(s.extra.get("tuning", "untagged")) for s in load_task_specs(specs_dir).values()}
    summary_rows = [r for r in rows if r["task_set"].removesuffix(" (task mean)") in set_names]
    return LabelReport(
        rows=rows,
        summary=quality_markdown(summary_rows),
        per_task=quality_markdown([r for r in rows if r not in summary_rows]),
        plot=quality_plot(rows, warehouse.home / "plots" / "label_quality.png"),
    )


# -- checks -----------------------------------------------------------------------------------


def _count(warehouse: Warehouse, sql: str) -> int:
    return int(warehouse.query(sql).to_pylist()[0]["n"])


def check_progress_labels(warehouse: Warehouse, families: Sequence[str] | None = None) -> dict[str, CheckOutcome]:
    """The checks of ``progress_labels``: labels in [0, 1], non-decreasing along an episode
    (per source and method), and every episode that may be trained on labelled or its reason
    recorded in label_notes (evaluation episodes are never labelled: ``warehouse.purposes``).

    ``families``: the label families a run labelled; the third check then counts only their
    episodes. A loop that lands episodes of several families and labels them one family per run
    (the flywheel round) would otherwise see the families still to come as a failure."""
    bad_range = _count(
        warehouse, "SELECT count(*) AS n FROM progress_labels WHERE progress < 0 OR progress > 1 OR isnan(progress)"
    )
    decreasing = _count(
        warehouse,
        "SELECT count(*) AS n FROM (SELECT progress - lag(progress) OVER "
        "(PARTITION BY episode_id, source, method ORDER BY step_idx) AS d "
        "FROM progress_labels WHERE source IN ('lcs', 'env')) WHERE d < -1e-9",
    )
    params: list = []
    if families is None:
        scope = purpose_filter()
    else:
        scope, params = family_where(families)
    unexplained = int(
        warehouse.query(
            f"SELECT count(*) AS n FROM episodes e WHERE {scope} AND NOT EXISTS "
            "(SELECT 1 FROM progress_labels l WHERE l.episode_id = e.episode_id AND l.source = 'lcs') "
            "AND NOT EXISTS (SELECT 1 FROM label_notes n "
            "WHERE (n.scope = 'episode' AND n.key = e.episode_id) OR (n.scope = 'task' AND n.key = e.task_id))",
            params,
        ).to_pylist()[0]["n"]
    )
    explained = {"unexplained": unexplained} | ({"families": sorted(families)} if families is not None else {})
    return {
        "labels_in_unit_interval": CheckOutcome(bad_range == 0, {"out_of_range": bad_range}),
        "labels_non_decreasing": CheckOutcome(decreasing == 0, {"decreasing_steps": decreasing}),
        "every_episode_labelled_or_explained": CheckOutcome(unexplained == 0, explained),
    }


def check_improved_beats_paper(warehouse: Warehouse) -> CheckOutcome:
    """The improved LCS mode has a lower key-step progress error than the paper mode on the
    held-out tasks (task mean)."""
    rows = warehouse.query(
        "SELECT method, key_step_progress_error AS e FROM label_quality WHERE task_set = 'held_out (task mean)'"
    ).to_pylist()
    errors = {r["method"]: r["e"] for r in rows}
    passed = "improved" in errors and "paper" in errors and errors["improved"] < errors["paper"]
    return CheckOutcome(passed, {"errors": errors})
