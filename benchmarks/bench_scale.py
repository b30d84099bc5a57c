"""Benchmark of labelling at scale: today's code (a git worktree of a baseline commit) next to this one.

Two parts, in one run:

1. **Grouping on the real tasks.** For every real MiniWoB++ task of the imported
   demonstrations, in both LCS modes (paper: Eq. 3 with min length; improved: cleaned and
   rewritten trajectories, mean length, INPUT target must match), the Eq. (3) groups of the
   exact all-pairs grouping (:func:`annotation.progress.recipes.group_by_similarity` on the full matrix)
   are compared with those of :mod:`annotation.progress.grouping` (deduplicated classes, rapidfuzz
   hard-LCS upper bound as prefilter), the prefilter forced on for every task. Printed: tasks
   with identical groups, Eq. (3) pairs, and the soft DPs each way ran.
2. **Scaling.** Corpora derived from the real demonstrations (:class:`_corpus.ScaledCorpus`:
   ``--tasks`` tasks, ~18 trajectories each as in ProgRM App. C, times ``copies`` perturbed
   copies per task whose instance words are renamed) are written task by task to pickles. Each
   is labelled in a fresh subprocess (so peak RSS is the run's own) by
   * **old**: the baseline's ``annotation.progress.labeling.lcs_labels`` on the whole corpus in memory
     (what ``run_labeling`` did), paper and improved modes;
   * **new**: :func:`annotation.progress.label_stream.stream_labels`, task batch by task batch (tasks read
     one pickle at a time, at most ``--batch`` episodes a batch), both modes.
   Both use the hashing text embedder (``--embedder minilm`` for the real one; embedding costs
   the same either way and is not what scales badly). Printed per size: CPU seconds, wall
   seconds, peak RSS, and whether the label rows are identical (a digest of every row); then
   the growth exponent of CPU time in the number of trajectories (least squares on log-log).
   ``--new-only-copies`` adds sizes run with the new code only (too big for the old code).

    .venv/bin/python benchmarks/bench_scale.py --baseline /tmp/scale_base --home /tmp/stepwise_baseline_home
    .venv/bin/python benchmarks/bench_scale.py ... --tasks 20 --copies 1 4 16 64 --new-only-copies 128
    .venv/bin/python benchmarks/bench_scale.py --smoke   # 4 tasks, copies 1 and 2; this checkout on both sides

The baseline is a worktree of the commit to compare with (``git worktree add /tmp/scale_base
<commit> --detach``); ``--smoke`` (the test suite) compares this checkout with itself on a few
recordings of four tasks imported into a temporary home. Times are CPU of the subprocess
(``time.process_time``, steadier than wall on a shared machine) and wall; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# -- the subprocess: label one corpus with whichever code is first on sys.path ----------------------

_WORKER = r"""
import hashlib, json, os, pickle, sys, time
from pathlib import Path
folder, which, embedder, batch = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
check = sys.argv[5] == "1"
def peak_gb():  # this process's own high-water mark (ru_maxrss would include the parent's, inherited at fork)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("nan")
from annotation.progress.text_similarity import HashingTextEmbedder, TextEmbedder
embed = HashingTextEmbedder() if embedder == "hashing" else TextEmbedder()
files = sorted(folder.glob("task-*.pickle"))
class Digest:  # order-independent: the sum of the rows' SHA-256 prefixes, so rows need not be kept
    def __init__(self):
        self.total = 0
    def add(self, rows):
        for r in rows:
            ratio = None if r["completion_ratio"] is None else round(r["completion_ratio"], 9)
            key = (r["episode_id"], r["step_idx"], r["method"], round(r["progress"], 9), r["is_key_step"])
            value = hashlib.sha256(repr(key + (r["recipe_id"], ratio)).encode()).digest()[:8]
            self.total = (self.total + int.from_bytes(value, "big")) % (1 << 64)
    def hexdigest(self):
        return f"{self.total:016x}"
digest = Digest()
hashing = 0.0  # CPU spent on the digest, not counted
def check_rows(rows):
    global hashing
    if check:
        start = time.process_time()
        digest.add(rows)
        hashing += time.process_time() - start
wall, cpu = time.perf_counter(), time.process_time()
n_rows = 0
if which == "old":
    from annotation.progress.labeling import lcs_labels
    trajectories = [t for f in files for t in pickle.loads(f.read_bytes())]
    for method in ("paper", "improved"):
        rows = lcs_labels(trajectories, embed, method).label_rows  # held whole, as the old run_labeling did
        n_rows += len(rows)
        check_rows(rows)
        del rows
