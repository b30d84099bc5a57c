"""Benchmark of the LCS self-annotation (ProgRM §2.2) at the paper's corpus size (App. C).

Builds a synthetic corpus shaped like ProgRM's WikiHow data (default: 577 tasks, 10,438
trajectories, ~5.7k successful, ~207k steps; successful trajectories ~14 steps, failed ones ~27),
then times, end to end:

  1. match tables + encoding (Eq. 9 between each task's distinct actions; text embeddings),
  2. grouping (Sim, Eq. 3) and recipes (Eq. 10),
  3. key steps (CR, Eq. 4) and progress labels,

and compares the fast batched DP with the pure-Python reference of Eq. (8) per DP cell on a
sample of the real workload's pairs, asserting identical scores and alignments.

Each task has a few canonical paths (shared prefixes, clicks, typed values, scrolls, QA answers);
successful trajectories follow one with noise (waits, scroll down/up, click-then-back detours,
paraphrased typed values); failed ones follow a prefix of one and then wander.

    python benchmarks/bench_labels.py            # model-free text embeddings (hashing)
    python benchmarks/bench_labels.py --sbert    # all-MiniLM-L6-v2 sentence embeddings (CPU)
    python benchmarks/bench_labels.py --tasks 50 --trajectories 900   # smaller corpus
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships in a package; never wait on a hub

from annotation.progress import assign_progress_labels  # noqa: E402
from annotation.recipes import Episode, build_recipe_libraries  # noqa: E402
from annotation.soft_lcs import (  # noqa: E402
    SequenceStore,
    build_match_tables,
    soft_lcs,
    soft_lcs_alignment_arrays_indexed,
    soft_lcs_alignments,
    soft_lcs_reference,
    soft_lcs_reference_actions,
    soft_lcs_scores_indexed,
)
from annotation.text_similarity import Embed, HashingTextEmbedder, TextEmbedder  # noqa: E402
from warehouse.model import Action, ActionType, UIElement  # noqa: E402

T = TypeVar("T")

WORDS = (
    "account address answer apple article bake battery blue bookmark budget camera card chart "
    "city clean coffee comment contact cook cycle dance delete design dinner doctor draw email "
    "exercise family fix flight flower garden gift guitar hair health history home hotel house "
    "insurance invest jacket job kitchen knit language laptop learn letter loan map meditate "
    "money movie music network news note paint password payment pet phone photo plant poem "
    "profile rating recipe rent repair resume run save school search share shoe sleep song "
    "study summer swim tax tea ticket travel tree vanda video wallet water weather wedding write yoga"
).split()
ROLES = ("button", "link", "tab", "menuitem", "checkbox", "listitem", "image")


# --------------------------------------------------------------------------------------------
# Synthetic corpus
# --------------------------------------------------------------------------------------------


def _words(rng: np.random.Generator, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(low, high + 1))).tolist())


def _make_task(rng: np.random.Generator, task_id: str) -> dict:
    """A task's UI vocabulary and its canonical paths (each a list of (kind, payload) templates)."""
    elements = []
    for k in range(int(rng.integers(15, 41))):
        role = str(rng.choice(ROLES))
        has_id = rng.random() < 0.7
        elements.append(
            UIElement(
                ref=f"{task_id}-e{k}",
                role=role,
                text=_words(rng, 1, 3),
                element_id=f"{role}-{k}" if has_id else "",
                classes="" if has_id else f"{role}-item item-{k % 5}",
            )
        )
    fields = [
        UIElement(ref=f"{task_id}-f{k}", role="textbox", element_id=f"field-{k}", editable=True)
        for k in range(int(rng.integers(1, 4)))
    ]
    values = [_words(rng, 1, 2) for _ in fields]
    kind = str(rng.choice(["cross_page", "in_page", "qa"], p=[0.4, 0.35, 0.25]))
    answer = _words(rng, 2, 4)
    paths: list[list[tuple[str, object]]] = []
    for p in range(int(rng.choice([1, 1, 2, 2, 3]))):
        if p and rng.random() < 0.6:  # alternative policies often share the first steps
            cut = int(rng.integers(1, max(2, len(paths[0]) // 2)))
            path = list(paths[0][:cut])
        else:
            path = []
        target_len = int(rng.integers(7, 13))
        while len(path) < target_len:
            r = rng.random()
            if r < 0.16:
                f = int(rng.integers(len(fields)))
                path.append(("input", f))
            elif r < 0.24:
                path.append(("scroll", "DOWN"))
            elif r < 0.26:
                path.append(("long_click", int(rng.integers(len(elements)))))
            else:
                path.append(("click", int(rng.integers(len(elements)))))
        if kind == "qa":
            path.append(("answer", None))
        paths.append(path)
    return {"elements": elements, "fields": fields, "values": values, "answer": answer, "paths": paths}


def _realise(rng: np.random.Generator, task: dict, template: tuple[str, object]) -> Action:
    kind, payload = template
    if kind == "click":
        return Action(ActionType.CLICK, task["elements"][payload])
    if kind == "long_click":
        return Action(ActionType.LONG_CLICK, task["elements"][payload])
    if kind == "scroll":
        return Action(ActionType.SCROLL, direction=payload)
    if kind == "input":
        value = task["values"][payload]
        variant = rng.random()
        if variant < 0.2:  # paraphrases of the same value, as agents type them
            value = f"{task['fields'][payload].element_id.replace('-', ' ')} {value}"
        elif variant < 0.3:
            value = value.title()
        elif variant < 0.35:
            value = f"{value} {rng.choice(WORDS)}"
        return Action(ActionType.INPUT, task["fields"][payload], text=value)
    if kind == "answer":
        answer = task["answer"] if rng.random() < 0.7 else f"the answer is {task['answer']}"
        return Action(ActionType.ANSWER, text=answer)
    raise ValueError(kind)


def _noise(rng: np.random.Generator, task: dict) -> list[Action]:
    r = rng.random()
    random_element = task["elements"][int(rng.integers(len(task["elements"])))]
    if r < 0.35:
        return [Action(ActionType.NOTHING)]
    if r < 0.55:
        return [Action(ActionType.SCROLL, direction="DOWN"), Action(ActionType.SCROLL, direction="UP")]
    if r < 0.8:
        return [Action(ActionType.CLICK, random_element), Action(ActionType.GOBACK)]
    return [Action(ActionType.CLICK, random_element)]


def _successful(rng: np.random.Generator, task: dict) -> tuple[Action, ...]:
    path = task["paths"][int(rng.integers(len(task["paths"])))]
    steps: list[Action] = []
    for template in path:
        while rng.random() < 0.22:
            steps.extend(_noise(rng, task))
        steps.append(_realise(rng, task, template))
    return tuple(steps)


def _failed(rng: np.random.Generator, task: dict) -> tuple[Action, ...]:
    path = task["paths"][int(rng.integers(len(task["paths"])))]
    steps: list[Action] = []
    for template in path[: int(rng.integers(0, len(path)))]:  # partial progress, then lost
        while rng.random() < 0.3:
            steps.extend(_noise(rng, task))
        steps.append(_realise(rng, task, template))
    wander = int(rng.integers(8, 33))
    while wander > 0:
        if rng.random() < 0.12:
            steps.append(_realise(rng, task, ("input", int(rng.integers(len(task["fields"]))))))
            wander -= 1
        else:
            noise = _noise(rng, task)
            steps.extend(noise)
            wander -= len(noise)
    return tuple(steps)


def synthetic_corpus(n_tasks: int, n_trajectories: int, success_rate: float, seed: int) -> dict[str, list[Episode]]:
    """Episodes by task; per-task success rates vary (Beta), so some tasks have 0 or 1 success."""
    rng = np.random.default_rng(seed)
    per_task = np.full(n_tasks, n_trajectories // n_tasks)
    per_task[rng.choice(n_tasks, size=n_trajectories % n_tasks, replace=False)] += 1
    concentration = 2.5
    rates = rng.beta(success_rate * concentration, (1 - success_rate) * concentration, size=n_tasks)
    corpus: dict[str, list[Episode]] = {}
    for t in range(n_tasks):
        task_id = f"task{t:04d}"
        task = _make_task(rng, task_id)
        episodes = []
        for k in range(int(per_task[t])):
            success = bool(rng.random() < rates[t])
            actions = _successful(rng, task) if success else _failed(rng, task)
            episodes.append(Episode(f"{task_id}-ep{k:03d}", actions, success))
        corpus[task_id] = episodes
    return corpus


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    """(result, wall seconds, CPU seconds of this process).

    CPU time is what a DP cell costs, and it does not move when another job shares the machine;
    wall time is what a user waits.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def best_cpu(fn: Callable[[], object], repeats: int = 3) -> float:
    return min(timed(fn)[2] for _ in range(repeats))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=577)
    parser.add_argument("--trajectories", type=int, default=10_438)
    parser.add_argument("--success-rate", type=float, default=5_729 / 10_438)
    parser.add_argument("--theta", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-pairs", type=int, default=1_500, help="pairs timed with the reference DP")
    parser.add_argument("--sbert", action="store_true", help="embed texts with all-MiniLM-L6-v2 instead of hashing")
    args = parser.parse_args(argv)

    corpus, t_corpus, _ = timed(lambda: synthetic_corpus(args.tasks, args.trajectories, args.success_rate, args.seed))
    episodes = [e for eps in corpus.values() for e in eps]
    successes = [e for e in episodes if e.success]
    n_steps = sum(len(e.actions) for e in episodes)
    success_steps = sum(len(e.actions) for e in successes)
    print(
        f"corpus: {len(corpus)} tasks, {len(episodes):,} trajectories ({len(successes):,} successful), "
        f"{n_steps:,} steps ({success_steps:,} in successful, {n_steps - success_steps:,} in failed); "
        f"generated in {t_corpus:.1f} s"
    )

    embedder: Embed
    if args.sbert:
        embedder = TextEmbedder()
        _, t_load, _ = timed(lambda: embedder.embed(["warm-up"]))  # model load: not annotation work
        print(f"MiniLM loaded in {t_load:.1f} s")
    else:
        embedder = HashingTextEmbedder()
    # ---- the pipeline, stage by stage (what annotation.progress.label_corpus does) ----
    by_task = {t: [e.actions for e in eps] for t, eps in corpus.items()}
    tables, *t_tables = timed(lambda: build_match_tables(by_task, embedder))
    codes, *t_encode = timed(
        lambda: {e.episode_id: tables[t].encode(e.actions) for t, eps in corpus.items() for e in eps}
    )
    recipes, *t_recipes = timed(
        lambda: build_recipe_libraries(corpus, tables, theta=args.theta, codes_by_episode=codes)
    )
    labels, *t_labels = timed(lambda: assign_progress_labels(corpus, recipes, tables, codes_by_episode=codes))
    stages = [
        ("match tables (Eq. 9" + (", incl. MiniLM embeddings)" if args.sbert else ", hashing embedder)"), t_tables),
        ("encode trajectories to symbols", t_encode),
        ("grouping (Eq. 3) + recipes (Eq. 10)", t_recipes),
        ("key steps (Eq. 4) + progress labels", t_labels),
    ]

    n_recipes = sum(len(r.recipes) for r in recipes.values())
    no_recipe = [r for r in recipes.values() if not r.has_recipes]
    labelled = [lab for lab in labels.values() if lab.labelled]
    key_steps = sum(len(lab.key_steps) for lab in labelled)
    symbols = sum(len(t) for t in tables.values())
    texts = getattr(embedder, "texts_encoded", 0)
    print(
        f"result: {n_recipes:,} recipes; {len(no_recipe)} tasks without recipe "
        f"({sum(r.n_successful <= 1 for r in no_recipe)} with <= 1 success); {len(labelled):,} trajectories labelled "
        f"({sum(len(lab.steps) for lab in labelled):,} steps, {key_steps:,} key steps); "
        f"{symbols:,} distinct actions, {texts:,} distinct texts embedded"
    )
    for lab in labelled:
        p = np.array(lab.progress)
        assert ((p >= 0) & (p <= 1)).all() and (np.diff(p) >= 0).all()

    print()
    print(f"{'stage (full corpus)':<55}{'wall s':>9}{'CPU s':>9}")
    print("-" * 73)
    for name, (wall, cpu) in stages:
        print(f"{name:<55}{wall:>9.2f}{cpu:>9.2f}")
    print("-" * 73)
    print(f"{'total':<55}{sum(w for _, (w, _) in stages):>9.2f}{sum(c for _, (_, c) in stages):>9.2f}")

    # The corpus and its labels are ~1M long-lived objects: from here on, keep Python's cyclic GC
    # from re-scanning them (it would charge the per-cell timings for the benchmark's own data).
    # The pipeline stages above ran without this, as they would in a real process.
    gc.collect()
    gc.freeze()

    # ---- the DP workloads of the corpus (as the pipeline runs them), for per-cell throughput ----
    task_index = {t: k for k, t in enumerate(corpus)}
    score_tables = [tables[t].scores for t in corpus]
    sequences: list[np.ndarray] = []
    group_pairs: list[tuple[int, int, int]] = []
    key_pairs: list[tuple[int, int, int]] = []
    for task, eps in corpus.items():
        first = len(sequences)
        sequences.extend(codes[e.episode_id] for e in eps)
        won = [first + k for k, e in enumerate(eps) if e.success]
        group_pairs.extend((a, b, task_index[task]) for n, a in enumerate(won) for b in won[n + 1 :])
        for recipe in recipes[task].recipes:
            sequences.append(np.asarray(recipe.symbols, dtype=np.int64))
            key_pairs.extend((first + k, len(sequences) - 1, task_index[task]) for k in range(len(eps)))
    store = SequenceStore.from_sequences(sequences)
    group = np.array(group_pairs, dtype=np.int64).reshape(-1, 3)
    key = np.array(key_pairs, dtype=np.int64).reshape(-1, 3)

    def cells(pairs: np.ndarray) -> int:
        return int((store.lengths[pairs[:, 0]] * store.lengths[pairs[:, 1]]).sum())

    t_group_scores = best_cpu(
        lambda: soft_lcs_scores_indexed(store, group[:, 0], group[:, 1], score_tables, group[:, 2])
    )
    t_key_scores = best_cpu(lambda: soft_lcs_scores_indexed(store, key[:, 0], key[:, 1], score_tables, key[:, 2]))
    t_key_align = best_cpu(
        lambda: soft_lcs_alignment_arrays_indexed(store, key[:, 0], key[:, 1], score_tables, key[:, 2])
    )

    # ---- reference vs fast on a sample of those pairs ----
    rng = np.random.default_rng(args.seed + 1)
    pool = np.concatenate([group, key])
    sample = pool[rng.choice(len(pool), size=min(args.sample_pairs, len(pool)), replace=False)]
    sample_cells = cells(sample)
    as_lists = [t.tolist() for t in score_tables]
    sample_lists = [(store[a].tolist(), store[b].tolist(), as_lists[t]) for a, b, t in sample.tolist()]

    def reference_on_tables() -> list:
        return [soft_lcs_reference(a, b, lambda x, y, s=s: s[x][y]) for a, b, s in sample_lists]

    reference, _, t_reference = timed(reference_on_tables)
    t_reference = min(t_reference, best_cpu(reference_on_tables, repeats=1))
    fast = soft_lcs_alignments(
        [store[a] for a in sample[:, 0]], [store[b] for b in sample[:, 1]], score_tables, sample[:, 2]
    )
    mismatches = sum(r != f for r, f in zip(reference, fast))
    assert mismatches == 0, f"{mismatches} of {len(sample)} sampled pairs differ between reference and fast DP"
    t_fast_sample = best_cpu(
        lambda: soft_lcs_alignment_arrays_indexed(store, sample[:, 0], sample[:, 1], score_tables, sample[:, 2])
    )
    t_one_by_one = best_cpu(lambda: [soft_lcs(store[a], store[b], score_tables[t]) for a, b, t in sample.tolist()], 1)

    # Eq. (8) with Eq. (9) evaluated action by action, as the equations are written.
    names = list(corpus)
    action_sample = sample[: max(1, len(sample) // 3)]
    decoded = [
        (tables[names[t]].decode(store[a]), tables[names[t]].decode(store[b])) for a, b, t in action_sample.tolist()
    ]
    by_actions, _, t_by_actions = timed(lambda: [soft_lcs_reference_actions(a, b, embedder) for a, b in decoded])
    action_cells = cells(action_sample)
    assert by_actions == fast[: len(action_sample)], "the reference on actions differs from the fast DP"

    table_rate = sample_cells / t_reference
    action_rate = action_cells / t_by_actions
    rows = [
        ("reference: Eq. 8 + Eq. 9 per cell, on actions", action_cells, t_by_actions),
        ("reference: Eq. 8 per cell, f from the score table", sample_cells, t_reference),
        ("fast: numpy row DP, one pair per call", sample_cells, t_one_by_one),
        ("fast: batched, the same sample (+ alignments)", sample_cells, t_fast_sample),
        ("fast: batched, corpus grouping pairs (scores)", cells(group), t_group_scores),
        ("fast: batched, corpus key-step pairs (scores)", cells(key), t_key_scores),
        ("fast: batched, corpus key-step pairs (+ alignments)", cells(key), t_key_align),
    ]
    print()
    print(
        f"{'DP implementation (CPU time)':<53}{'cells':>12}{'CPU s':>8}{'cells/s':>13}{'vs Eq.8+9':>10}{'vs Eq.8':>9}"
    )
    print("-" * 105)
    for name, n_cells, seconds in rows:
        rate = n_cells / seconds
        print(
            f"{name:<53}{n_cells:>12,}{seconds:>8.3f}{rate:>13,.0f}{rate / action_rate:>9.0f}x{rate / table_rate:>8.0f}x"
        )
    print("-" * 105)
    print(
        f"sample: {len(sample):,} pairs drawn from the corpus workloads ({len(action_sample):,} of them also on "
        f"actions); fast == reference on every one: identical scores and alignments"
    )
    print(
        "vs Eq.8+9: against soft_lcs_reference evaluating f (Eq. 9) on the actions in every cell; "
        "vs Eq.8: against the same pure-Python DP given f precomputed (a lookup per cell)"
    )


if __name__ == "__main__":
    main()
