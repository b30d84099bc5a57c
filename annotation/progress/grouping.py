"""Grouping successful trajectories by Eq. (3) without running the soft DP on every pair.

ProgRM §2.2 groups a task's successful trajectories so that every two members of a group have
Sim >= theta_L (Eq. 3, Sim = SoftLCS / min length; :func:`annotation.progress.recipes.group_by_similarity`
is the greedy grouping). Done naively this is one soft-LCS DP (Eq. 8) per pair: quadratic in the
task's successes, and the dominant cost once a task has a few thousand of them. Three exact
reductions, none of which changes a single group:

1. **Duplicates.** Sim depends only on the two symbol sequences, so trajectories with identical
   sequences (common once actions are rewritten relative to the instruction) form one *class*;
   the DP runs once per pair of classes (and once per class with itself, for its members' Sim
   with each other).
2. **An upper bound that prunes pairs (the prefilter).** Eq. (9) scores 0 across action types and
   across distinct targets, so the symbols of a task fall into *match classes* (connected
   components of ``table > 0``); a pair of steps can only score within a class, and at most the
   class's largest entry. Any soft-LCS alignment is then a common subsequence of the two
   trajectories written in match classes, so SoftLCS(a, b) <= LCS(classes(a), classes(b)),
   with classes whose best score is below 1 (NOTHING's epsilon) counted apart by their
   multiset bound. That plain LCS is computed for all pairs at once by rapidfuzz (bit-parallel
   C++, ~100x the soft DP); a pair whose bound divided by the Eq. (3) denominator is below
   theta cannot be linked, and its DP is skipped. Exact: the grouping is the same, pair for pair.
3. **The greedy grouping itself** keeps, per group, the set of trajectories compatible with all
   its members, so placing a trajectory is one lookup instead of one test per existing group.

Where the largest Sim is needed and no pair is linked (to say why a task has no recipe), pairs
are scored in decreasing order of their bound until no unscored pair can beat the best found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from rapidfuzz.distance import LCSseq
from rapidfuzz.process import cdist
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from annotation.progress.soft_lcs import SOFT_TEXT_TYPES, MatchTable, SequenceStore, soft_lcs_scores_indexed
from warehouse.model import ActionType

SimilarityNorm = Literal["min", "mean"]

#: Below this many distinct sequences a task's pairs all go to the DP: bounding them costs more
#: than it saves.
PREFILTER_MIN_CLASSES = 48

#: Rows of the bound matrix computed at once (keeps the rapidfuzz output at ~64 MB).
_BOUND_ROWS = 4096


@dataclass(frozen=True)
class TaskSequences:
    """One task's successful trajectories as the grouping sees them: deduplicated symbol sequences."""

    class_of: np.ndarray  # (n,) int64: the class (distinct sequence) of each trajectory
    counts: np.ndarray  # (k,) int64: trajectories per class
    store: SequenceStore  # the k distinct sequences
    table: np.ndarray  # the task's Eq. (9) table
    match_table: MatchTable | None = None  # the same, with its actions (cheaper match classes)

    @property
    def n(self) -> int:
        return int(self.class_of.size)

    @property
    def k(self) -> int:
        return int(self.counts.size)


