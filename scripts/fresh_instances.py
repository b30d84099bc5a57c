"""Two rows of an RL comparison evaluated again on many fresh instances: is a lead the training
runs' or the held-out evaluation's luck, and did the runs learn the task or one constant answer?

A Table-1 row is evaluated on 25 held-out instances per task. On a task at 2-5% that is 0-2
successes per RL seed, too few to tell a run that learned something from one that did not. This
takes every run of two rows (``--runs outcome,outcome_kl_apart``: run names as ``stepwise rl
--runs`` spells them) of one SFT policy and block, the runs the report reads
(:func:`training.rl.evaluation.reported_runs`: the newest per RL seed, of today's reward models
unless ``--model-tag`` names another), loads each run's final policy and evaluates it
greedily on ``--instances`` fresh instances per task, the same for every run, drawn from the
held-out seed range with a salt of their own, the runs' own held-out instances left out. Nothing is
written to the warehouse. It prints:

* each run's successes per task and RL seed (the report's per-seed table), and the paired test of
  the second row against the first: McNemar over the paired episodes, the difference with its 95%
  interval over RL seeds and the RL seeds higher / lower with the exact sign test;
* per run and task how its successes spread over the instances' instructions: a run that learned
  one constant answer solves only the instances asking for it (all its successes share one
  instruction), where a policy that reads the instruction spreads.

    STEPWISE_HOME=/path/to/home .venv/bin/python scripts/fresh_instances.py \\
        --runs outcome,outcome_kl_apart --block sparse --instances 200

Measured with it (README, "Question H"): use-spinner, stop 68's fourth SFT policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def fresh_seeds(count: int, salt: str, used: Sequence[int]) -> list[int]:
    """``count`` seeds of the held-out range fixed by ``salt``, none of ``used``."""
    from training.policy.evaluation import sample_seeds
    from training.policy.store import HELD_OUT_SEED_BASE

    drawn = sample_seeds(HELD_OUT_SEED_BASE, count + len(used), salt)
    left_out = set(used)
    seeds = [s for s in drawn if s not in left_out][:count]
    if len(seeds) < count:
        raise ValueError(f"the salt {salt!r} left fewer than {count} fresh seeds")
    return seeds


def comparison_text(label_a: str, label_b: str, block: str, episodes: Sequence[Mapping[str, Any]]) -> str:
    """The printout (pure): per-seed tables, the paired test of ``label_b`` against ``label_a`` and
    the success spread; ``episodes`` carry run, rl_seed, task_id, seed, instruction and success."""
    from training.rl.pairing import comparison_lines, paired_rows
    from training.rl.task_breakdown import per_seed_lines, per_seed_task_successes, success_spread

    rows, outcomes = [], {}
    for label in (label_a, label_b):
        mine = [e for e in episodes if e["run"] == label]
        per_seed = per_seed_task_successes((e["rl_seed"], [e]) for e in mine)
        rows.append({"actor": label, "block": block, "seed_task_successes": per_seed})
        outcomes[label] = {(e["task_id"], e["seed"], e["rl_seed"]): bool(e["success"]) for e in mine}
    lines = per_seed_lines(rows)
    lines += comparison_lines(
        [{"actor": label_b, "versus": label_a} | paired_rows(outcomes[label_b], outcomes[label_a])]
    )
    lines += ["", "| run | RL seed | task | successes | distinct instructions among them | most common (share) |"]
    lines.append("|---|---:|---|---:|---:|---|")
    for label in (label_a, label_b):
        for rl_seed in sorted({e["rl_seed"] for e in episodes if e["run"] == label}):
            mine = [e for e in episodes if e["run"] == label and e["rl_seed"] == rl_seed]
            for task, s in success_spread(mine).items():
                lines.append(
                    f"| {label} | s{rl_seed} | {task} | {s['successes']} | {s['instructions']} | "
                    f"{s['most_common']} ({100 * s['top_share']:.0f}%) |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="outcome,outcome_kl_apart", help="A,B: run names; B is tested against A")
    parser.add_argument("--block", default="sparse", help="the runs' block (dense or sparse)")
    parser.add_argument("--sft", default=None, help="the SFT policy the runs started from (default: the newest)")
    parser.add_argument(
        "--model-tag",
        default=None,
        help="the runs' reward-model tag as the report names it ('flywheel r1', 'model <id>'; default: today's models)",
    )
    parser.add_argument("--tasks", default=None, help="comma-separated tasks (default: every task of the block)")
    parser.add_argument("--instances", type=int, default=200, help="fresh instances per task")
    parser.add_argument("--salt", default="fresh-instances", help="which fresh instances (a seed stream's name)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write every episode here (JSON lines)")
    args = parser.parse_args(argv)

    from assets.resources import EnvPoolResource
    from envs.task_catalog import load_catalog
    from training.policy.episodes import evaluate_policy
    from training.policy.learned import PolicyModel
    from training.policy.store import PolicyNotFoundError, latest_sft_policy, warm_policy_cache
    from training.rl.evaluation import reported_runs
    from training.rl.runs import RUN_VARIANTS
    from warehouse.catalog import Warehouse

    labels = [r.strip() for r in args.runs.split(",") if r.strip()]
    if len(labels) != 2 or any(label not in RUN_VARIANTS for label in labels):
        print(f"--runs takes two run names of {sorted(RUN_VARIANTS)}, got {args.runs!r}", file=sys.stderr)
        return 2
    warehouse = Warehouse()
    home = warehouse.home
    try:
        sft = latest_sft_policy(warehouse, args.sft)["policy_id"]
    except PolicyNotFoundError as exc:
        print(f"fresh_instances: {exc}", file=sys.stderr)
        return 2
    reported, _ = reported_runs(warehouse, sft)  # the runs the report reads: the newest per seed and row
    runs = []
    for label in labels:
        source, estimator = RUN_VARIANTS[label]
        mine = [
            r
            for r in reported
            if (r["reward_source"], r["estimator"], r["block"], r["reward_model_tag"])
            == (source, estimator, args.block, args.model_tag)
        ]
        if not mine:
            tag = f" with reward-model tag {args.model_tag!r}" if args.model_tag else ""
            print(f"no {args.block} runs of {label}{tag} from {sft} in {home}", file=sys.stderr)
            return 2
        if len({r["orm_rule"] for r in mine}) > 1:
            print(f"{label}: runs of several ORM rules; not one row", file=sys.stderr)
            return 2
        stored = warehouse.query(
            "SELECT policy_id, checkpoint_path, tasks FROM policies WHERE list_contains(?, policy_id)",
            [[r["policy_id"] for r in mine]],
        ).to_pylist()
        by_id = {r["policy_id"]: r for r in stored}
        runs += [(label, r["rl_seed"], by_id[r["policy_id"]]) for r in sorted(mine, key=lambda r: r["rl_seed"])]
    catalog = load_catalog()
    task_ids = args.tasks.split(",") if args.tasks else sorted({t for _, _, r in runs for t in r["tasks"]})
    evaluated = warehouse.query(  # the instances the runs were evaluated on, whatever their number
        "SELECT DISTINCT seed FROM agent_eval_episodes WHERE evaluation = 'held_out' AND list_contains(?, policy_id)",
        [[r["policy_id"] for _, _, r in runs]],
    ).to_pylist()
    seeds = fresh_seeds(args.instances, args.salt, sorted(int(r["seed"]) for r in evaluated))
    episodes: list[dict[str, Any]] = []
    with EnvPoolResource().pool("miniwob", args.workers, log=print) as pool:
        for label, rl_seed, run in runs:
            model = PolicyModel.load(warehouse.resolve(run["checkpoint_path"]))
            warm_policy_cache(model, home)
            result, _ = evaluate_policy(
                model, run["policy_id"], [catalog[t] for t in task_ids], seeds, pool, evaluation=args.salt, log=print
            )
            for record in result.episodes:
                episodes.append(
                    {"run": label, "rl_seed": rl_seed, "policy_id": run["policy_id"], "task_id": record.task_id}
                    | {"seed": record.seed, "instruction": record.instruction, "success": bool(record.success)}
                )
    if args.out:
        args.out.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    print(f"\n{sft}, {args.block} block, {args.instances} fresh instances per task (salt {args.salt!r})")
    print(comparison_text(labels[0], labels[1], args.block, episodes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
