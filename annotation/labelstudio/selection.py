"""Active selection: which steps (and milestone-action pairs) go to people, under a budget.

People are expensive, so they see the steps where the automatic labels are least certain:

* **label disagreement**: the soft-LCS progress label and the environment-milestone label of a
  step differ (in progress, or in whether the step is a key step);
* **model disagreement**: the current reward model's prediction differs from the labels' consensus
  (a progress model's progress vs the labels' progress; a step judge's probability that the step
  is correct vs the labels' key-step verdict);
* **no signal**: a step with one label source and no model (nothing to compare), ranked after
  any real disagreement;
* **spot checks**: a small share of the budget goes to random steps the sources agree on, as the
  quality control of automatic labels that GUI-Shepherd (§3) runs on its own annotations.

**By episode source first.** The budget is shared out over episode sources (``episodes.source``)
by configurable shares (:data:`DEFAULT_SOURCE_SHARES`): mostly real trajectories (human
demonstrations, policy rollouts), a small share of synthetic ones, and none of the
mismatched-instruction synthetic episodes, whose instruction belongs to another task's screen
(an annotator would be asked whether a flight-booking step advances an e-mail task). A source
with fewer candidates than its share hands the rest on to the others in proportion to their
shares; a share of 0 never receives any.

Within a source, **disagreements first**: the steps whose label sources disagree by at least
``min_disagreement`` (LCS vs environment, or the model vs the labels) are picked before steps with
nothing to compare or with agreeing labels. Each pass splits its budget evenly across strata, a
stratum being (task, success or failure), so that rare tasks and failed episodes (where automatic
labels are weakest) are represented; a stratum with fewer candidates than its share hands the rest
to the others (water-filling). Within a stratum, candidates are taken by uncertainty, at most
``max_per_episode`` steps per episode, ties broken by a seeded hash so that a selection is
reproducible. :func:`push_order` puts the selection in the order people see it: the sources by
share (real ones first), disagreements first, strata taking turns, spot checks spread through.

All functions are pure; :func:`step_candidates` builds the candidates from plain rows of
``steps``/``episodes``, ``progress_labels`` and ``rm_predictions``.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

NO_SIGNAL_UNCERTAINTY = 0.5
KEY_STEP_DISAGREEMENT = 0.5
#: A step whose label sources differ by at least this much is a disagreement, picked first within its source.
MIN_DISAGREEMENT = 0.25
DISAGREEMENT_REASONS = frozenset({"label_disagreement", "model_disagreement"})
#: The share of the budget per episode source. A key names a source (``human_demo``, ``rollout``,
#: ``synthetic:random_walk``), a family (``synthetic``: every ``synthetic:<kind>`` without a key of
#: its own) or ``*`` (any other source); a source no key covers gets nothing. Shares are weights:
#: they need not sum to 1, and what a source cannot use goes to the others in proportion.
DEFAULT_SOURCE_SHARES: dict[str, float] = {
    "human_demo": 0.6,
    "rollout": 0.3,
    "synthetic": 0.1,
    "synthetic:mismatched_instruction": 0.0,  # its instruction is another task's: nothing to judge
}
#: ``rm_predictions.kind`` values whose ``score`` is the probability that a step is correct (the step
#: judges of training.reward_models.kinds.KINDS); every other kind's score is the progress reached after the step.
STEP_JUDGE_KINDS = frozenset({"prm", "guidnav"})


@dataclass(frozen=True)
class StepCandidate:
    """A step with whatever automatic labels and predictions exist for it (None where absent)."""

    episode_id: str
    step_idx: int
    task_id: str
    success: bool | None = None
    lcs_progress: float | None = None
    env_progress: float | None = None
    lcs_key_step: bool | None = None
    env_key_step: bool | None = None
    model_progress: float | None = None
    model_previous_progress: float | None = None  # the model's prediction for the step before (None at step 0)
    model_id: str | None = None
    model_step_prob: float | None = None  # a step judge's probability that the step is correct
    episode_source: str | None = None  # episodes.source: human_demo | rollout | synthetic:<kind>

    @property
    def has_prediction(self) -> bool:
        return self.model_progress is not None or self.model_step_prob is not None

    @property
    def stratum(self) -> str:
        outcome = "unknown" if self.success is None else "success" if self.success else "failure"
        return f"{self.task_id}|{outcome}"

    @property
    def label_consensus(self) -> float | None:
        """The mean of the available automatic progress labels."""
        values = [v for v in (self.lcs_progress, self.env_progress) if v is not None]
        return sum(values) / len(values) if values else None

    @property
    def key_step_consensus(self) -> float | None:
        """The share of the available automatic labels that call the step a key step."""
        values = [float(v) for v in (self.lcs_key_step, self.env_key_step) if v is not None]
        return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Selected:
    candidate: StepCandidate
    uncertainty: float
    reason: str  # label_disagreement | model_disagreement | no_signal | spot_check
    rank_in_stratum: int
    tier: int = 0  # 0: a disagreement (or any step, without tiers), 1: the rest, 2: a spot check


def is_disagreement(score: float, reason: str, min_disagreement: float = MIN_DISAGREEMENT) -> bool:
    """Whether label sources disagree on a step by at least ``min_disagreement``."""
    return reason in DISAGREEMENT_REASONS and score >= min_disagreement


def uncertainty(candidate: StepCandidate) -> tuple[float, str]:
    """How unsure the automatic labels are about a step, in [0, 1], and why.

    label disagreement = max(|lcs - env|, 0.5 if they disagree on the key step);
    model disagreement = |model - mean(labels)| (a step judge: |P(correct) - share of labels calling
    it a key step|). The larger wins. With no pair to compare the step gets 0.5 ("no_signal"):
    after clear disagreements, before clear agreements.
    """
    signals: list[tuple[float, str]] = []
    if candidate.lcs_progress is not None and candidate.env_progress is not None:
        gap = abs(candidate.lcs_progress - candidate.env_progress)
        if (
            candidate.lcs_key_step is not None
            and candidate.env_key_step is not None
            and candidate.lcs_key_step != candidate.env_key_step
        ):
            gap = max(gap, KEY_STEP_DISAGREEMENT)
        signals.append((gap, "label_disagreement"))
    consensus = candidate.label_consensus
    if candidate.model_progress is not None and consensus is not None:
        signals.append((abs(candidate.model_progress - consensus), "model_disagreement"))
    key_consensus = candidate.key_step_consensus
    if candidate.model_step_prob is not None and key_consensus is not None:
        signals.append((abs(candidate.model_step_prob - key_consensus), "model_disagreement"))
    if not signals:
        return NO_SIGNAL_UNCERTAINTY, "no_signal"
    score, reason = max(signals, key=lambda s: s[0])
    return min(1.0, max(0.0, score)), reason


def stable_hash(*parts: object, seed: int = 0) -> float:
    """A reproducible pseudo-random number in [0, 1) for tie-breaking and sampling."""
    digest = hashlib.blake2b("|".join(map(str, (seed, *parts))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def allocate_budget(sizes: dict[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` evenly across strata, capped by each stratum's size (water-filling).

    The remainder after even shares goes to strata in name order, so the split is deterministic.
    """
    quota = dict.fromkeys(sizes, 0)
    remaining = min(budget, sum(sizes.values()))
    open_strata = sorted(s for s, n in sizes.items() if n > 0)
    while remaining > 0 and open_strata:
        share = max(1, remaining // len(open_strata))
        for stratum in list(open_strata):
            if remaining == 0:
                break
            take = min(share, sizes[stratum] - quota[stratum], remaining)
            quota[stratum] += take
            remaining -= take
            if quota[stratum] >= sizes[stratum]:
                open_strata.remove(stratum)
    return quota


def select_steps(
    candidates: Iterable[StepCandidate],
    budget: int,
    *,
    exclude: set[tuple[str, int]] | frozenset = frozenset(),
    spot_check_share: float = 0.1,
    max_per_episode: int = 2,
    seed: int = 0,
    min_disagreement: float | None = None,
) -> list[Selected]:
    """Pick up to ``budget`` steps where labels are least certain, stratified by task and outcome.

    ``exclude`` holds (episode_id, step_idx) already queued or labeled. ``spot_check_share`` of
    the budget (rounded down) goes to a seeded random sample of the remaining steps, whatever
    their uncertainty. With ``min_disagreement``, disagreements of at least that much
    (:func:`is_disagreement`) are picked first (tier 0) and the rest only fill what they leave (tier 1).
    """
    if budget <= 0:
        return []
    scored = [(c, *uncertainty(c)) for c in candidates if (c.episode_id, c.step_idx) not in exclude]
    n_spot = int(math.floor(budget * max(0.0, min(1.0, spot_check_share))))
    if min_disagreement is None:
        main = _stratified_pick(scored, budget - n_spot, max_per_episode, seed, by_uncertainty=True)
    else:
        first = [row for row in scored if is_disagreement(row[1], row[2], min_disagreement)]
        main = _stratified_pick(first, budget - n_spot, max_per_episode, seed, by_uncertainty=True)
        rest = [row for row in scored if not is_disagreement(row[1], row[2], min_disagreement)]
        main += _stratified_pick(
            rest, budget - n_spot - len(main), max_per_episode, seed, by_uncertainty=True, after=main, tier=1
        )
    taken = {(s.candidate.episode_id, s.candidate.step_idx) for s in main}
    rest = [row for row in scored if (row[0].episode_id, row[0].step_idx) not in taken]
    spots = _stratified_pick(rest, n_spot, max_per_episode, seed + 1, by_uncertainty=False, tier=2)
    spots = [replace(s, reason="spot_check") for s in spots]
    if len(main) + len(spots) < budget:  # too few spot-check candidates: fill with the next most uncertain
        taken |= {(s.candidate.episode_id, s.candidate.step_idx) for s in spots}
        extra = [row for row in scored if (row[0].episode_id, row[0].step_idx) not in taken]
        main += _stratified_pick(
            extra, budget - len(main) - len(spots), max_per_episode, seed + 2, by_uncertainty=True, after=main, tier=1
        )
    return main + spots


def _stratified_pick(
    scored: Sequence[tuple[StepCandidate, float, str]],
    budget: int,
    max_per_episode: int,
    seed: int,
    *,
    by_uncertainty: bool,
    after: Sequence[Selected] = (),
    tier: int = 0,
) -> list[Selected]:
    """Up to ``budget`` of ``scored``, split evenly over strata; ``after``: picks already made, whose
    episodes count against ``max_per_episode`` and whose ranks in a stratum come first."""
    if budget <= 0 or not scored:
        return []
    by_stratum: dict[str, list[tuple[StepCandidate, float, str]]] = defaultdict(list)
    for row in scored:
        by_stratum[row[0].stratum].append(row)
    per_episode: dict[str, int] = defaultdict(int)
    rank_offset: dict[str, int] = defaultdict(int)
    for earlier in after:
        per_episode[earlier.candidate.episode_id] += 1
        rank_offset[earlier.candidate.stratum] += 1
    ordered: dict[str, list[tuple[StepCandidate, float, str]]] = {}
    for stratum, rows in by_stratum.items():
        key = (
            (lambda r: (-r[1], stable_hash(r[0].episode_id, r[0].step_idx, seed=seed)))
            if by_uncertainty
            else (lambda r: stable_hash(r[0].episode_id, r[0].step_idx, seed=seed))
        )
        rows = sorted(rows, key=key)
        capped = []
        for row in rows:
            if per_episode[row[0].episode_id] < max_per_episode:
                per_episode[row[0].episode_id] += 1
                capped.append(row)
        ordered[stratum] = capped
    quota = allocate_budget({s: len(rows) for s, rows in ordered.items()}, budget)
    picked: list[Selected] = []
    for stratum in sorted(ordered):
        for rank, (candidate, score, reason) in enumerate(ordered[stratum][: quota[stratum]]):
            picked.append(Selected(candidate, score, reason, rank_offset[stratum] + rank, tier))
    return picked


# -- shares of the budget by episode source ----------------------------------------------------


def share_key(source: str | None, shares: Mapping[str, float]) -> str | None:
    """The key of ``shares`` that governs an episode source: its own, its family's (the part before
    the first ``:``), ``*``, else None (the source gets nothing)."""
    name = source or "unknown"
    for key in (name, name.split(":", 1)[0], "*"):
        if key in shares:
            return key
    return None


def validate_shares(shares: Mapping[str, float]) -> dict[str, float]:
    """Shares as floats, or a ValueError saying what is wrong (negative, not a number, all zero)."""
    out: dict[str, float] = {}
    for key, value in shares.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"the share of {key!r} is not a number: {value!r}") from None
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"the share of {key!r} must be a number >= 0, not {value!r}")
        out[str(key)] = number
    if not any(out.values()):
        raise ValueError(f"every source share is 0 (or none is given): nothing would be selected ({out})")
    return out