else:
    from annotation.progress.label_stream import stream_labels
    def batches():
        batch_list = []
        for f in files:
            task = pickle.loads(f.read_bytes())
            if batch_list and len(batch_list) + len(task) > batch:
                yield batch_list
                batch_list = []
            batch_list.extend(task)
        if batch_list:
            yield batch_list
    for result in stream_labels(batches(), embed, None, embed_scope="batch"):
        for run in result.lcs.values():
            n_rows += len(run.labels)  # a real run writes them out as they come (annotation.progress.label_runs)
            if check:
                check_rows(run.label_rows)
print(json.dumps({"cpu": time.process_time() - cpu - hashing, "wall": time.perf_counter() - wall - hashing,
                  "rss_gb": peak_gb(), "rows": n_rows, "digest": digest.hexdigest() if check else None}))
"""


_MILLION_WORKER = r"""
import json, sys, time
from pathlib import Path
root, home, n_tasks, copies, batch, out = sys.argv[1:7]
n_tasks, copies, batch = int(n_tasks), int(copies), int(batch)
sys.path.insert(0, root + "/benchmarks")
def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("nan")
import pyarrow.parquet as pq
from _corpus import ScaledCorpus, ScaledCorpusSpec, load_real_trajectories
from annotation.progress.label_stream import stream_labels
from annotation.progress.text_similarity import HashingTextEmbedder
from warehouse.schema import PROGRESS_LABELS
real, _ = load_real_trajectories(Path(home), log=lambda m: None)
corpus = ScaledCorpus(real, ScaledCorpusSpec(n_tasks=n_tasks, copies=copies))
floor = status("VmRSS")
acc = {"gen_cpu": 0.0, "trajectories": 0, "steps": 0, "largest_task": 0}
def batches():
    pending = []
    for i in range(n_tasks):
        c = time.process_time()
        task = corpus.task(i)
        acc["gen_cpu"] += time.process_time() - c
        acc["largest_task"] = max(acc["largest_task"], len(task))
        if pending and len(pending) + len(task) > batch:
            yield pending
            pending = []
        pending.extend(task)
    if pending:
        yield pending
wall, cpu = time.perf_counter(), time.process_time()
writer = pq.ParquetWriter(out, PROGRESS_LABELS, compression="zstd")
rows = pairs_total = pairs_scored = recipes = 0
next_report = 100_000
for result in stream_labels(batches(), HashingTextEmbedder(), None, embed_scope="batch"):
    acc["trajectories"] += result.episodes
    for run in result.lcs.values():
        if len(run.labels):
            writer.write_table(run.labels.to_arrow(PROGRESS_LABELS).cast(PROGRESS_LABELS))
        rows += len(run.labels)
        for library in run.recipes.values():
            pairs_total += library.pairs_total
            pairs_scored += library.pairs_scored
            recipes += len(library.recipes)
    if acc["trajectories"] >= next_report:
        next_report += 100_000
        print(json.dumps({"progress": acc["trajectories"], "wall": time.perf_counter() - wall,
                          "rss_gb": status("VmRSS"), "peak_gb": status("VmHWM")}), flush=True)
writer.close()
total_cpu = time.process_time() - cpu
print(json.dumps({"trajectories": acc["trajectories"], "rows": rows, "recipes": recipes,
                  "largest_task": acc["largest_task"], "pairs_total": pairs_total, "pairs_scored": pairs_scored,
                  "cpu": total_cpu, "label_cpu": total_cpu - acc["gen_cpu"], "gen_cpu": acc["gen_cpu"],
                  "wall": time.perf_counter() - wall, "floor_gb": floor, "peak_gb": status("VmHWM")}), flush=True)
