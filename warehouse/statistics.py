"""Statistics every stage reports with: AUCs, bootstrap intervals and paired tests.

* :func:`roc_auc` (Mann-Whitney U) and :func:`within_group_auc` (the AUC over success-failure
  pairs of the same task), with :func:`bootstrap_auc`'s stratified percentile intervals: how well a
  reward model ranks episodes (ProgRM Table 2's success judgement, the agent-episode AUC).
* :func:`bootstrap_interval` and :func:`seed_bootstrap_interval`: a success rate's interval over
  episodes, and over RL seeds and their episodes (two levels).
* :func:`mcnemar_exact_p` and :func:`paired_comparison`: two judges or two policies on the same
  items, by their discordant pairs; :func:`holm_adjusted` when one report makes several such claims.
* :func:`poisson_binomial_upper_tail`: how likely at least k of several independent events, each of
  its own probability, happen (the constant-answer test over RL seeds).

Every resampling is seeded, so the same data give the same intervals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def mcnemar_exact_p(wins: int, losses: int) -> float:
    """Two-sided exact McNemar test: the probability, if two judges were equally accurate, of a
    split of their ``wins + losses`` discordant trajectories at least this uneven (binomial, p=1/2)."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1))
    return min(1.0, 2 * tail / 2**n)


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979, "A simple sequentially rejective multiple test
    procedure"): the i-th smallest of m p-values becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``,
    in the input's order. Rejecting where the adjusted value is under alpha keeps the chance of any
    false claim among the m at most alpha, whatever their dependence. nan stays nan and does not
    count towards m."""
    present = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (len(present) - rank) * p))
        adjusted[i] = running
    return adjusted


def poisson_binomial_upper_tail(probabilities: Sequence[float], at_least: int) -> float:
    """The probability that at least ``at_least`` of independent events of the given
    ``probabilities`` happen (the Poisson-binomial distribution's upper tail, by its exact
    recursion over events: after each event the count's distribution shifts by one with its
    probability). 1.0 where ``at_least`` is 0 or less, 0.0 where it exceeds the events."""
    if at_least <= 0:
        return 1.0
    if at_least > len(probabilities):
        return 0.0
    counts = np.zeros(len(probabilities) + 1)
    counts[0] = 1.0
    for n, p in enumerate(probabilities, start=1):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"probability {p} of event {n} is not in [0, 1]")
        counts[1 : n + 1] = counts[1 : n + 1] * (1 - p) + counts[:n] * p
        counts[0] *= 1 - p
    return float(min(1.0, counts[at_least:].sum()))


def p_value_text(p: float | None) -> str:
    """A p-value as every report prints it: three decimals, ``<0.001`` below that (a p-value is never
    zero, so "0.000" would say what no test says), ``n/a`` where there is none."""
    if p is None or math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def roc_auc(scores: Sequence[float] | np.ndarray, positive: Sequence[bool] | np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); nan with one class."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if not n_pos or not n_neg:
        return float("nan")
    # average ranks (1-based): a run of equal scores starting at 0-based position i with c members
    # ranks i + (c + 1) / 2; half-integers, so the rank sum below is exact in float64
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True, equal_nan=False)
    starts = np.cumsum(counts) - counts
    ranks = (starts + (counts + 1) / 2)[inverse]
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _class_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """The AUC of successes ``pos`` against failures ``neg`` by counting pairs (ties half): the same
    Mann-Whitney U as :func:`roc_auc`'s rank sum, exactly (both are sums of halves), without a sort
    of the pooled scores: what a bootstrap draw needs a thousand times."""
    sorted_neg = np.sort(neg)
    below = np.searchsorted(sorted_neg, pos, side="left")
    at_or_below = np.searchsorted(sorted_neg, pos, side="right")
    u = float(below.sum()) + 0.5 * float((at_or_below - below).sum())
    return float(u / (len(pos) * len(neg)))


def within_group_auc(
    scores: Sequence[float] | np.ndarray, success: Sequence[bool] | np.ndarray, groups: Sequence[str] | np.ndarray
) -> float:
    """The AUC over (success, failure) pairs of the same group (a task): each group's Mann-Whitney
    AUC weighted by its number of such pairs, i.e. the probability that a success outranks a
    failure *of the same task* (ties count half); nan where no group has both classes.

    The pooled AUC also ranks episodes across tasks, so a reward that scores an easy task high and
    a hard one low reaches a high pooled AUC while telling no success from a failure within a
    task, which is where a policy gradient needs the difference."""
    cells = _class_cells(np.asarray(scores, dtype=np.float64), np.asarray(success, dtype=bool), groups)
    return _pair_weighted_auc(cells) if cells else float("nan")


def _class_cells(
    s: np.ndarray, y: np.ndarray, groups: Sequence[str] | np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(successes, failures) of each group that has both, each sorted (the order of episodes is moot)."""
    g = np.asarray(groups, dtype=object)
    cells = [(np.sort(s[(g == group) & y]), np.sort(s[(g == group) & ~y])) for group in sorted(set(g.tolist()))]
    return [(pos, neg) for pos, neg in cells if len(pos) and len(neg)]