def allocate_by_share(capacity: Mapping[str, int], shares: Mapping[str, float], budget: int) -> dict[str, int]:
    """Split ``budget`` over groups in proportion to their shares, capped by each group's capacity;
    what a capped group cannot take goes to the others, again in proportion. A share of 0 gets nothing.

    Largest remainders (then the larger share, then the name) settle rounding, so the split is deterministic.
    """
    quota = dict.fromkeys(capacity, 0)
    open_groups = sorted(g for g, n in capacity.items() if n > 0 and shares.get(g, 0.0) > 0)
    remaining = min(max(0, budget), sum(capacity[g] for g in open_groups))
    while remaining > 0 and open_groups:
        total = sum(shares[g] for g in open_groups)
        exact = {g: remaining * shares[g] / total for g in open_groups}
        give = {g: int(math.floor(exact[g])) for g in open_groups}
        by_remainder = sorted(open_groups, key=lambda g: (give[g] - exact[g], -shares[g], g))
        for g in by_remainder[: remaining - sum(give.values())]:
            give[g] += 1
        for g in open_groups:
            take = min(give[g], capacity[g] - quota[g])
            quota[g] += take
            remaining -= take
        open_groups = [g for g in open_groups if quota[g] < capacity[g]]
    return quota


@dataclass(frozen=True)
class SourceAllocation:
    """What one key of the source shares got: its sources, candidates, budget and picks."""

    key: str
    share: float  # as configured
    sources: tuple[str, ...]  # the episode sources it covers (among the candidates)
    candidates: int  # steps not queued yet
    disagreements: int  # of which label sources disagree (at least ``min_disagreement``)
    budget: int  # its part of the budget
    selected: int = 0
    selected_disagreements: int = 0


