"""Agreement between annotators and between label sources, and training labels from human votes.

Pure functions over plain rows (dicts with the ``human_labels`` columns).

* Cohen's kappa between two annotators on the tasks both labeled; nominal answers (positive /
  negative, yes / no) use plain kappa, ordinal ones (progress binned to fifths, the 1-5 milestone
  score) quadratic-weighted kappa. ``unsure`` answers, skipped and retracted annotations are left
  out: they are no label.
* Per-annotator statistics: volume, unsure and skip rates, median lead time, agreement and
  kappa with the others.
* Per-step training labels: majority correctness (ties give none), mean progress.
* Agreement of label sources (human, LCS, environment, model) on the same steps.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

NOMINAL_INTERFACES = {"step_correctness", "milestone_match"}
ORDINAL_INTERFACES = {"step_progress", "milestone_review"}


def cohen_kappa(
    a: Sequence[Hashable],
    b: Sequence[Hashable],
    *,
    weights: str | None = None,
    categories: Sequence[Hashable] | None = None,
) -> float | None:
    """Cohen's kappa of two raters' labels on the same items; ``weights='quadratic'`` for ordinal labels.

    None when there are no items; 1.0 when both raters use one and the same category throughout
    (perfect agreement, where the usual formula divides zero by zero).
    """
    if len(a) != len(b):
        raise ValueError("both raters must label the same items")
    n = len(a)
    if n == 0:
        return None
    cats = list(categories) if categories is not None else sorted(set(a) | set(b), key=str)
    index = {c: i for i, c in enumerate(cats)}
    k = len(cats)
    observed = [[0.0] * k for _ in range(k)]
    for x, y in zip(a, b, strict=True):
        observed[index[x]][index[y]] += 1.0
    row = [sum(observed[i]) for i in range(k)]
    col = [sum(observed[i][j] for i in range(k)) for j in range(k)]

    def weight(i: int, j: int) -> float:
        if weights == "quadratic":
            return ((i - j) / (k - 1)) ** 2 if k > 1 else 0.0
        return 0.0 if i == j else 1.0

    disagree_obs = sum(weight(i, j) * observed[i][j] for i in range(k) for j in range(k)) / n
    disagree_exp = sum(weight(i, j) * row[i] * col[j] for i in range(k) for j in range(k)) / (n * n)
    if disagree_exp == 0:
        return 1.0 if disagree_obs == 0 else 0.0
    return 1.0 - disagree_obs / disagree_exp


def answer_of(row: dict) -> Hashable | None:
    """The comparable answer of a human_labels row, or None if it gives no label (unsure, skipped, retracted)."""
    if row.get("status") != "active" or row.get("was_cancelled"):
        return None
    interface = row.get("interface")
    if interface in NOMINAL_INTERFACES:
        label = row.get("label")
        return None if label in (None, "unsure") else label
    value = row.get("value")
    if value is None:
        return None
    if interface == "step_progress":
        return min(4, int(float(value) * 5))  # fifths: 0-19, 20-39, ..., 80-100
    return int(round(float(value)))


def _categories(interface: str) -> list[Hashable] | None:
    categories: dict[str, list[Hashable]] = {
        "step_progress": [0, 1, 2, 3, 4],
        "milestone_review": [1, 2, 3, 4, 5],
        "step_correctness": ["negative", "positive"],
        "milestone_match": ["no", "yes"],
    }
    return categories.get(interface)


@dataclass(frozen=True)
class PairAgreement:
    interface: str
    annotator_a: str
    annotator_b: str
    n_items: int
    agreement: float | None
    kappa: float | None


def pairwise_agreement(rows: Iterable[dict]) -> list[PairAgreement]:
    """Kappa and raw agreement for every pair of annotators who labeled common tasks, per interface."""
    answers: dict[str, dict[tuple, dict[str, Hashable]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        answer = answer_of(row)
        if answer is None or not row.get("annotator_id"):
            continue
        item = (row.get("ls_server"), row.get("ls_project_id"), row.get("ls_task_id"))
        answers[row["interface"]][item][row["annotator_id"]] = answer
    pairs: list[PairAgreement] = []
    for interface, items in sorted(answers.items()):
        by_pair: dict[tuple[str, str], tuple[list, list]] = defaultdict(lambda: ([], []))
        for by_annotator in items.values():
            for x, y in combinations(sorted(by_annotator), 2):
                by_pair[(x, y)][0].append(by_annotator[x])
                by_pair[(x, y)][1].append(by_annotator[y])
        weights = "quadratic" if interface in ORDINAL_INTERFACES else None
        for (x, y), (a, b) in sorted(by_pair.items()):
            agree = sum(1 for p, q in zip(a, b, strict=True) if p == q) / len(a)
            pairs.append(
                PairAgreement(
                    interface,
                    x,
                    y,
                    len(a),
                    agree,
                    cohen_kappa(a, b, weights=weights, categories=_categories(interface)),
                )
            )
    return pairs


def pooled_kappa(rows: Iterable[dict], interface: str) -> tuple[float | None, int]:
    """Kappa over all overlapping pairs of one interface pooled together, and the number of item pairs."""
    a: list[Hashable] = []
    b: list[Hashable] = []
    answers: dict[tuple, dict[str, Hashable]] = defaultdict(dict)
    for row in rows:
        if row.get("interface") != interface:
            continue
        answer = answer_of(row)
        if answer is None or not row.get("annotator_id"):
            continue
        answers[(row.get("ls_server"), row.get("ls_project_id"), row.get("ls_task_id"))][row["annotator_id"]] = answer
    for by_annotator in answers.values():
        for x, y in combinations(sorted(by_annotator), 2):
            a.append(by_annotator[x])
            b.append(by_annotator[y])
    weights = "quadratic" if interface in ORDINAL_INTERFACES else None
    return cohen_kappa(a, b, weights=weights, categories=_categories(interface)), len(a)


def annotator_stats(rows: Sequence[dict]) -> list[dict]:
    """One row per (annotator, interface) with the ``annotator_stats`` columns."""
    pairs = pairwise_agreement(rows)
    overlap: dict[tuple[str, str], list[PairAgreement]] = defaultdict(list)
    for pair in pairs:
        overlap[(pair.annotator_a, pair.interface)].append(pair)
        overlap[(pair.annotator_b, pair.interface)].append(pair)
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("annotator_id") and row.get("status") == "active":
            groups[(row["annotator_id"], row["interface"])].append(row)
    stats = []
    for (annotator, interface), members in sorted(groups.items()):
        leads = [float(r["lead_time_s"]) for r in members if r.get("lead_time_s") is not None]
        shared = overlap.get((annotator, interface), [])
        n_shared = sum(p.n_items for p in shared)
        agreement = (sum((p.agreement or 0.0) * p.n_items for p in shared) / n_shared) if n_shared else None
        kappas = [(p.kappa, p.n_items) for p in shared if p.kappa is not None]
        kappa = (sum(k * n for k, n in kappas) / sum(n for _, n in kappas)) if kappas else None
        n_unsure = sum(1 for r in members if r.get("label") == "unsure")
        stats.append(
            {
                "annotator_id": annotator,
                "interface": interface,
                "n_annotations": len(members),
                "n_unsure": n_unsure,
                "n_skipped": sum(1 for r in members if r.get("was_cancelled")),
                "unsure_share": n_unsure / len(members) if members else None,
                "median_lead_time_s": statistics.median(leads) if leads else None,
                "n_overlapping_tasks": n_shared,
                "agreement_with_others": agreement,
                "kappa_with_others": kappa,
            }
        )
    return stats


def step_training_labels(rows: Iterable[dict], label_version: str) -> list[dict]:
    """Per-step labels from usable human votes (``human_step_labels`` rows).

    Correctness is the majority of positive/negative votes (none on a tie); ``unsure``,
    skipped and retracted annotations never vote, but unsure ones are counted.
    """
    steps: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        if row.get("episode_id") is None or row.get("step_idx") is None or row.get("status") != "active":
            continue
        if row.get("interface") not in ("step_correctness", "step_progress"):
            continue
        key = (row["episode_id"], int(row["step_idx"]))
        entry = steps.setdefault(
            key, {"task_id": row.get("task_id"), "votes": [], "unsure": 0, "progress": [], "annotators": set()}
        )
        if row.get("was_cancelled"):
            continue
        if row.get("annotator_id"):
            entry["annotators"].add(row["annotator_id"])
        if row["interface"] == "step_correctness":
            if row.get("label") == "unsure":
                entry["unsure"] += 1
            elif row.get("label") in ("positive", "negative"):
                entry["votes"].append(row["label"])
        elif row.get("value") is not None:
            entry["progress"].append(float(row["value"]))
    out = []
    for (episode_id, step_idx), entry in sorted(steps.items()):
        votes = Counter(entry["votes"])
        n_votes = len(entry["votes"])
        if votes["positive"] > votes["negative"]:
            correctness = "positive"
        elif votes["negative"] > votes["positive"]:
            correctness = "negative"
        else:
            correctness = None
        progress = entry["progress"]
        if not n_votes and not progress and not entry["unsure"]:
            continue
        out.append(
            {
                "episode_id": episode_id,
                "step_idx": step_idx,
                "task_id": entry["task_id"],
                "correctness": correctness,
                "correctness_votes": n_votes,
                "correctness_positive_share": votes["positive"] / n_votes if n_votes else None,
                "unsure_votes": entry["unsure"],
                "progress": sum(progress) / len(progress) if progress else None,
                "progress_votes": len(progress),
                "progress_std": statistics.pstdev(progress) if len(progress) > 1 else (0.0 if progress else None),
                "n_annotators": len(entry["annotators"]),
                "label_version": label_version,
            }
        )
    return out


def _pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    if len(x) < 2:
        return None
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sx = math.sqrt(sum((v - mx) ** 2 for v in x))
    sy = math.sqrt(sum((v - my) ** 2 for v in y))
    if sx == 0 or sy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / (sx * sy)


def compare_label_sources(steps: Sequence[dict]) -> list[dict]:
    """Agreement of label sources on the steps that both have (``label_source_agreement`` rows).

    Each step dict may hold, per source s in (human, lcs, env, model), ``s_progress`` (0-1) and
    ``s_correct`` (bool: the step is judged to move the task forward). For automatic sources a
    step is "correct" when it is a key step (LCS, environment) or raises predicted progress
    (model); for people it is their majority correctness vote.
    """
    sources = ("human", "lcs", "env", "model")
    out = []
    for a, b in combinations(sources, 2):
        pairs = [
            (s[f"{a}_correct"], s[f"{b}_correct"])
            for s in steps
            if s.get(f"{a}_correct") is not None and s.get(f"{b}_correct") is not None
        ]
        if pairs:
            xa = [bool(p[0]) for p in pairs]
            xb = [bool(p[1]) for p in pairs]
            out.append(
                {
                    "source_a": a,
                    "source_b": b,
                    "quantity": "correctness",
                    "n_steps": len(pairs),
                    "agreement": sum(1 for p, q in zip(xa, xb, strict=True) if p == q) / len(pairs),
                    "cohen_kappa": cohen_kappa(xa, xb, categories=[False, True]),
                    "mean_abs_diff": None,
                    "pearson_r": None,
                }
            )
        values = [
            (float(s[f"{a}_progress"]), float(s[f"{b}_progress"]))
            for s in steps
            if s.get(f"{a}_progress") is not None and s.get(f"{b}_progress") is not None
        ]
        if values:
            va = [v[0] for v in values]
            vb = [v[1] for v in values]
            out.append(
                {
                    "source_a": a,
                    "source_b": b,
                    "quantity": "progress",
                    "n_steps": len(values),
                    "agreement": sum(1 for p, q in zip(va, vb, strict=True) if min(4, int(p * 5)) == min(4, int(q * 5)))
                    / len(values),
                    "cohen_kappa": cohen_kappa(
                        [min(4, int(p * 5)) for p in va],
                        [min(4, int(q * 5)) for q in vb],
                        weights="quadratic",
                        categories=[0, 1, 2, 3, 4],
                    ),
                    "mean_abs_diff": sum(abs(p - q) for p, q in values) / len(values),
                    "pearson_r": _pearson(va, vb),
                }
            )
    return out
