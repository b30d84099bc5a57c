"""How often one fixed answer solves a task (envs.fixed_answer): measured before any RL run.

The scripted expert solves ``--sources`` instances of each task; each solution is then carried out
unchanged on ``--targets`` other instances (elements found by their description, typed text typed as
recorded). Per task it prints the best source's share of targets solved (the constant an RL run
could settle on: use-spinner's "click the arrow k times, Submit"), the mean over sources, and the
best answer. A sparse task on which a constant scores about as well as the policies it is meant to
separate measures constant answers, not learning (README, "Question M").

    .venv/bin/python scripts/constant_answers.py --tasks use-spinner,click-checkboxes-large

Seeds are ``--base-seed`` onward (sources first, then targets): outside the selection and held-out
ranges the SFT stage draws from. Nothing is written to the warehouse.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Instances no stage draws (SFT training, selection, held-out evaluation and policy rollouts take
#: their seeds from 1, 2, 3 and 4 million on: training.policy.store).
BASE_SEED = 7_000_000
#: Why a task without a scripted solution is not rated: the measurement's sources are the expert's
#: solutions. (Human demonstrations transplanted instead were tried on book-flight-nodelay and
#: search-engine: every attempt stopped at an element whose description carries the instance's own
#: text or a generated id, so they would rate any such task 0 for a reason that is not the task's.)
NO_SOLUTION = "no scripted solution in its spec: the expert has no source to solve"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", required=True, help="comma-separated catalog task ids")
    parser.add_argument("--sources", type=int, default=10, help="instances the expert solves, per task")
    parser.add_argument("--targets", type=int, default=40, help="instances each solution is tried on, per task")
    parser.add_argument("--base-seed", type=int, default=BASE_SEED)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write every attempt here (JSON lines)")
    parser.add_argument(
        "--write",
        action="store_true",
        help="record the rates in envs/task_specs/miniwob/constant_answers.json (what the sparse block's rule reads)",
    )
    args = parser.parse_args(argv)

    from envs.fixed_answer import CONSTANT_ANSWERS_FILE, constant_answer_rate, write_constant_answer_rates
    from envs.pool_jobs import plan_jobs
    from envs.task_catalog import load_catalog

    catalog = load_catalog()
    task_ids = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in task_ids if t not in catalog]
    if unknown:
        print(f"constant_answers: not in the task catalog: {', '.join(unknown)}", file=sys.stderr)
        return 2
    tasks = [catalog[t] for t in task_ids]
    source_seeds = range(args.base_seed, args.base_seed + args.sources)
    target_seeds = range(args.base_seed + args.sources, args.base_seed + args.sources + args.targets)
    # a task whose spec has no scripted solution cannot give the expert a source to solve
    unsolvable = {t.task_id for t in tasks if not t.has_solution}
    sources = plan_jobs(
        [t for t in tasks if t.task_id not in unsolvable], batch="constant-answer-sources", seeds=source_seeds
    )
    targets = plan_jobs(tasks, batch="constant-answer-targets", seeds=target_seeds)
    rows: list[dict[str, Any]] = []
    # no pool (no browser) where no task has a source to solve
    solved_sources, tried, source_of = _run_answers(sources, targets, args.workers) if sources else ([], [], {})
    solved: dict[str, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for record in tried:
        task_id, source_seed, instruction = source_of[record.episode_id]
        solved[task_id][source_seed].append(bool(record.success))
        rows.append(
            {"task_id": task_id, "source_seed": source_seed, "source_instruction": instruction}
            | {"target_seed": record.seed, "target_instruction": record.instruction, "success": bool(record.success)}
        )
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    today = datetime.now(UTC).date().isoformat()
    instruction_of = {(r["task_id"], r["source_seed"]): r["source_instruction"] for r in rows}
    measured: dict[str, dict[str, Any]] = {}
    print("\n| task | expert solved | targets per answer | best answer's share | mean share | best answer's instance |")
    print("|---|---:|---:|---:|---:|---|")
    for task in task_ids:
        solved_here = sum(r.success for r in solved_sources if r.task_id == task)
        rate = constant_answer_rate(solved.get(task, {}))
        common = {"sources": args.sources, "targets": args.targets, "base_seed": args.base_seed, "measured": today}
        if rate["best"] is None:
            why = NO_SOLUTION if task in unsolvable else f"the expert solved none of {args.sources} instances"
            tried_here = "-" if task in unsolvable else f"{solved_here} of {args.sources}"
            print(f"| {task} | {tried_here} | - | - | - | not measurable: {why} |")
            measured[task] = {"best": None, "why": why} | common
            continue
        shown = json.dumps(instruction_of[(task, rate["best_source"])])
        measured[task] = {"best": round(rate["best"], 4), "mean": round(rate["mean"], 4)} | common
        measured[task] |= {"best_instance": instruction_of[(task, rate["best_source"])]}
        print(
            f"| {task} | {solved_here} of {args.sources} | {rate['targets']} | {rate['best']:.1%} "
            f"| {rate['mean']:.1%} | {shown} |"
        )
    if args.write:
        print(f"\nrecorded in {write_constant_answer_rates(measured, CONSTANT_ANSWERS_FILE)}")
    return 0


def _run_answers(
    sources: list[Any], targets: list[Any], workers: int
) -> tuple[list[Any], list[Any], dict[str, tuple[str, int, str]]]:
    """The expert on the sources, then each solved source's answer on its task's targets: the source
    episodes, the target episodes, and per target episode its (task, source seed, source instruction)."""
    from assets.resources import EnvPoolResource
    from envs.fixed_answer import FixedAnswerPolicy, fixed_answer_batch
    from envs.policies import make_policy

    with EnvPoolResource().pool("miniwob", workers, log=print) as pool:
        ran = pool.run(sources, make_policy("expert"))
        for reason, times in Counter(a.reason for a in ran.attempts if a.status == "aborted" and a.final).items():
            # a source lost is not a source the expert failed: said, not hidden in "solved none"
            print(f"constant_answers: {times} source episode(s) aborted: {reason}", file=sys.stderr)
        by_id = {job.episode_id: job for job in sources}
        solved_pairs = [(by_id[r.episode_id], r) for r in ran.episodes if r.success]
        jobs, answers, sources_of = fixed_answer_batch(solved_pairs, targets)
        source_of = {
            job_id: (source.task.task_id, source.seed, record.instruction)
            for job_id, (source, record) in sources_of.items()
        }
        tried = pool.run(jobs, FixedAnswerPolicy(answers)).episodes if jobs else []
    return ran.episodes, tried, source_of


if __name__ == "__main__":
    raise SystemExit(main())