def select_by_source(
    candidates: Iterable[StepCandidate],
    budget: int,
    shares: Mapping[str, float] = DEFAULT_SOURCE_SHARES,
    *,
    exclude: set[tuple[str, int]] | frozenset = frozenset(),
    spot_check_share: float = 0.1,
    max_per_episode: int = 2,
    seed: int = 0,
    min_disagreement: float = MIN_DISAGREEMENT,
) -> tuple[list[Selected], list[SourceAllocation]]:
    """The budget shared out over episode sources by ``shares`` (:func:`allocate_by_share`), each
    source's part picked by :func:`select_steps` with disagreements first; the picks in
    :func:`push_order`, and what each share key got (sources no key covers under the key ``-``)."""
    shares = validate_shares(shares)
    groups: dict[str, list[StepCandidate]] = defaultdict(list)
    for c in candidates:
        if (c.episode_id, c.step_idx) not in exclude:
            groups[share_key(c.episode_source, shares) or "-"].append(c)
    capacity = {}
    for key, members in groups.items():
        steps_per_episode: dict[str, int] = defaultdict(int)
        for c in members:
            steps_per_episode[c.episode_id] += 1
        capacity[key] = sum(min(n, max(0, max_per_episode)) for n in steps_per_episode.values())
    quota = allocate_by_share(capacity, {k: shares.get(k, 0.0) for k in capacity}, budget)
    picked: dict[str, list[Selected]] = {}
    report = []
    for key in sorted(set(shares) | set(groups), key=lambda k: (-shares.get(k, 0.0), k)):
        members = groups.get(key, [])
        picked[key] = select_steps(
            members,
            quota.get(key, 0),
            spot_check_share=spot_check_share,
            max_per_episode=max_per_episode,
            seed=seed,
            min_disagreement=min_disagreement,
        )
        report.append(
            SourceAllocation(
                key=key,
                share=shares.get(key, 0.0),
                sources=tuple(sorted({c.episode_source or "unknown" for c in members})),
                candidates=len(members),
                disagreements=sum(is_disagreement(*uncertainty(c), min_disagreement) for c in members),
                budget=quota.get(key, 0),
                selected=len(picked[key]),
                selected_disagreements=sum(
                    is_disagreement(s.uncertainty, s.reason, min_disagreement) for s in picked[key]
                ),
            )
        )
    return push_order(picked[a.key] for a in report), report