def deduplicate(codes: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """(class of each sequence, the distinct sequences in order of first appearance, class sizes)."""
    index: dict[bytes, int] = {}
    distinct: list[np.ndarray] = []
    class_of = np.empty(len(codes), dtype=np.int64)
    for i, seq in enumerate(codes):
        arr = np.asarray(seq, dtype=np.int64)
        key = arr.tobytes()
        c = index.get(key)
        if c is None:
            c = index[key] = len(distinct)
            distinct.append(arr)
        class_of[i] = c
    counts = np.bincount(class_of, minlength=len(distinct)).astype(np.int64)
    return class_of, distinct, counts


def match_classes(table: np.ndarray | MatchTable) -> tuple[np.ndarray, np.ndarray]:
    """Symbols -> match classes and each class's best score: two steps score above 0 under Eq. (9)
    only within a class. A symbol that scores 0 even with itself (UNKNOWN) gets class -1: it
    never contributes to a soft LCS.

    For a :class:`MatchTable`, classes come from the actions in O(V): in soft mode all INPUTs form
    one class and all ANSWERs another (weight 1: a text similarity is at most 1), every other
    symbol is a class of its own, weighted by its own score (1, or epsilon for NOTHING). For a
    bare matrix, they are the connected components of ``table > 0`` (O(V^2)).
    """
    if isinstance(table, MatchTable):
        return _classes_of_actions(table)
    positive = table > 0.0
    _, components = connected_components(csr_matrix(positive), directed=False)
    live = positive.any(axis=1)
    _, classes = np.unique(np.where(live, components, -1), return_inverse=True)
    classes = classes.astype(np.int64) - (0 if live.all() else 1)  # -1 (dead symbols) sorts first
    n_classes = int(classes.max(initial=-1)) + 1
    best = np.zeros(n_classes, dtype=np.float64)
    rows, cols = np.nonzero(positive)
    same = classes[rows] == classes[cols]
    np.maximum.at(best, classes[rows[same]], table[rows[same], cols[same]])
    return classes, best


def _classes_of_actions(table: MatchTable) -> tuple[np.ndarray, np.ndarray]:
    diagonal = np.diagonal(table.scores)
    classes = np.full(len(table), -1, dtype=np.int64)
    best: list[float] = []
    soft_class: dict[ActionType, int] = {}
    for symbol, action in enumerate(table.representatives):
        kind = action.type if type(action.type) is ActionType else ActionType(action.type)
        if table.mode == "soft" and kind in SOFT_TEXT_TYPES:
            if kind not in soft_class:
                soft_class[kind] = len(best)
                best.append(1.0)
            classes[symbol] = soft_class[kind]
        elif diagonal[symbol] > 0.0:
            classes[symbol] = len(best)
            best.append(float(diagonal[symbol]))
    return classes, np.array(best, dtype=np.float64)


def _class_char(c: int) -> str:
    code = 0x100 + c
    return chr(code + 0x800 if code >= 0xD800 else code)  # no lone surrogates


class UpperBounds:
    """Upper bounds on SoftLCS (Eq. 8) between the sequences of one task (see the module docstring).

    The plain LCS of the sequences written in match classes (:func:`match_classes`) of weight 1,
    plus, for each class whose best score w is below 1 (NOTHING's epsilon), w times the fewer of
    its occurrences: any soft-LCS alignment pairs steps of one class, and dropping the low-weight
    classes from both sequences leaves the rest of it a common subsequence.
    """

    def __init__(self, sequences: Sequence[np.ndarray], table: np.ndarray | MatchTable) -> None:
        classes, best = match_classes(table)
        full = best >= 1.0
        self.strings: list[str] = []
        self.low_weights = best[~full]
        low_index = np.cumsum(~full) - 1
        self.low_counts = np.zeros((len(sequences), int((~full).sum())), dtype=np.float64)
        for i, seq in enumerate(sequences):
            cls = classes[np.asarray(seq, dtype=np.int64)]
            cls = cls[cls >= 0]
            self.strings.append("".join(_class_char(int(c)) for c in cls[full[cls]]))
            low = cls[~full[cls]]
            if low.size:
                np.add.at(self.low_counts[i], low_index[low], 1.0)

    def matrix(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), n) bounds between the given sequences and all of them."""
        return self.between(rows, np.arange(len(self.strings)))

    def between(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """(len(rows), len(cols)) bounds between two subsets of the sequences."""
        bounds = cdist(
            [self.strings[i] for i in rows.tolist()],
            [self.strings[j] for j in cols.tolist()],
            scorer=LCSseq.similarity,
            dtype=np.int32,
            workers=1,
        ).astype(np.float64)
        for j, w in enumerate(self.low_weights.tolist()):
            bounds += w * np.minimum(self.low_counts[rows, j][:, None], self.low_counts[cols, j][None, :])
        return bounds

    def pairs(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Bounds of the pairs (a[k], b[k]), computed row block by row block."""
        out = np.zeros(a.size, dtype=np.float64)
        order = np.argsort(a, kind="stable")
        sorted_a = a[order]
        rows_all = np.unique(a)
        for start in range(0, rows_all.size, _BOUND_ROWS):
            rows = rows_all[start : start + _BOUND_ROWS]
            block = self.matrix(rows)
            lo, hi = np.searchsorted(sorted_a, [rows[0], rows[-1] + 1])
            picked = order[lo:hi]
            out[picked] = block[np.searchsorted(rows, a[picked]), b[picked]]
        return out


