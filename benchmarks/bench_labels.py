"""Benchmark of the LCS self-annotation (ProgRM §2.2) on a corpus at the paper's scale (App. C).

The corpus (577 tasks, 10,438 trajectories of which 5,729 successful, 207,102 steps) is derived
from the real MiniWoB++ human demonstrations: see ``benchmarks/_corpus.py`` for how (task
variants with renamed vocabulary, trajectories made of consecutive recordings of a task,
success = all parts succeeded, failures abandon their last part). Then, in one process:

1. for each method ("paper", "improved"), ``annotation.progress.labeling.lcs_labels`` end to end on the
   full corpus with the real all-MiniLM-L6-v2 embedder (``TextEmbedder``, CPU): match tables
   (Eq. 9), grouping (Eq. 3), recipes (Eq. 10), key steps (Eq. 4) and labels, plus the improved
   mode's cleaning. The model is loaded once beforehand (timed apart); each method gets an empty
   embedding cache, so it pays for embedding its own texts (also timed apart). Stage times come
   from timing wrappers around the pipeline's own functions; nothing is re-run for them.
2. the per-cell cost of the dynamic programme: every batched DP call the pipeline made in (1)
   is recorded (cells and CPU time), and a random sample of those pairs is re-run with the
   pure-Python references, in this process: ``soft_lcs_reference_actions`` (Eq. 8, with Eq. 9
   evaluated on the two actions in every cell) and ``soft_lcs_reference`` (Eq. 8 with f read
   from the precomputed Eq. 9 table). Their scores and alignments must be identical to the
   fast path's, bit for bit.

Times are wall (``time.perf_counter``) and CPU of this process (``time.process_time``; MiniLM
runs on several threads, so its CPU time can exceed its wall time). On a shared machine the CPU
time is the steadier figure; the load average is printed.

    .venv/bin/python benchmarks/bench_labels.py                 # ~1.5-2.5 minutes on a 2-core box
    .venv/bin/python benchmarks/bench_labels.py --home /path/to/STEPWISE_HOME --sample-pairs 1000
    .venv/bin/python benchmarks/bench_labels.py --smoke         # a corpus of ~40 trajectories (seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships in a package; never wait on a hub

from _corpus import (  # noqa: E402
    DEMOS_DIR,
    PAPER_STEPS,
    PAPER_SUCCESS_STEPS,
    PAPER_SUCCESSES,
    PAPER_TASKS,
    PAPER_TRAJECTORIES,
    derive_paper_corpus,
    load_real_trajectories,
)
from _smoke import small_demos, smoke_root  # noqa: E402

import annotation.progress.grouping as grouping  # noqa: E402
import annotation.progress.key_steps as progress  # noqa: E402
import annotation.progress.labeling as labeling  # noqa: E402
import annotation.progress.recipes as recipes  # noqa: E402
import annotation.progress.soft_lcs as soft_lcs_module  # noqa: E402
from annotation.progress.soft_lcs import (  # noqa: E402
    SequenceStore,
    soft_lcs,
    soft_lcs_alignment_arrays_indexed,
    soft_lcs_reference,
    soft_lcs_reference_actions,
    soft_lcs_scores_indexed,
)
from annotation.progress.text_similarity import TextEmbedder, load_minilm  # noqa: E402

T = TypeVar("T")

GOAL_SECONDS = 60.0
GOAL_SPEEDUP = 100.0

#: The corpus shape: ProgRM App. C's, and the smoke run's (the four tasks of ``_smoke.small_demos``).
PAPER_SHAPE = {
    "n_tasks": PAPER_TASKS,
    "n_trajectories": PAPER_TRAJECTORIES,
    "n_successes": PAPER_SUCCESSES,
    "n_steps": PAPER_STEPS,
    "n_success_steps": PAPER_SUCCESS_STEPS,
}
SMOKE_SHAPE = {"n_tasks": 8, "n_trajectories": 40, "n_successes": 22, "n_steps": 700, "n_success_steps": 300}


def timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    """(result, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def best_of(fn: Callable[[], T], repeats: int = 3) -> tuple[T, float]:
    """(result of the first run, least CPU seconds over ``repeats`` runs)."""
    result, _, cpu = timed(fn)
    for _ in range(repeats - 1):
        cpu = min(cpu, timed(fn)[2])
    return result, cpu


class TimedEmbedder(TextEmbedder):
    """The project's MiniLM embedder, timing the model calls (cache misses) it makes."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.wall = 0.0
        self.cpu = 0.0
        self.calls = 0

    def _encode_misses(self, texts: list[str]) -> np.ndarray:
        result, wall, cpu = timed(lambda: super(TimedEmbedder, self)._encode_misses(texts))
        self.wall += wall
        self.cpu += cpu
        self.calls += 1
        return result


# --------------------------------------------------------------------------------------------
# Instrumentation of one lcs_labels run (wrappers around the pipeline's module-level functions)
# --------------------------------------------------------------------------------------------


@dataclass
class DPCall:
    """One batched DP call of the pipeline: its pairs and the tables they index."""

    kind: str  # "scores" or "alignments"
    store: SequenceStore
    a_ids: np.ndarray
    b_ids: np.ndarray
    tables: list[np.ndarray]
    table_index: np.ndarray
    cells: int
    cpu: float


@dataclass
class Probe:
    wall: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: list[DPCall] = field(default_factory=list)
    match_tables: dict = field(default_factory=dict)

    def stage(self, name: str, fn: Callable, capture: Callable[[Any], None] | None = None) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result, wall, cpu = timed(lambda: fn(*args, **kwargs))
            self.wall[name] += wall
            self.cpu[name] += cpu
            if capture is not None:
                capture(result)
            return result

        return wrapper

    def dp(self, kind: str, fn: Callable) -> Callable:
        def wrapper(store, a_ids, b_ids, tables, table_index=None):  # noqa: ANN001, ANN202
            result, _, cpu = timed(lambda: fn(store, a_ids, b_ids, tables, table_index))
            a = np.asarray(a_ids, dtype=np.int64).ravel()
            b = np.asarray(b_ids, dtype=np.int64).ravel()
            if isinstance(tables, np.ndarray) and tables.ndim == 2:
                tables, table_index = [tables], None
            index = np.zeros(a.size, np.int64) if table_index is None else np.asarray(table_index, np.int64).ravel()
            cells = int((store.lengths[a] * store.lengths[b]).sum())
            self.calls.append(DPCall(kind, store, a, b, list(tables), index, cells, cpu))
            return result

        return wrapper


@contextlib.contextmanager
def instrumented(probe: Probe) -> Iterator[None]:
    """Route the pipeline's stage functions and DP calls through ``probe`` while the block runs."""

    def keep_tables(encoded: dict) -> None:
        # build_match_tables_encoded: task -> (MatchTable, the task's trajectories encoded)
        probe.match_tables.update({task: table for task, (table, _) in encoded.items()})

    patches = [
        (labeling, "clean_trajectory", probe.stage("clean", labeling.clean_trajectory)),
        (labeling, "generalise_rare_target_texts", probe.stage("rare", labeling.generalise_rare_target_texts)),
        (labeling, "label_corpus", probe.stage("label_corpus", labeling.label_corpus)),
        # label_corpus builds the match tables (Eq. 9) and encodes the trajectories in one call
        (
            progress,
            "build_match_tables_encoded",
            probe.stage("tables", progress.build_match_tables_encoded, keep_tables),
        ),
        (progress, "build_recipe_libraries", probe.stage("recipes", progress.build_recipe_libraries)),
        (
            progress,
            "assign_progress_labels",
            probe.stage("key_steps", progress.assign_progress_labels),
        ),
    ]
    scores = probe.dp("scores", soft_lcs_module.soft_lcs_scores_indexed)
    aligns = probe.dp("alignments", soft_lcs_module.soft_lcs_alignment_arrays_indexed)
    # grouping: the Eq. (3) similarities of the recipe stage (deduplicated, prefiltered pairs)
    for module in (soft_lcs_module, grouping, recipes, progress):
        for name, wrapper in (("soft_lcs_scores_indexed", scores), ("soft_lcs_alignment_arrays_indexed", aligns)):
            if hasattr(module, name):
                patches.append((module, name, wrapper))
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, wrapper in patches:
            setattr(module, name, wrapper)
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


# --------------------------------------------------------------------------------------------
# Reference vs fast on a sample of the pipeline's pairs
# --------------------------------------------------------------------------------------------


@dataclass
class SamplePair:
    method: str
    a: np.ndarray
    b: np.ndarray
    table: np.ndarray
    match_table: Any  # the MatchTable owning ``table``, to decode symbols into actions


def sample_pairs(
    calls_by_method: dict[str, list[DPCall]], tables_by_method: dict[str, dict], n: int, rng: np.random.Generator
) -> list[SamplePair]:
    """``n`` pairs drawn uniformly from every pair the pipeline's DP calls held (all methods)."""
    pool: list[tuple[str, DPCall, int]] = []
    for method, calls in calls_by_method.items():
        pool.extend((method, call, k) for call in calls for k in range(call.a_ids.size))
    owners = {m: {id(t.scores): t for t in tables.values()} for m, tables in tables_by_method.items()}
    pairs = []
    for p in sorted(rng.choice(len(pool), size=min(n, len(pool)), replace=False).tolist()):
        method, call, k = pool[p]
        table = call.tables[int(call.table_index[k])]
        pairs.append(
            SamplePair(
                method=method,
                a=call.store[int(call.a_ids[k])],
                b=call.store[int(call.b_ids[k])],
                table=table,
                match_table=owners[method][id(table)],
            )
        )
    return pairs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--home",
        type=Path,
        default=Path(os.environ.get("STEPWISE_HOME") or Path(__file__).resolve().parents[1] / ".stepwise"),
        help="STEPWISE_HOME with the imported demonstrations (read only; if it has none, --demos is "
        "imported into a temporary home). Default: $STEPWISE_HOME or <repo>/.stepwise",
    )
    parser.add_argument("--demos", type=Path, default=DEMOS_DIR, help="demonstrations folder (only used to import)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-pairs", type=int, default=2_000, help="pairs re-run with the pure-Python references")
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="threads for MiniLM (default: torch's own choice)"
    )
    parser.add_argument("--methods", nargs="+", default=list(labeling.LCS_METHODS), choices=labeling.LCS_METHODS)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a few recordings of four tasks imported into a temporary home, a corpus of 40 trajectories (seconds)",
    )
    args = parser.parse_args(argv)
    shape = PAPER_SHAPE
    if args.smoke:
        root = smoke_root("labels")
        args.home, args.demos = root / "home", small_demos(root / "demos", args.demos)
        args.sample_pairs = min(args.sample_pairs, 100)
        shape = SMOKE_SHAPE
    load_before = os.getloadavg()
    started = time.perf_counter()

    # ---- corpus ----
    (real, source), t_load, c_load = timed(lambda: load_real_trajectories(args.home.resolve(), args.demos))
    # A partial, not a lambda: ``real`` is bound now, and the ``del real`` below stays the only
    # reference to drop (a closure over a name deleted later reads to linters as undefined).
    (corpus, stats), t_derive, c_derive = timed(functools.partial(derive_paper_corpus, real, seed=args.seed, **shape))
    real_steps = sum(t.n_steps for t in real)
    print(
        f"real demonstrations: {len(real):,} episodes, {real_steps:,} steps, {len({t.task_id for t in real})} tasks "
        f"(from {source})"
    )
    n_failures = shape["n_trajectories"] - shape["n_successes"]
    paper = {
        "tasks": (stats.tasks, shape["n_tasks"]),
        "trajectories": (stats.trajectories, shape["n_trajectories"]),
        "  successful": (stats.successes, shape["n_successes"]),
        "  failed": (stats.failures, n_failures),
        "steps": (stats.steps, shape["n_steps"]),
        "  in successful trajectories": (stats.success_steps, shape["n_success_steps"]),
        "  in failed trajectories": (stats.failure_steps, shape["n_steps"] - shape["n_success_steps"]),
    }
    print()
    print(f"{'derived corpus':<34}{'this':>10}{'smoke' if args.smoke else 'ProgRM':>10}")
    print("-" * 54)
    for name, (ours, theirs) in paper.items():
        print(f"{name:<34}{ours:>10,}{theirs:>10,}")
    print(
        f"{'  mean length, successful':<34}{stats.success_steps / stats.successes:>10.2f}"
        f"{shape['n_success_steps'] / shape['n_successes']:>10.2f}"
    )
    print(
        f"{'  mean length, failed':<34}{stats.failure_steps / stats.failures:>10.2f}"
        f"{(shape['n_steps'] - shape['n_success_steps']) / n_failures:>10.2f}"
    )
    print("-" * 54)
    print(
        f"{stats.real_tasks} real tasks x {stats.tasks // stats.real_tasks}-{-(-stats.tasks // stats.real_tasks)} "
        f"variants (v00 as recorded, others renamed); {stats.parts:,} recordings played back "
        f"({stats.real_episodes_used:,} distinct); {stats.distinct_typed_texts:,} distinct typed texts; "
        f"{stats.tasks_with_fewer_than_two_successes} tasks with < 2 successes (no recipe possible)"
    )
    del real  # the corpus keeps what it uses

    # ---- MiniLM ----
    with contextlib.suppress(Exception):  # no "Loading weights" progress bar in the table's way
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    model, t_model, c_model = timed(lambda: load_minilm())
    _, t_warm, c_warm = timed(lambda: TextEmbedder(model).embed(["warm-up"]))
    t_model, c_model = t_model + t_warm, c_model + c_warm

    # ---- the pipeline, end to end, per method ----
    results: dict[str, dict] = {}
    for method in args.methods:
        probe = Probe()
        embedder = TimedEmbedder(model)
        gc.collect()
        with instrumented(probe):
            run, wall, cpu = timed(
                lambda embedder=embedder, method=method: labeling.lcs_labels(corpus, embedder, method)
            )
        results[method] = {"run": run, "wall": wall, "cpu": cpu, "probe": probe, "embedder": embedder}
        labelled = len({r["episode_id"] for r in run.label_rows})
        print(
            f"\n{method}: {len(run.recipe_rows):,} recipes; {len(run.task_notes)} tasks without recipe; "
            f"{labelled:,} trajectories labelled ({len(run.label_rows):,} step labels, "
            f"{sum(r['is_key_step'] for r in run.label_rows):,} key steps), {len(run.unlabelled):,} not; "
            f"{embedder.texts_encoded:,} distinct texts embedded in {embedder.calls} MiniLM call(s)"
        )
        for r in run.label_rows:
            assert 0.0 <= r["progress"] <= 1.0

    # ---- timing table ----
    print()
    print(f"{'stage':<62}{'wall s':>9}{'CPU s':>9}")
    print("-" * 80)
    print(f"{'load real demonstrations (load_trajectories)':<62}{t_load:>9.2f}{c_load:>9.2f}")
    print(f"{'derive the paper-scale corpus':<62}{t_derive:>9.2f}{c_derive:>9.2f}")
    model_line = f"load all-MiniLM-L6-v2 (CPU, {torch.get_num_threads()} threads), once"
    print(f"{model_line:<62}{t_model:>9.2f}{c_model:>9.2f}")
    for method, res in results.items():
        probe, embedder = res["probe"], res["embedder"]
        w, c = probe.wall, probe.cpu
        rows = []
        if method == "improved":
            rows.append(("clean + rewrite relative to the instruction", w["clean"], c["clean"]))
            rows.append(("rare target texts -> <other>", w["rare"], c["rare"]))
        rows += [
            (
                f"MiniLM embeddings ({embedder.texts_encoded:,} texts, "
                f"{embedder.texts_encoded / max(embedder.wall, 1e-9):,.0f}/s)",
                embedder.wall,
                embedder.cpu,
            ),
            # build_match_tables_encoded encodes the trajectories to symbols with the tables
            (
                "match tables (Eq. 9) + symbol encoding, besides embeddings",
                w["tables"] - embedder.wall,
                c["tables"] - embedder.cpu,
            ),
            (
                "rest of label_corpus (codes per episode)",
                w["label_corpus"] - w["tables"] - w["recipes"] - w["key_steps"],
                c["label_corpus"] - c["tables"] - c["recipes"] - c["key_steps"],
            ),
            ("grouping (Eq. 3) + recipes (Eq. 10)", w["recipes"], c["recipes"]),
            ("key steps (Eq. 4) + progress labels", w["key_steps"], c["key_steps"]),
            (
                "label rows" + (" (+ garbage steps' labels)" if method == "improved" else ""),
                res["wall"] - w["label_corpus"] - w["clean"] - w["rare"],
                res["cpu"] - c["label_corpus"] - c["clean"] - c["rare"],
            ),
        ]
        print(f"{method + ': lcs_labels, end to end (SBERT included)':<62}{res['wall']:>9.2f}{res['cpu']:>9.2f}")
        for name, wall, cpu in rows:
            print(f"{'    ' + name:<62}{wall:>9.2f}{cpu:>9.2f}")
    print("-" * 80)

    # ---- DP: the pipeline's calls, and reference vs fast on a sample of their pairs ----
    gc.collect()
    gc.freeze()  # the corpus and labels are long-lived: keep the cyclic GC from charging the timings below
    calls = {m: r["probe"].calls for m, r in results.items()}
    tables = {m: r["probe"].match_tables for m, r in results.items()}
    rng = np.random.default_rng(args.seed + 1)
    sample = sample_pairs(calls, tables, args.sample_pairs, rng)
    sample_cells = sum(p.a.size * p.b.size for p in sample)
    table_lists = [(p.a.tolist(), p.b.tolist(), p.table.tolist()) for p in sample]

    def reference_on_tables() -> list:
        return [soft_lcs_reference(a, b, lambda x, y, s=s: s[x][y]) for a, b, s in table_lists]

    # Eq. 9 per cell, as lcs_labels configures it per method (improved: INPUTs must share their
    # field). Texts come from the method's embedder cache: MiniLM is not re-run, its cosines are.
    decoded = [
        (p.match_table.decode(p.a), p.match_table.decode(p.b), results[p.method]["embedder"], p.method == "improved")
        for p in sample
    ]

    def reference_on_actions() -> list:
        return [
            soft_lcs_reference_actions(a, b, embed, input_target_must_match=strict) for a, b, embed, strict in decoded
        ]

    # References: best of 2 (the lower their time, the lower the speed-ups quoted).
    by_tables, c_by_tables = best_of(reference_on_tables, 2)
    by_actions, c_by_actions = best_of(reference_on_actions, 2)

    # The fast path on the sample, batched as the pipeline batches (pairs of several tasks at once).
    store = SequenceStore.from_sequences([p.a for p in sample] + [p.b for p in sample])
    distinct_tables = list({id(p.table): p.table for p in sample}.values())
    position = {id(t): k for k, t in enumerate(distinct_tables)}
    a_ids = np.arange(len(sample))
    b_ids = a_ids + len(sample)
    index = np.array([position[id(p.table)] for p in sample], dtype=np.int64)
    (fast_scores, fast_alignments), c_fast_align = best_of(
        lambda: soft_lcs_alignment_arrays_indexed(store, a_ids, b_ids, distinct_tables, index)
    )
    fast_only_scores, c_fast_scores = best_of(
        lambda: soft_lcs_scores_indexed(store, a_ids, b_ids, distinct_tables, index)
    )
    one_by_one, c_one_by_one = best_of(lambda: [soft_lcs(p.a, p.b, p.table) for p in sample], 1)
    mismatches = 0
    for k, (ref_t, ref_a, single) in enumerate(zip(by_tables, by_actions, one_by_one, strict=False)):
        fast_pairs = tuple(zip(fast_alignments[k][0].tolist(), fast_alignments[k][1].tolist(), strict=False))
        same = (
            ref_t == ref_a == single
            and ref_t.score == float(fast_scores[k]) == float(fast_only_scores[k])
            and ref_t.pairs == fast_pairs
        )
        mismatches += not same
    assert mismatches == 0, f"{mismatches} of {len(sample)} sampled pairs differ between the references and the fast DP"

    # The pipeline's own DP calls: as they ran inside lcs_labels, and replayed (best of 3).
    replayed: dict[tuple[str, str], tuple[int, int, float, float]] = {}  # (calls, cells, CPU as run, CPU replayed)
    for method, method_calls in calls.items():
        for kind, fn in (("scores", soft_lcs_scores_indexed), ("alignments", soft_lcs_alignment_arrays_indexed)):
            picked = [c for c in method_calls if c.kind == kind]
            if not picked:
                continue

            def replay(picked: list[DPCall] = picked, fn: Callable = fn) -> None:
                for c in picked:
                    fn(c.store, c.a_ids, c.b_ids, c.tables, c.table_index)

            replayed[(method, kind)] = (
                len(picked),
                sum(c.cells for c in picked),
                sum(c.cpu for c in picked),
                best_of(replay)[1],
            )

    action_rate = sample_cells / c_by_actions
    table_rate = sample_cells / c_by_tables
    dp_rows = [
        ("reference: Eq. 8 + Eq. 9 per cell, on actions", sample_cells, c_by_actions),
        ("reference: Eq. 8 per cell, f from the Eq. 9 table", sample_cells, c_by_tables),
        ("fast: numpy row DP, one pair per call (+ alignment)", sample_cells, c_one_by_one),
        ("fast: batched, the same sample (scores)", sample_cells, c_fast_scores),
        ("fast: batched, the same sample (+ alignments)", sample_cells, c_fast_align),
    ]
    totals: dict[str, tuple[int, float, float]] = {}
    for method in calls:
        for kind in ("scores", "alignments"):
            if (method, kind) in replayed:
                n_calls, n_cells, as_run, again = replayed[(method, kind)]
                dp_rows.append((f"fast: lcs_labels' DP, {method}, {kind} ({n_calls} calls)", n_cells, again))
        parts = [v for (m, _), v in replayed.items() if m == method]
        if parts:
            totals[method] = (sum(v[1] for v in parts), sum(v[2] for v in parts), sum(v[3] for v in parts))
            dp_rows.append((f"fast: lcs_labels' DP, {method}, all", totals[method][0], totals[method][2]))
    print()
    print(
        f"{'DP implementation (CPU time)':<58}{'cells':>13}{'CPU s':>9}{'cells/s':>14}{'vs Eq.8+9':>10}{'vs Eq.8':>9}"
    )
    print("-" * 113)
    for name, n_cells, seconds in dp_rows:
        rate = n_cells / seconds
        print(
            f"{name:<58}{n_cells:>13,}{seconds:>9.3f}{rate:>14,.0f}"
            f"{rate / action_rate:>9.0f}x{rate / table_rate:>8.0f}x"
        )
    print("-" * 113)
    n_pairs = sum(c.a_ids.size for cs in calls.values() for c in cs)
    print(
        f"sample: {len(sample):,} pairs drawn from the {n_pairs:,} pairs of lcs_labels' DP calls ({', '.join(calls)}); "
        "the references, the one-pair fast path and the batched fast path agree on every one: identical scores "
        "and alignments. Cells are |a| x |b| per pair (padding not counted). lcs_labels' DP rows: the calls "
        "lcs_labels made, replayed with the same arguments (best of 3)."
    )

    # ---- goals ----
    print()
    for method, res in results.items():
        verdict = "met" if res["wall"] <= GOAL_SECONDS else "NOT met in wall time"
        cpu_verdict = "met" if res["cpu"] <= GOAL_SECONDS else "NOT met"
        print(
            f"goal: full corpus <= {GOAL_SECONDS:.0f} s ({method}): {res['wall']:.1f} s wall -> {verdict}; "
            f"{res['cpu']:.1f} s CPU -> {cpu_verdict}"
        )
    for method, (n_cells, as_run, again) in totals.items():
        rate, rate_as_run = n_cells / again, n_cells / as_run
        speedup = rate / action_rate
        verdict = "met" if speedup >= GOAL_SPEEDUP else "NOT met"
        print(
            f"goal: >= {GOAL_SPEEDUP:.0f}x the pure-Python reference per DP cell ({method}, all of lcs_labels' DP): "
            f"{speedup:,.0f}x vs Eq. 8 + 9 -> {verdict} ({rate_as_run / action_rate:,.0f}x as timed inside "
            f"lcs_labels; {rate / table_rate:,.0f}x vs Eq. 8 on a precomputed table)"
        )
    load_after = os.getloadavg()
    print(
        f"benchmark total {time.perf_counter() - started:.0f} s wall; load average (1 min) "
        f"{load_before[0]:.1f} at start, {load_after[0]:.1f} at end, on {os.cpu_count()} CPUs"
    )
    gc.unfreeze()


if __name__ == "__main__":
    main()