def push_order(groups: Iterable[Sequence[Selected]]) -> list[Selected]:
    """The order people see a selection in: group after group (the sources by share), and within one
    disagreements first (tier 0, then 1), strata taking turns (rank in stratum, then stratum), the
    spot checks spread evenly through."""
    ordered: list[Selected] = []
    for group in groups:
        main = sorted(
            (s for s in group if s.tier < 2),
            key=lambda s: (
                s.tier,
                s.rank_in_stratum,
                s.candidate.stratum,
                s.candidate.episode_id,
                s.candidate.step_idx,
            ),
        )
        spots = sorted(
            (s for s in group if s.tier >= 2),
            key=lambda s: (s.rank_in_stratum, s.candidate.stratum, s.candidate.episode_id, s.candidate.step_idx),
        )
        placed = [((i + 1) / (len(main) + 1), 0, s) for i, s in enumerate(main)]
        placed += [((j + 1) / (len(spots) + 1), 1, s) for j, s in enumerate(spots)]
        ordered += [s for *_, s in sorted(placed, key=lambda p: (p[0], p[1]))]
    return ordered


# -- candidates from the warehouse's rows ------------------------------------------------------


def _best_labels(rows: Iterable[Mapping[str, Any]], source: str) -> dict[tuple[str, int], Mapping[str, Any]]:
    """One ``progress_labels`` row of ``source`` per step: LCS prefers the improved method, then the
    latest label version (what training reads); the environment's latest label version."""

    def rank(row: Mapping[str, Any]) -> tuple:
        method = row.get("method")
        version = row.get("label_version")
        by_method = 0 if source != "lcs" or method is None else 2 if method == "improved" else 1
        return by_method, version is not None, version or ""

    best: dict[tuple[str, int], Mapping[str, Any]] = {}
    for row in rows:
        if row.get("source") != source:
            continue
        key = (row["episode_id"], int(row["step_idx"]))
        if key not in best or rank(row) > rank(best[key]):
            best[key] = row
    return best


