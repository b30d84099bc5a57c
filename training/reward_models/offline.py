"""Score reward models away from the warehouse: on a GPU machine that has only the repository.

The report (``training.reward_models.evaluate.run_report``) reads the warehouse and scores every
model in one process. A model trained on a rented GPU (ProgRM Table 5's setting: a fine-tuned LLM)
is too large to copy back to the machine that holds the warehouse, and the GPU machine has no
warehouse. So the work is split at the scores, which are small:

1. here: ``export`` writes the held-out trajectories of the report's splits (exactly the set the
   report reads, ``load_evaluation_set``) to one gzipped JSON-lines file per split;
2. there: ``score`` loads a trained checkpoint, times single-state calls as the report does, scores
   every trajectory in batches and writes ``{episode_id: [score per step]}`` with the timings;
3. here: ``report`` computes the report's metrics from those scores with the report's own functions
   (success judgement at the threshold chosen on the threshold split, key-step progress errors,
   step judgement, McNemar against a registered ORM scored here on the same trajectories).

    python -m training.reward_models.offline export --home .stepwise --out evalsets/
    python -m training.reward_models.offline score --checkpoint run/final --trajectories evalsets/ --out scores.json
    python -m training.reward_models.offline report --home .stepwise --scores scores.json --trajectories evalsets/

Files are written to a temporary name and renamed; a file that does not parse is one error naming
the file and line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from training.base.states import TextStep, TextTrajectory
from warehouse.storage import write_atomic

SPLIT_FILE = "{split}.jsonl.gz"
SCORES_FORMAT = "stepwise-rm-scores-1"


class OfflineFileError(ValueError):
    """A trajectories or scores file that cannot be used; the message names the file (and line)."""


def trajectory_to_dict(t: TextTrajectory) -> dict[str, Any]:
    return {
        "episode_id": t.episode_id,
        "task_id": t.task_id,
        "instruction": t.instruction,
        "success": t.success,
        "steps": [{"screen_lines": list(s.screen_lines), "action": s.action} for s in t.steps],
        "final_screen_lines": list(t.final_screen_lines) if t.final_screen_lines is not None else None,
    }


def trajectory_from_dict(d: Mapping[str, Any]) -> TextTrajectory:
    final = d.get("final_screen_lines")
    return TextTrajectory(
        episode_id=str(d["episode_id"]),
        task_id=str(d["task_id"]),
        instruction=str(d["instruction"]),
        steps=tuple(TextStep(tuple(s["screen_lines"]), str(s["action"])) for s in d["steps"]),
        success=d.get("success"),
        final_screen_lines=tuple(final) if final is not None else None,
    )


def write_trajectories(trajectories: Sequence[TextTrajectory], path: Path) -> None:
    """One JSON object per trajectory, gzipped (screens are repetitive text: ~10x smaller)."""
    lines = "".join(json.dumps(trajectory_to_dict(t)) + "\n" for t in trajectories)
    write_atomic(path, gzip.compress(lines.encode(), compresslevel=6, mtime=0))


def read_trajectories_file(path: Path) -> list[TextTrajectory]:
    try:
        text = gzip.decompress(path.read_bytes()).decode()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise OfflineFileError(f"{path}: not a gzipped trajectories file ({exc})") from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            out.append(trajectory_from_dict(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise OfflineFileError(f"{path}, line {number}: not a trajectory ({type(exc).__name__}: {exc})") from None
    return out


def export_evaluation_sets(
    warehouse, folder: Path, splits: Sequence[str] = ("test", "validation"), max_trajectories: int | None = None
) -> dict[str, int]:
    """Write each split's report trajectories to ``folder/<split>.jsonl.gz``; split -> count."""
    from training.reward_models.evaluate import load_evaluation_set

    counts = {}
    for split in splits:
        evaluation = load_evaluation_set(warehouse, split, max_trajectories=max_trajectories)
        write_trajectories(evaluation.trajectories, folder / SPLIT_FILE.format(split=split))
        counts[split] = len(evaluation.trajectories)
    return counts


def score_trajectories_files(
    checkpoint: Path, folder: Path, out: Path, *, device: str | None = None, latency_calls: int = 100
) -> dict[str, Any]:
    """Score every split file in ``folder`` with the checkpoint; write and return the scores file's
    content: format, checkpoint, kind, device, latency (the report's single-state timing) and
    ``scores[split][episode_id]`` = per-step scores."""
    import torch

    from training.reward_models.evaluate import measure_latency, predict_trajectories, trajectory_states
    from training.reward_models.models import RewardScorer

    files = sorted(folder.glob("*.jsonl.gz"))
    if not files:
        raise OfflineFileError(f"{folder}: no <split>.jsonl.gz trajectories files (run `export` first)")
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    scorer = RewardScorer.from_checkpoint(checkpoint, device=chosen)
    result: dict[str, Any] = {
        "format": SCORES_FORMAT,
        "checkpoint": str(checkpoint),
        "kind": scorer.kind,
        "device": torch.cuda.get_device_name(0) if chosen.startswith("cuda") else "cpu",
        "scores": {},
        "batch_seconds": {},
    }
    for path in files:
        split = path.name.removesuffix(".jsonl.gz")
        trajectories = read_trajectories_file(path)
        if "latency" not in result:  # the report times single calls on its held-out split first
            states = [s for t in trajectories for s in trajectory_states(scorer.kind, t)][:latency_calls]
            result["latency"] = measure_latency(scorer, states)
        started = time.perf_counter()
        scores = predict_trajectories(scorer, trajectories)
        result["batch_seconds"][split] = time.perf_counter() - started
        result["scores"][split] = {e: [float(x) for x in v] for e, v in scores.items()}
        result.setdefault("n_steps", {})[split] = sum(len(v) for v in scores.values())
    write_atomic(out, json.dumps(result).encode())
    return result


