"""Issue 41 item 2, measured: does within-task balancing with selection by the within-task AUC give a
reward model that ranks the agent's held-out episodes better than the former training (no
balancing, the lowest validation loss)? And (``--compare exploits``) does weighing the examples of
the agent's exploits (RL episodes a reward misranked, ``rm_examples.exploit``) twice help?

On a home whose reward-model data holds the agent's own episodes (after ``make demo``'s flywheel
round, or ``stepwise flywheel``), this trains one kind twice on the same examples, the same
steps and the same seed, once per setting, scores every held-out agent episode (greedy evaluation
episodes, never trained on: ``training.reward_models.agent_episodes``) with each, and prints the
pooled and the within-task AUC of each with seeded bootstrap intervals.

    .venv/bin/python scripts/rm_balancing_experiment.py --home .stepwise --kind orm --steps 400
    .venv/bin/python scripts/rm_balancing_experiment.py --home .stepwise --compare exploits --seeds 13,14,15
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

BALANCING = {
    "balanced, selected by within-task AUC (rm-train-3)": ["--balance_within_task", "true", "--select_by", "auto"],
    "balanced, selected by validation loss": ["--balance_within_task", "true", "--select_by", "loss"],
    "unbalanced, selected by within-task AUC": ["--balance_within_task", "false", "--select_by", "auto"],
    "unbalanced, selected by validation loss (rm-train-2)": ["--balance_within_task", "false", "--select_by", "loss"],
}
# both balanced and selected by the within-task AUC (the defaults); only the exploits' weight differs
EXPLOITS = {
    "exploits weigh 2 (rm-train-4's default)": ["--exploit_weight", "2"],
    "exploits weigh 1 (off)": ["--exploit_weight", "1"],
}
COMPARISONS = {"balancing": BALANCING, "exploits": EXPLOITS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", required=True, help="a STEPWISE_HOME with rm_examples and evaluation episodes")
    parser.add_argument("--kind", default="orm")
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps per model")
    parser.add_argument("--eval-steps", type=int, default=50, help="steps between evaluations (and checkpoints)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", default="13", help="comma-separated training seeds (each setting once per seed)")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="balancing", help="which settings to train")
    args = parser.parse_args(argv)
    settings = COMPARISONS[args.compare]

    from training.reward_models.agent_episodes import WITHIN_TASK, auc_rows, read_agent_episodes
    from training.reward_models.dataset import build_reward_model_dataset
    from training.reward_models.evaluate import predict_trajectories
    from training.reward_models.models import RewardScorer
    from training.reward_models.readers import read_trajectories
    from training.reward_models.train import parse_args, train_reward_model
    from warehouse.catalog import Warehouse

    warehouse = Warehouse(Path(args.home))
    # built now from the home's current split and labels (the agent's episodes included), as a
    # retraining would; not the rm_examples of the last reward_model_datasets run
    examples = build_reward_model_dataset(warehouse, args.kind).examples
    if not examples.num_rows:
        print(f"no rm_examples of kind {args.kind!r} in {args.home}", file=sys.stderr)
        return 2
    episodes = read_agent_episodes(warehouse)
    if not episodes:
        print(f"no held-out agent episodes in {args.home}", file=sys.stderr)
        return 2
    trajectories = read_trajectories(warehouse, [e.episode_id for e in episodes])
    ordered = [trajectories[e.episode_id] for e in episodes if e.episode_id in trajectories]
    mix = warehouse.query(
        "SELECT e.purpose, count(DISTINCT x.episode_id) AS n FROM (SELECT unnest(?) AS episode_id) x "
        "JOIN episodes e USING (episode_id) GROUP BY 1 ORDER BY 1",
        [examples.column("episode_id").to_pylist()],
    ).to_pylist()
    print(f"{args.kind} examples' episodes by purpose: " + ", ".join(f"{r['purpose']} {r['n']}" for r in mix))
    print(
        f"{args.kind}: {examples.num_rows} examples ({sum(bool(x) for x in examples.column('exploit').to_pylist())} "
        f"of the agent's exploits); {len(episodes)} held-out agent episodes of "
        f"{len({e.task_id for e in episodes})} tasks, {sum(e.success for e in episodes)} successes"
    )
    rows: list[tuple[str, int, dict, dict | None, dict | None]] = []
    with tempfile.TemporaryDirectory(prefix="rm-balancing-") as scratch:
        path = Path(scratch) / f"{args.kind}.parquet"
        pq.write_table(examples, path)
        for seed, (name, flags) in ((int(x), item) for x in args.seeds.split(",") for item in settings.items()):
            out = Path(scratch) / f"{seed}-{len(rows)}"
            argv_train = [
                "--kind", args.kind, "--examples", str(path), "--home", str(warehouse.home),
                "--output_dir", str(out / "trainer"), "--max_steps", str(args.steps),
                "--eval_strategy", "steps", "--eval_steps", str(args.eval_steps),
                "--save_steps", str(args.eval_steps), "--early_stopping_patience", "3",
                "--threads", str(args.threads), "--disable_tqdm", "true", "--logging_steps", "50",
                "--seed", str(seed), *flags,
            ]  # fmt: skip
            summary = train_reward_model(*parse_args(argv_train))
            scorer = RewardScorer.from_checkpoint(summary["export_dir"])
            scorer.load_home_cache(warehouse.home)
            scores = predict_trajectories(scorer, ordered)
            by_family = {r["family"]: r for r in auc_rows(name, args.kind, episodes, scores, None)}
            rows.append((name, seed, summary, by_family.get("all"), by_family.get(WITHIN_TASK)))
    print()
    print("| setting | seed | exported step | pooled AUC [95%] | within-task AUC [95%] |")
    print("|---|---:|---:|---|---|")
    for name, seed, summary, pooled, within in rows:
        cells = [
            "-" if r is None else f"{r['auc']:.3f} [{r['auc_low']:.3f}, {r['auc_high']:.3f}]" for r in (pooled, within)
        ]
        print(f"| {name} | {seed} | {summary['exported_step']} | {cells[0]} | {cells[1]} |")
    print()
    print("| setting | mean pooled AUC over seeds | mean within-task AUC over seeds |")
    print("|---|---:|---:|")
    for name in settings:
        mine = [(p["auc"], w["auc"]) for n, _, _, p, w in rows if n == name and p is not None and w is not None]
        if mine:
            pooled_mean = sum(a for a, _ in mine) / len(mine)
            within_mean = sum(b for _, b in mine) / len(mine)
            print(f"| {name} | {pooled_mean:.3f} | {within_mean:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