def _model_scores(
    predictions: Iterable[Mapping[str, Any]],
) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float | None], dict[tuple[str, int], float]]:
    """(progress, previous progress, step-judge probability) per step from one model's ``rm_predictions`` rows.

    A step scored more than once (several report runs) gets the mean. The previous progress is the
    model's progress at the episode's preceding scored step; 0 before the first step.
    """
    sums: dict[tuple[str, int, bool], list[float]] = defaultdict(list)
    for row in predictions:
        judge = row["kind"] in STEP_JUDGE_KINDS
        sums[(row["episode_id"], int(row["step_idx"]), judge)].append(float(row["score"]))
    progress: dict[tuple[str, int], float] = {}
    judged: dict[tuple[str, int], float] = {}
    for (episode_id, step_idx, judge), values in sums.items():
        (judged if judge else progress)[(episode_id, step_idx)] = sum(values) / len(values)
    previous: dict[tuple[str, int], float | None] = {}
    last: tuple[str, float] | None = None
    for episode_id, step_idx in sorted(progress):
        before = last[1] if last is not None and last[0] == episode_id else None
        previous[(episode_id, step_idx)] = before
        last = (episode_id, progress[(episode_id, step_idx)])
    return progress, previous, judged


def step_candidates(
    steps: Iterable[Mapping[str, Any]],
    labels: Iterable[Mapping[str, Any]] = (),
    predictions: Iterable[Mapping[str, Any]] = (),
    model_id: str | None = None,
) -> list[StepCandidate]:
    """Every step with its LCS and environment labels and one model's prediction (None where absent).

    ``steps``: rows (episode_id, step_idx, task_id, success, and optionally source), the steps joined
    with their episodes;
    ``labels``: ``progress_labels`` rows; ``predictions``: the ``rm_predictions`` rows of the model
    ``model_id``. A row's ``kind`` says what its ``score`` is: a progress estimate fills
    ``model_progress`` (and the next step's ``model_previous_progress``), a step judge's
    (:data:`STEP_JUDGE_KINDS`) probability of a correct step fills ``model_step_prob``.
    """
    labels = list(labels)
    lcs, env = _best_labels(labels, "lcs"), _best_labels(labels, "env")
    progress, previous, judged = _model_scores(predictions)
    out = []
    for row in steps:
        key = (row["episode_id"], int(row["step_idx"]))
        lcs_row, env_row = lcs.get(key), env.get(key)
        model_progress, model_step_prob = progress.get(key), judged.get(key)
        before = previous.get(key)
        out.append(
            StepCandidate(
                episode_id=key[0],
                step_idx=key[1],
                task_id=row["task_id"],
                success=row.get("success"),
                lcs_progress=lcs_row["progress"] if lcs_row else None,
                env_progress=env_row["progress"] if env_row else None,
                lcs_key_step=lcs_row["is_key_step"] if lcs_row else None,
                env_key_step=env_row["is_key_step"] if env_row else None,
                model_progress=model_progress,
                model_previous_progress=before if before is not None else (0.0 if key[1] == 0 else None),
                model_id=model_id if model_progress is not None or model_step_prob is not None else None,
                model_step_prob=model_step_prob,
                episode_source=row.get("source"),
            )
        )
    return out