def _pair_weighted_auc(cells: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """Each cell's Mann-Whitney AUC weighted by its success-failure pairs."""
    weighted = pairs = 0.0
    for pos, neg in cells:
        n_pairs = float(len(pos) * len(neg))
        weighted += _class_auc(pos, neg) * n_pairs
        pairs += n_pairs
    return weighted / pairs


def percentile_interval(draws: Sequence[float] | np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap ``draws``."""
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_rows(n: int, *, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n) indices drawn with replacement from ``range(n)``, seeded: index several
    paired arrays with the same rows to resample them together."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap_auc(
    scores: Sequence[float] | np.ndarray,
    success: Sequence[bool] | np.ndarray,
    *,
    groups: Sequence[str] | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(AUC, low, high): the AUC and a percentile bootstrap interval, resampling successes and
    failures separately (each resample keeps both classes). nan where one class is absent. The
    interval depends on the scores, not on their order (each class is sorted before resampling):
    a query without ORDER BY returns the same episodes in another order from run to run.

    With ``groups`` (each episode's task): :func:`within_group_auc`, resampling the successes and
    the failures of each group apart."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(success, dtype=bool)
    if groups is not None:
        return _bootstrap_within_group_auc(s, y, np.asarray(groups, dtype=object), resamples, seed, level)
    auc = roc_auc(s, y)
    if np.isnan(auc):
        return auc, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    pos, neg = np.sort(s[y]), np.sort(s[~y])
    draws = [_class_auc(_resample(rng, pos), _resample(rng, neg)) for _ in range(resamples)]
    return (auc, *percentile_interval(draws, level))


def _resample(rng: np.random.Generator, values: np.ndarray) -> np.ndarray:
    """``len(values)`` draws with replacement: the draws ``rng.choice(values, len(values))`` makes
    (the same stream, checked by the tests), at half its cost per call."""
    return values[rng.integers(0, len(values), len(values))]


def _bootstrap_within_group_auc(
    s: np.ndarray, y: np.ndarray, g: np.ndarray, resamples: int, seed: int, level: float
) -> tuple[float, float, float]:
    cells = _class_cells(s, y, g)
    if not cells:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    draws = [
        _pair_weighted_auc([(_resample(rng, pos), _resample(rng, neg)) for pos, neg in cells]) for _ in range(resamples)
    ]
    return (_pair_weighted_auc(cells), *percentile_interval(draws, level))


def bootstrap_interval(
    successes: Sequence[bool], *, samples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """A percentile bootstrap interval of a success rate over episodes."""
    x = np.asarray(successes, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan
    return percentile_interval(x[bootstrap_rows(x.size, resamples=samples, seed=seed)].mean(axis=1), confidence)


def seed_bootstrap_interval(
    per_seed: Sequence[Sequence[float]], *, samples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high) of a rate over RL seeds and their evaluation episodes: the mean of the
    seeds' means, with a two-level percentile bootstrap (resample the seeds, then each drawn seed's
    episodes), so that both the spread between seeds and the episodes' sampling count, and the
    interval stays within the values' range (a t-interval over three seeds printed
    "33.3 [-49.5, 116.1]"). One seed: an interval over its episodes. Seeded: the same runs give the
    same interval."""
    groups = [np.asarray(g, dtype=np.float64) for g in per_seed if len(g)]
    if not groups:
        return math.nan, math.nan, math.nan
    mean = float(np.mean([g.mean() for g in groups]))
    rng = np.random.default_rng(seed)
    draws = np.empty(samples)
    for i in range(samples):
        picked = rng.integers(0, len(groups), size=len(groups))
        draws[i] = np.mean([rng.choice(groups[k], size=groups[k].size, replace=True).mean() for k in picked])
    return (mean, *percentile_interval(draws, confidence))


def paired_comparison(a: Mapping[tuple, bool], b: Mapping[tuple, bool]) -> dict[str, float]:
    """Two policies on the same evaluation episodes (keys such as (task, seed, rl seed)): how many
    only ``a`` solves, how many only ``b`` solves, and McNemar's exact p-value."""
    keys = sorted(set(a) & set(b))
    wins = sum(1 for k in keys if a[k] and not b[k])
    losses = sum(1 for k in keys if b[k] and not a[k])
    return {"pairs": len(keys), "only_a": wins, "only_b": losses, "mcnemar_p": mcnemar_exact_p(wins, losses)}


def paired_difference(
    a: Mapping[tuple, bool], b: Mapping[tuple, bool], *, samples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(difference, low, high): ``a``'s success minus ``b``'s on the keys both ran, as a share, with a
    95% interval from :func:`seed_bootstrap_interval` over the keys' last element (the RL seed of a
    (task, seed, RL seed) key: runs of one seed share their training, so their episodes are not
    independent). nan without common keys."""
    groups: dict[Any, list[float]] = {}
    for k in sorted(set(a) & set(b)):
        groups.setdefault(k[-1], []).append(float(a[k]) - float(b[k]))
    return seed_bootstrap_interval(list(groups.values()), samples=samples, seed=seed)