def _denominators(lengths_a: np.ndarray, lengths_b: np.ndarray, norm: SimilarityNorm) -> np.ndarray:
    """The Eq. (3) denominator: min length (the paper), or the mean length (improved mode)."""
    if norm == "mean":
        return (lengths_a + lengths_b).astype(np.float64) / 2.0
    return np.minimum(lengths_a, lengths_b).astype(np.float64)


@dataclass
class SimilarityGraph:
    """Eq. (3) between the classes of one task, where it was computed, and the links it implies.

    ``sim[c, d]`` is Sim between a trajectory of class c and one of class d (c == d: two distinct
    trajectories with the same sequence); NaN where the pair was pruned (its Sim is below theta).
    """

    class_of: np.ndarray
    counts: np.ndarray
    sim: np.ndarray  # (k, k) float64, NaN where not computed
    theta: float
    pairs_total: int  # class pairs (and self pairs) that could be linked
    pairs_scored: int  # of which the soft DP ran on

    @property
    def linked(self) -> np.ndarray:
        """(k, k) bool: Sim >= theta (False where pruned)."""
        with np.errstate(invalid="ignore"):
            return np.nan_to_num(self.sim, nan=-1.0) >= self.theta

    def submatrix(self, members: Sequence[int] | np.ndarray) -> np.ndarray:
        """The Eq. (3) matrix between the given trajectories (indices into the task's successes),
        1 on the diagonal, as the all-pairs matrix would hold it."""
        cls = self.class_of[np.asarray(members, dtype=np.int64)]
        matrix = self.sim[np.ix_(cls, cls)].copy()
        np.fill_diagonal(matrix, 1.0)
        return matrix


#: Slack on the prefilter's comparisons: a bound and a DP score are float sums of the same terms
#: in different orders, so a pair is pruned only when its bound is clearly below theta.
_SLACK = 1e-9