def candidate_rows(picked: Iterable[Selected]) -> list[dict[str, Any]]:
    """``annotation_candidates`` rows of a selection.

    The table has no column for a step judge's probability: ``model_id`` names the model, and the
    push reads the probability back from ``rm_predictions``.
    """
    return [
        {
            "episode_id": s.candidate.episode_id,
            "step_idx": s.candidate.step_idx,
            "task_id": s.candidate.task_id,
            "success": s.candidate.success,
            "stratum": s.candidate.stratum,
            "reason": s.reason,
            "uncertainty": s.uncertainty,
            "rank_in_stratum": s.rank_in_stratum,
            "lcs_progress": s.candidate.lcs_progress,
            "env_progress": s.candidate.env_progress,
            "lcs_key_step": s.candidate.lcs_key_step,
            "env_key_step": s.candidate.env_key_step,
            "model_progress": s.candidate.model_progress,
            "model_previous_progress": s.candidate.model_previous_progress,
            "model_id": s.candidate.model_id,
        }
        for s in picked
    ]


# -- milestone-action match pairs (ADMIRE App. B.4.2) -------------------------------------------


@dataclass(frozen=True)
class MatchPairCandidate:
    """A milestone next to one step of an episode of its task, with the automatic matcher's similarity."""

    milestone_set_id: str
    milestone_idx: int
    milestone: str
    episode_id: str
    step_idx: int
    task_id: str
    success: bool | None
    similarity: float

    @property
    def stratum(self) -> str:
        outcome = "unknown" if self.success is None else "success" if self.success else "failure"
        return f"{self.task_id}|{outcome}"


def match_uncertainty(similarity: float, threshold: float) -> float:
    """1 at the matcher's threshold, falling linearly to 0 at similarity 0 or 1: pairs the matcher is least sure of."""
    span = max(threshold, 1.0 - threshold, 1e-9)
    return max(0.0, 1.0 - abs(similarity - threshold) / span)


def select_match_pairs(
    pairs: Iterable[MatchPairCandidate],
    budget: int,
    *,
    threshold: float = 0.75,
    exclude: set[str] | frozenset = frozenset(),
    seed: int = 0,
) -> list[tuple[MatchPairCandidate, float]]:
    """Pairs nearest the similarity threshold (where matching errs), stratified by task and outcome.

    Each (milestone, episode) contributes at most its best-matching step and the step nearest the
    threshold, so both likely matches and hard near-misses are labeled. ``exclude`` holds item keys.
    """
    best: dict[tuple[str, int, str], MatchPairCandidate] = {}
    nearest: dict[tuple[str, int, str], MatchPairCandidate] = {}
    for pair in pairs:
        if match_item_key(pair) in exclude:
            continue
        key = (pair.milestone_set_id, pair.milestone_idx, pair.episode_id)
        if key not in best or pair.similarity > best[key].similarity:
            best[key] = pair
        if key not in nearest or abs(pair.similarity - threshold) < abs(nearest[key].similarity - threshold):
            nearest[key] = pair
    unique = {match_item_key(p): p for p in (*best.values(), *nearest.values())}
    by_stratum: dict[str, list[MatchPairCandidate]] = defaultdict(list)
    for pair in unique.values():
        by_stratum[pair.stratum].append(pair)
    for stratum in by_stratum:
        by_stratum[stratum].sort(
            key=lambda p: (-match_uncertainty(p.similarity, threshold), stable_hash(match_item_key(p), seed=seed))
        )
    quota = allocate_budget({s: len(v) for s, v in by_stratum.items()}, budget)
    chosen = []
    for stratum in sorted(by_stratum):
        chosen += [(p, match_uncertainty(p.similarity, threshold)) for p in by_stratum[stratum][: quota[stratum]]]
    return chosen


def step_item_key(episode_id: str, step_idx: int) -> str:
    return f"step:{episode_id}:{step_idx}"


def milestone_set_item_key(milestone_set_id: str) -> str:
    return f"milestones:{milestone_set_id}"


def match_item_key(pair: MatchPairCandidate) -> str:
    return f"match:{pair.milestone_set_id}:{pair.milestone_idx}:{pair.episode_id}:{pair.step_idx}"
