"""Issue 41 item 4, measured: what common random numbers buy a paired comparison of two reward
sources.

Since rl-6 every source's acting policy draws from one stream per (RL seed, SFT policy, iteration,
instance) (``training.rl.runs.sampling_stream``); before, each run drew from its own. On a home
holding both kinds of run for the same two sources and RL seeds (``stepwise rl --runs A,B --seeds
5``, then the same with ``--per-run-sampling``), this prints, per keying:

* the first iteration's training success of each run (with a shared stream, every source acts
  with the SFT weights on the same draws there, so the rates must be equal);
* per RL seed, the held-out success difference B - A over the episodes the two runs share (same
  task and held-out seed), and its standard deviation over RL seeds: the spread a comparison over
  seeds sees;
* the discordant pairs (episodes one run solved and the other did not) and McNemar's exact p:
  the spread a comparison over episodes sees.

    .venv/bin/python scripts/common_random_numbers.py --home /path/to/home --sources outcome,outcome+progrm_env:decay
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", required=True, help="a STEPWISE_HOME with both kinds of run")
    parser.add_argument("--sources", default="outcome,outcome+progrm_env:decay", help="A,B: B - A is reported")
    parser.add_argument("--block", default="dense")  # runs of the newest SFT policy on this block
    args = parser.parse_args(argv)
    first, second = args.sources.split(",")

    from training.rl.runs import run_key_of_policy
    from warehouse.catalog import Warehouse
    from warehouse.statistics import mcnemar_exact_p

    warehouse = Warehouse(Path(args.home))
    sft = warehouse.query(
        "SELECT policy_id FROM policies WHERE kind = 'sft' ORDER BY created_at DESC LIMIT 1"
    ).to_pylist()[0]["policy_id"]
    runs = warehouse.query(
        "SELECT policy_id, reward_source, rl_seed, parameters FROM policies WHERE kind = 'rl' "
        "AND reward_source IN (?, ?) AND policy_id LIKE ?",
        [first, second, f"%-{sft}"],
    ).to_pylist()
    keying: dict[str, str] = {}
    for run in runs:
        settings = json.loads(run["parameters"] or "{}")
        if settings.get("block", "dense") != args.block or settings.get("estimator") != "reinforce_pp":
            continue
        keying[run["policy_id"]] = "shared stream" if settings.get("common_sampling", True) else "per run"
    if not keying:
        print(f"no {args.block} REINFORCE++ runs of {first} or {second} in {args.home}", file=sys.stderr)
        return 2
    episodes = warehouse.query(
        "SELECT e.policy_id, a.policy_label AS reward_source, a.rl_seed, e.task_id, e.seed, e.success "
        "FROM agent_eval_episodes e "
        "JOIN (SELECT DISTINCT policy_id, evaluation, policy_label, rl_seed FROM agent_eval) a "
        "USING (policy_id, evaluation) WHERE e.evaluation = 'held_out' AND e.policy_id IN (SELECT unnest(?))",
        [sorted(keying)],
    ).to_pylist()
    run_keys = {run_key_of_policy(pid, sft): pid for pid in keying}  # rl_iterations keeps the run key
    first_iteration = [
        row | {"policy_id": run_keys[row["run_key"]]}
        for row in warehouse.query(
            "SELECT run_key, reward_source, rl_seed, success_rate FROM rl_iterations "
            "WHERE iteration = 0 AND run_key IN (SELECT unnest(?)) ORDER BY rl_seed, reward_source",
            [sorted(run_keys)],
        ).to_pylist()
    ]

    # (keying, rl seed, source) -> {(task, seed): success}; the newest evaluation of a run wins
    outcomes: dict[tuple[str, int, str], dict[tuple[str, int], bool]] = defaultdict(dict)
    for row in episodes:
        key = (keying[row["policy_id"]], row["rl_seed"], row["reward_source"])
        outcomes[key][(row["task_id"], row["seed"])] = bool(row["success"])

    print(f"first iteration's training success (acting with the SFT weights), {first} / {second}:")
    by_run = {(keying[r["policy_id"]], r["rl_seed"], r["reward_source"]): r for r in first_iteration}
    for kind in ("shared stream", "per run"):
        cells = []
        for seed in sorted({s for k, s, _ in by_run if k == kind}):
            a, b = by_run.get((kind, seed, first)), by_run.get((kind, seed, second))
            if a and b:
                cells.append(f"s{seed} {a['success_rate']:.4f} / {b['success_rate']:.4f}")
        print(f"  {kind}: " + "; ".join(cells))

    print()
    print(f"| keying | RL seeds | {second} - {first} per seed (points) | SD over seeds | paired episodes | "
          f"only {second} / only {first} | discordant share | McNemar p |")  # fmt: skip
    print("|---|---:|---|---:|---:|---|---:|---:|")
    for kind in ("shared stream", "per run"):
        diffs, only_b, only_a, paired = [], 0, 0, 0
        for seed in sorted({s for k, s, _ in outcomes if k == kind}):
            a, b = outcomes.get((kind, seed, first), {}), outcomes.get((kind, seed, second), {})
            shared = sorted(set(a) & set(b))
            if not shared:
                continue
            paired += len(shared)
            only_b += sum(b[x] and not a[x] for x in shared)
            only_a += sum(a[x] and not b[x] for x in shared)
            diffs.append(100 * (sum(b[x] for x in shared) - sum(a[x] for x in shared)) / len(shared))
        if not diffs:
            continue
        sd = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
        p = mcnemar_exact_p(only_b, only_a)
        print(
            f"| {kind} | {len(diffs)} | {', '.join(f'{d:+.1f}' for d in diffs)} | {sd:.2f} | {paired} | "
            f"{only_b} / {only_a} | {(only_a + only_b) / paired:.3f} | {p:.3g} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
