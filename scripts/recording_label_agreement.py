"""Issue 42 item 2, checked: how well labels from the recording stand in for labels by replay.

Where no replay reproduces a state, ``step_alternatives`` labels its candidates from the recording
(``training.flywheel.alternative_labels``). This measures that rule where both kinds of label can
exist: on two copies of a home it runs the same alternatives request (same seeded states, same
proposer, so the same candidates), once with replays only (``recording_labels: never``) and once
from the recording only (``always``), then compares the PRM's verdict of every candidate both
labelled: the replay's (Math-Shepherd's hard estimate over the continuations) against the
recording's (``recording_verdict``). It prints the confusion table, the agreement where the
recording decides (unsure left out), and the same for the recorded actions and the other
candidates apart, per task. The home is not changed.

    .venv/bin/python scripts/recording_label_agreement.py --home .stepwise --family miniwob-forms --round 1
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _labels(home: Path, request, workers: int) -> dict[str, dict]:  # noqa: ANN001 - AlternativesRequest
    from envs.miniwob.live import MiniWoBConfig
    from envs.pool_jobs import PoolConfig
    from envs.ray_pool import make_pool
    from training.flywheel.alternatives import run_alternatives
    from training.reward_models.readers import alternative_label
    from warehouse.catalog import Warehouse

    warehouse = Warehouse(home)
    run_alternatives(
        warehouse,
        request,
        lambda n: make_pool(MiniWoBConfig(), PoolConfig(workers=n, spares=0)),
        run_id=f"agreement-{request.recording_labels}",
        partition_key=None,
        log=lambda message: print(f"  [{request.recording_labels}] {message}", flush=True),
    )
    rows = warehouse.query(
        "SELECT * FROM step_alternatives WHERE run_id = ?", [f"agreement-{request.recording_labels}"]
    ).to_pylist()
    return {
        r["alternative_id"]: {
            "verdict": alternative_label(r).verdict(),
            "task": r["task_id"],
            "recorded": r["is_recorded"],
        }
        for r in rows
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--family", required=True)
    parser.add_argument("--policy", default="sft")
    parser.add_argument("--round", type=int, default=1)
    parser.add_argument("--sources", default="policy_rollout,exploration")
    parser.add_argument("--states-per-task", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--continuations", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    from training.flywheel.alternatives import AlternativesRequest

    labels = {}
    with tempfile.TemporaryDirectory(prefix="stepwise-agreement-") as scratch:
        for how in ("never", "always"):
            copy = Path(scratch) / how
            shutil.copytree(args.home, copy, ignore=shutil.ignore_patterns("dagster"))
            request = AlternativesRequest(
                args.policy,
                args.family,
                round=args.round,
                states_per_task=args.states_per_task,
                top_k=args.top_k,
                continuations=args.continuations,
                sources=tuple(args.sources.split(",")),
                workers=args.workers,
                recording_labels=how,  # type: ignore[arg-type]
            )
            labels[how] = _labels(copy, request, args.workers)

    both = sorted(set(labels["never"]) & set(labels["always"]))
    print(
        f"\n{len(labels['always'])} candidates labelled from the recording, {len(labels['never'])} by replay, "
        f"{len(both)} by both"
    )
    table: Counter = Counter()
    by_group: dict[str, Counter] = defaultdict(Counter)
    for alternative_id in both:
        replay, recording = labels["never"][alternative_id], labels["always"][alternative_id]
        pair = (replay["verdict"], recording["verdict"])
        table[pair] += 1
        by_group["recorded action" if replay["recorded"] else "other candidates"][pair] += 1
        by_group[f"task {replay['task']}"][pair] += 1
    verdicts = ("positive", "negative", "unsure")
    print("\nreplay (rows) x recording (columns):")
    print(f"{'':>10} " + " ".join(f"{v:>9}" for v in verdicts))
    for v in verdicts:
        print(f"{v:>10} " + " ".join(f"{table[(v, w)]:>9}" for w in verdicts))
    print("\nwhere both decide (neither unsure): agreement, and the recording's coverage of the replay's decisions")
    for name, counts in [("all", table), *sorted(by_group.items())]:
        decided = {p: n for p, n in counts.items() if "unsure" not in p}
        total = sum(decided.values())
        agree = sum(n for (a, b), n in decided.items() if a == b)
        replay_decided = sum(n for (a, _), n in counts.items() if a != "unsure")
        print(
            f"  {name:<40} {agree:>4} / {total:<4} agree ({100 * agree / total if total else float('nan'):5.1f}%); "
            f"the recording decides {total} of the replay's {replay_decided}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