def read_scores_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise OfflineFileError(f"{path}: not a scores file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != SCORES_FORMAT:
        raise OfflineFileError(f"{path}: not a scores file of format {SCORES_FORMAT!r}")
    return data


def offline_report(
    warehouse,
    scores_file: Mapping[str, Any],
    *,
    split: str = "test",
    threshold_split: str = "validation",
    orm_model_id: str | None = None,
    max_trajectories: int | None = None,
) -> dict[str, dict[str, float]]:
    """The report's metrics (split -> metric -> value) of a model scored elsewhere, on the same
    trajectories the report reads; paired with the newest registered ORM (or ``orm_model_id``),
    scored here, when there is one. Scores that miss a trajectory of the split are an error."""
    from training.base.registry import latest_models, model_by_id
    from training.reward_models.evaluate import (
        _add_orm_comparison,
        _model_metrics,
        _ModelScores,
        _success_threshold,
        load_evaluation_set,
        predict_trajectories,
    )
    from training.reward_models.models import RewardScorer

    kind = str(scores_file["kind"])
    held_out = load_evaluation_set(warehouse, split, max_trajectories=max_trajectories)
    tuning = load_evaluation_set(warehouse, threshold_split, max_trajectories=max_trajectories)
    by_split = {}
    for name, data in ((split, held_out), (threshold_split, tuning)):
        given = scores_file["scores"].get(name, {})
        missing = [t.episode_id for t in data.trajectories if len(given.get(t.episode_id, ())) != len(t)]
        if missing:
            raise OfflineFileError(
                f"the scores of split {name!r} miss or mis-size {len(missing)} of its {len(data.trajectories)} "
                f"trajectories (first: {missing[0]}); score the files `export` wrote from this warehouse"
            )
        by_split[name] = {e: np.asarray(v, dtype=np.float64) for e, v in given.items()}
    scores = _ModelScores(
        dict(scores_file.get("latency", {})),
        by_split[split],
        by_split[threshold_split],
        float(scores_file.get("batch_seconds", {}).get(split, float("nan"))),
    )
    threshold = _success_threshold(scores.tune, tuning)
    metrics = {
        kind: _model_metrics(kind, scores, held_out, tuning, threshold, split=split, threshold_split=threshold_split)
    }
    orm = model_by_id(warehouse, orm_model_id) if orm_model_id else next(iter(latest_models(warehouse, ["orm"])), None)
    if orm is not None and kind != "orm":
        scorer = RewardScorer.from_checkpoint(orm.checkpoint_path)
        scorer.load_home_cache(warehouse.home)
        orm_test = predict_trajectories(scorer, held_out.trajectories)
        orm_tune = predict_trajectories(scorer, tuning.trajectories)
        thresholds = {kind: threshold, "orm": _success_threshold(orm_tune, tuning)}
        metrics["orm"] = {split: {}}
        _add_orm_comparison(metrics, {kind: scores.test, "orm": orm_test}, thresholds, held_out, split)
        metrics[kind][split]["orm_model_id"] = orm.model_id  # type: ignore[assignment]
        del metrics["orm"]
    return metrics[kind]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.reward_models.offline", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="write the report's held-out trajectories, one file per split")
    p.add_argument("--home", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--splits", default="test,validation")
    p.add_argument("--max-trajectories", type=int, default=None)
    p = sub.add_parser("score", help="score the exported trajectories with a trained checkpoint")
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--trajectories", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", default=None)
    p = sub.add_parser("report", help="the report's metrics of scores computed elsewhere")
    p.add_argument("--home", required=True)
    p.add_argument("--scores", required=True, type=Path)
    p.add_argument("--orm-model-id", default=None)
    p.add_argument("--max-trajectories", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "score":
            done = score_trajectories_files(args.checkpoint, args.trajectories, args.out, device=args.device)
            print(json.dumps({k: done[k] for k in ("kind", "device", "n_steps", "batch_seconds", "latency")}))
            return 0
        from warehouse.catalog import Warehouse

        warehouse = Warehouse(Path(args.home))
        if args.command == "export":
            counts = export_evaluation_sets(warehouse, args.out, args.splits.split(","), args.max_trajectories)
            print(json.dumps(counts))
        else:
            metrics = offline_report(
                warehouse,
                read_scores_file(args.scores),
                orm_model_id=args.orm_model_id,
                max_trajectories=args.max_trajectories,
            )
            print(json.dumps(metrics, indent=2, default=str))
    except OfflineFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