"""


def run_million(home: Path, n_tasks: int, copies: int, batch: int, work: Path) -> None:
    """The new code only, on a corpus generated task by task inside the labelling process."""
    out = work / f"million-{n_tasks}x{copies}.parquet"
    print(f"\n== 1M trajectories: {n_tasks:,} tasks x {copies} copies (new code, streamed, hashing embedder) ==")
    proc = subprocess.Popen(
        [sys.executable, "-c", _MILLION_WORKER, str(ROOT), str(home), str(n_tasks), str(copies), str(batch), str(out)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line.rstrip(), flush=True)
    proc.wait()
    out.unlink(missing_ok=True)


def run_worker(folder: Path, which: str, pythonpath: Path, embedder: str, batch: int, digest: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, str(folder), which, embedder, str(batch), "1" if digest else "0"],
        cwd=pythonpath,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"rc {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- part 1: grouping on the real tasks ----------------------------------------------------------------


def grouping_agreement(trajectories, embed) -> None:
    import annotation.progress.grouping as grouping
    from annotation.progress.grouping import TaskSequences, deduplicate, greedy_groups, similarity_graphs
    from annotation.progress.labeling import prepare_lcs
    from annotation.progress.recipes import _similarity_matrices, group_by_similarity
    from annotation.progress.soft_lcs import SequenceStore, build_match_table, is_symmetric

    grouping.PREFILTER_MIN_CLASSES = 0  # the prefilter on every task, however small
    print("\n== Eq. (3) grouping on the real tasks: exact all pairs vs deduplicated + prefiltered ==")
    print(
        f"{'mode':9} {'tasks':>5} {'same groups':>11} {'successes':>9} {'pairs':>10} {'DPs exact':>10} "
        f"{'DPs new':>9} {'exact s':>8} {'new s':>7}"
    )
    for method, norm, must_match in (("paper", "min", False), ("improved", "mean", True)):
        prepared = prepare_lcs(trajectories, method)
        same = tasks = successes = pairs = scored = 0
        t_exact = t_new = 0.0
        differing = []
        for task, episodes in sorted(prepared.episodes_by_task.items()):
            wins = [e.actions for e in episodes if e.success]
            if len(wins) < 2:
                continue
            table = build_match_table(wins, embed, mode="soft", input_target_must_match=must_match)
            codes = [table.encode(a) for a in wins]
            start = time.process_time()
            exact = group_by_similarity(_similarity_matrices([codes], [table.scores], norm)[0], 0.6)
            t_exact += time.process_time() - start
            start = time.process_time()
            if is_symmetric(table.scores):
                class_of, distinct, counts = deduplicate(codes)
            else:
                class_of, distinct, counts = np.arange(len(codes)), codes, np.ones(len(codes), dtype=np.int64)
            sequences = TaskSequences(class_of, counts, SequenceStore.from_sequences(distinct), table.scores, table)
            graph = similarity_graphs([sequences], 0.6, norm, prefilter=True)[0]
            new = greedy_groups(graph)
            t_new += time.process_time() - start
            tasks += 1
            successes += len(wins)
            pairs += len(wins) * (len(wins) - 1) // 2
            scored += graph.pairs_scored
            if new == exact:
                same += 1
            else:
                differing.append(task)
        print(
            f"{method:9} {tasks:5d} {same:11d} {successes:9,d} {pairs:10,d} {pairs:10,d} {scored:9,d} "
            f"{t_exact:8.2f} {t_new:7.2f}"
        )
        if differing:
            print(f"  tasks whose groups differ: {differing}")


# -- part 3: incremental labels ------------------------------------------------------------------------


def incremental(real, n_tasks: int, copies_list: list[int], batch: int) -> None:
    """A batch of new trajectories (one more perturbed copy of every base trajectory: ~18 per task)
    labelled against the recipe libraries of corpora of growing size, without rebuilding them."""
    from _corpus import ScaledCorpus, ScaledCorpusSpec

    from annotation.progress.label_state import label_against_library, library_states
    from annotation.progress.label_stream import stream_labels
    from annotation.progress.text_similarity import HashingTextEmbedder
    from warehouse.trajectories import task_batches

    print(f"\n== Incremental: a batch of new trajectories labelled against the stored libraries ({n_tasks} tasks) ==")
    print(f"{'copies':>6} {'corpus':>8} {'full run CPU s':>14} | {'new batch':>9} {'incremental CPU s':>17}")
    for copies in copies_list:
        with_new = ScaledCorpus(real, ScaledCorpusSpec(n_tasks=n_tasks, copies=copies + 1))
        corpus: list = []
        new: list = []
        for task in with_new:
            for t in task:
                (new if t.episode_id.endswith(f":{copies:04d}") else corpus).append(t)
        embed = HashingTextEmbedder()
        start = time.process_time()
        states: dict[str, dict] = {"paper": {}, "improved": {}}
        for result in stream_labels(task_batches(corpus, batch), embed, None, embed_scope="batch"):
            for method, run in result.lcs.items():
                states[method].update({s.task_id: s for s in library_states(run, result.prepared[method])})
        full = time.process_time() - start
        start = time.process_time()
        rows = 0
        for method in ("paper", "improved"):
            rows += len(label_against_library(new, states[method], embed, method).labels)
        print(f"{copies:6d} {len(corpus):8,d} {full:14.1f} | {len(new):9,d} {time.process_time() - start:17.2f}")


# -- part 2: scaling -------------------------------------------------------------------------------------


def write_corpus(real, n_tasks: int, copies: int, folder: Path) -> int:
    from _corpus import ScaledCorpus, ScaledCorpusSpec

    corpus = ScaledCorpus(real, ScaledCorpusSpec(n_tasks=n_tasks, copies=copies))
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for i, task in enumerate(corpus):
        (folder / f"task-{i:06d}.pickle").write_bytes(pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL))
        n += len(task)
    return n


def exponent(ns: list[int], cpus: list[float]) -> float:
    if len(ns) < 2:
        return math.nan
    slope, _ = np.polyfit(np.log(ns), np.log(cpus), 1)
    return float(slope)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="worktree of the commit to compare with (required)")
    parser.add_argument("--home", type=Path, help="a STEPWISE_HOME with the imported demonstrations (required)")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--copies", type=int, nargs="*", default=[1, 4, 16, 64])
    parser.add_argument("--new-only-copies", type=int, nargs="*", default=[])
    parser.add_argument("--batch", type=int, default=4000, help="episodes per streamed batch (whole tasks)")
    parser.add_argument("--embedder", default="hashing", choices=["hashing", "minilm"])
    parser.add_argument("--skip-grouping", action="store_true")
    parser.add_argument("--incremental-copies", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument("--work", type=Path, default=None, help="folder for the corpora (default: a temp folder)")
    parser.add_argument(
        "--million",
        nargs=2,
        type=int,
        metavar=("TASKS", "COPIES"),
        help="only label a corpus of TASKS x COPIES (x ~18 trajectories) with the new code, e.g. 57700 1 "
        "(100x the ProgRM tasks) or 577 100 (100x per task)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a few recordings of four tasks in a temporary home, 4 tasks, copies 1 2, this checkout as the baseline",
    )
    args = parser.parse_args()
    from _corpus import DEMOS_DIR, load_real_trajectories

    demos = DEMOS_DIR
    if args.smoke:
        from _smoke import small_demos, smoke_root

        root = smoke_root("scale")
        demos = small_demos(root / "demos")
        args.home, args.work = args.home or root / "home", args.work or root / "work"
        args.baseline = args.baseline or ROOT
        args.tasks, args.copies, args.new_only_copies, args.incremental_copies = 4, [1, 2], [], [1]
    if args.home is None or (args.baseline is None and not args.million):
        parser.error("--home and --baseline are required (or --smoke)")
    if args.million:
        run_million(args.home, args.million[0], args.million[1], args.batch, args.work or Path(tempfile.mkdtemp()))
        return 0

    from annotation.progress.text_similarity import HashingTextEmbedder, TextEmbedder

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; baseline {args.baseline}")
    start = time.perf_counter()
    real, where = load_real_trajectories(args.home, demos)
    print(f"{len(real):,} real demonstrations from {where} in {time.perf_counter() - start:.0f} s")
    if not args.skip_grouping:
        grouping_agreement(real, HashingTextEmbedder() if args.embedder == "hashing" else TextEmbedder())

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    print(
        f"\n== Scaling: {args.tasks} tasks, copies per task {args.copies} (+ new only: {args.new_only_copies}), "
        f"{args.embedder} embedder, both LCS modes =="
    )
    print(
        f"{'copies':>6} {'trajectories':>12} | {'old CPU s':>9} {'wall s':>7} {'RSS GB':>6} | "
        f"{'new CPU s':>9} {'wall s':>7} {'RSS GB':>6} | {'rows':>9} same"
    )
    results: dict[str, list[tuple[int, float]]] = {"old": [], "new": []}
    failed: list[str] = []  # sizes with an error or different labels (a smoke run fails on them)
    for copies in sorted(set(args.copies) | set(args.new_only_copies)):
        folder = work / f"c{copies}"
        n = write_corpus(real, args.tasks, copies, folder)
        old = run_worker(folder, "old", args.baseline, args.embedder, args.batch, True) if copies in args.copies else {}
        new = run_worker(folder, "new", ROOT, args.embedder, args.batch, copies in args.copies)
        for which, r in (("old", old), ("new", new)):
            if "cpu" in r:
                results[which].append((n, r["cpu"]))
        same = "yes" if old.get("digest") and old.get("digest") == new.get("digest") else ("-" if not old else "NO")

        def cells(r: dict) -> str:
            if "error" in r:
                return f"{'error':>9} {r['error'][:16]:>14}"
            if not r:
                return f"{'-':>9} {'-':>7} {'-':>6}"
            return f"{r['cpu']:9.1f} {r['wall']:7.1f} {r['rss_gb']:6.2f}"

        print(f"{copies:6d} {n:12,d} | {cells(old)} | {cells(new)} | {new.get('rows', 0):9,d} {same}", flush=True)
        if "error" in old or "error" in new or same == "NO":
            failed.append(f"copies {copies}: {old.get('error') or new.get('error') or 'labels differ'}")
        for f in folder.glob("*.pickle"):
            f.unlink()
    for which in ("old", "new"):
        ns = [n for n, _ in results[which]]
        cpus = [c for _, c in results[which]]
        print(f"growth exponent of CPU time in trajectories, {which}: {exponent(ns, cpus):.2f} (sizes {ns})")
    if args.incremental_copies:
        incremental(real, args.tasks, args.incremental_copies, args.batch)
    print(
        "same: the label rows of both runs have the same digest (an order-independent sum of SHA-256 over every "
        "row, floats rounded to 1e-9; its CPU is not counted)"
    )
    if args.smoke and failed:
        print(f"smoke run failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