def _candidate_pairs(
    task: TaskSequences, theta: float, norm: SimilarityNorm, prefilter: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Class pairs (i <= j) that could be linked: all distinct pairs plus self pairs of classes with
    two or more members, minus those whose upper bound rules them out."""
    k = task.k
    upper_i, upper_j = np.triu_indices(k, k=1)
    selfs = np.flatnonzero(task.counts >= 2)
    a = np.concatenate([upper_i, selfs]).astype(np.int64)
    b = np.concatenate([upper_j, selfs]).astype(np.int64)
    if not prefilter or k < PREFILTER_MIN_CLASSES:
        return a, b
    bounds = UpperBounds([task.store[c] for c in range(k)], task.match_table or task.table).pairs(a, b)
    lengths = task.store.lengths
    denominator = _denominators(lengths[a], lengths[b], norm)
    upper = np.divide(bounds, denominator, out=np.zeros_like(bounds), where=denominator > 0)
    keep = upper >= theta - _SLACK
    return a[keep], b[keep]


def similarity_graphs(
    tasks: Sequence[TaskSequences], theta: float, norm: SimilarityNorm = "min", *, prefilter: bool = True
) -> list[SimilarityGraph]:
    """Eq. (3) between the candidate class pairs of several tasks, all their DPs in one batch."""
    candidates = [_candidate_pairs(task, theta, norm, prefilter) for task in tasks]
    store = SequenceStore.from_sequences(task.store[c] for task in tasks for c in range(task.k))
    first = np.cumsum([0] + [task.k for task in tasks])
    a_ids = np.concatenate([first[t] + cand[0] for t, cand in enumerate(candidates)] or [np.zeros(0, np.int64)])
    b_ids = np.concatenate([first[t] + cand[1] for t, cand in enumerate(candidates)] or [np.zeros(0, np.int64)])
    table_index = np.repeat(np.arange(len(tasks)), [cand[0].size for cand in candidates])
    tables = [task.table for task in tasks]
    scores = soft_lcs_scores_indexed(store, a_ids, b_ids, tables, table_index) if a_ids.size else np.zeros(0)
    denominator = _denominators(store.lengths[a_ids], store.lengths[b_ids], norm)
    sims = np.divide(scores, denominator, out=np.zeros_like(scores), where=denominator > 0)
    graphs = []
    start = 0
    for task, (ca, cb) in zip(tasks, candidates, strict=True):
        sim = np.full((task.k, task.k), np.nan, dtype=np.float64)
        values = sims[start : start + ca.size]
        sim[ca, cb] = values
        sim[cb, ca] = values
        start += ca.size
        k = task.k
        total = k * (k - 1) // 2 + int((task.counts >= 2).sum())
        graphs.append(SimilarityGraph(task.class_of, task.counts, sim, theta, total, int(ca.size)))
    return graphs


def greedy_groups(graph: SimilarityGraph) -> list[list[int]]:
    """:func:`annotation.progress.recipes.group_by_similarity` on the task's full Eq. (3) matrix, computed
    from the class graph: same visiting order (decreasing number of neighbours, ties by index),
    each trajectory joining the first group compatible with all its members."""
    n = graph.class_of.size
    if n == 0:
        return []
    linked = graph.linked
    cls = graph.class_of
    # Neighbours of t among the n trajectories (itself included, as the diagonal is linked).
    degree = (linked.astype(np.int64) @ graph.counts)[cls] - linked[cls, cls].astype(np.int64) + 1
    visit_order = np.lexsort((np.arange(n), -degree))
    k = graph.counts.size
    capacity = 16
    compatible = np.zeros((k, capacity), dtype=bool)  # compatible[c, g]: class c links to every member of g
    groups: list[list[int]] = []
    for t in visit_order.tolist():
        c = int(cls[t])
        row = compatible[c, : len(groups)]
        g = int(np.argmax(row)) if row.size and row.any() else -1
        if g >= 0:
            groups[g].append(t)
            compatible[:, g] &= linked[c]
            continue
        if len(groups) == capacity:
            capacity *= 2
            grown = np.zeros((k, capacity), dtype=bool)
            grown[:, : len(groups)] = compatible[:, : len(groups)]
            compatible = grown
        compatible[:, len(groups)] = linked[c]
        groups.append([t])
    return groups


def highest_similarity(task: TaskSequences, graph: SimilarityGraph, norm: SimilarityNorm) -> float:
    """The largest Eq. (3) Sim between two distinct trajectories of the task (exact), scoring pruned
    pairs by decreasing upper bound only until none can beat the best found."""
    eligible = np.ones(graph.sim.shape, dtype=bool)
    np.fill_diagonal(eligible, graph.counts >= 2)
    computed = np.where(eligible & ~np.isnan(graph.sim), graph.sim, -np.inf)
    best = float(computed.max(initial=-np.inf))
    pruned_a, pruned_b = np.nonzero(np.triu(np.isnan(graph.sim) & eligible))
    if pruned_a.size == 0:
        return best
    bounds = UpperBounds([task.store[c] for c in range(task.k)], task.match_table or task.table).pairs(
        pruned_a, pruned_b
    )
    lengths = task.store.lengths
    denominator = _denominators(lengths[pruned_a], lengths[pruned_b], norm)
    upper = np.divide(bounds, denominator, out=np.zeros_like(bounds), where=denominator > 0)
    order = np.argsort(-upper, kind="stable")
    for start in range(0, order.size, 256):
        chunk = order[start : start + 256]
        if upper[chunk[0]] + _SLACK < best:
            break
        scores = soft_lcs_scores_indexed(task.store, pruned_a[chunk], pruned_b[chunk], task.table)
        sims = np.divide(scores, denominator[chunk], out=np.zeros(chunk.size), where=denominator[chunk] > 0)
        best = max(best, float(sims.max()))
    return best
