"""LCS recipe library construction (ProgRM §2.2, stage 1; App. A, Eqs. 3 and 10).

For each task, the successful trajectories are grouped so that every two trajectories of a group
have Sim >= theta_L (Eq. 3, theta_L = 0.6 in the paper), on the assumption that a group shares
one core policy. Each group yields one *recipe*: the left-associative pairwise LCS of its
members, a_1 ⊙ a_2 ⊙ ... ⊙ a_n (Eq. 10), i.e. the steps common to all of them.

A recipe is the common part of at least two trajectories. A task with fewer than two successful
trajectories, or whose successes are all too dissimilar to pair up, gets no recipe and a stated
reason; a lone trajectory is never passed off as a recipe (it would make every one of its steps a
"key step", which is the naive linear labelling the paper argues against).

Everything here is pure: plain data in, plain data out. The batched entry point
(:func:`build_recipe_libraries`) runs the DP of all tasks together for speed;
:func:`build_recipe_library` is the same for one task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from annotation.progress.grouping import (
    SimilarityGraph,
    TaskSequences,
    deduplicate,
    greedy_groups,
    highest_similarity,
    similarity_graphs,
)
from annotation.progress.soft_lcs import (
    MatchTable,
    SequenceStore,
    TableSet,
    is_symmetric,
    soft_lcs_alignment_arrays,
    soft_lcs_scores_indexed,
)
from warehouse.model import Action

#: theta_L of App. A: the least Sim (Eq. 3) between any two trajectories of a group.
DEFAULT_THETA: float = 0.6

#: Groups smaller than this give no recipe (a recipe is what at least two trajectories share).
DEFAULT_MIN_GROUP_SIZE: int = 2


@dataclass(frozen=True, slots=True)
class Episode:
    """One trajectory as the annotation sees it: its id, its actions (steps) and its outcome."""

    episode_id: str
    actions: tuple[Action, ...]
    success: bool


@dataclass(frozen=True)
class Recipe:
    """The common steps of one group of successful trajectories (Eq. 10).

    ``actions`` are taken from the group's first member (the left operand of every ⊙), at
    ``anchor_step_indices`` of that trajectory; ``symbols`` are the same actions encoded in the
    task's :class:`MatchTable`.
    """

    recipe_id: str
    task_id: str
    actions: tuple[Action, ...]
    symbols: tuple[int, ...]
    member_episode_ids: tuple[str, ...]
    anchor_step_indices: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.actions)


@dataclass(frozen=True)
class TaskRecipes:
    """The recipe library L^(g) of one task, how it was grouped, and why it is empty if it is."""

    task_id: str
    recipes: tuple[Recipe, ...]
    groups: tuple[tuple[str, ...], ...]  # every group of successful episodes, recipe or not
    n_successful: int
    reason: str | None = None  # set iff there is no recipe
    notes: tuple[str, ...] = field(default=())  # groups that gave no recipe, and why
    pairs_total: int = (
        0  # Eq. (3) pairs the grouping had to decide (distinct sequences, see annotation.progress.grouping)
    )
    pairs_scored: int = 0  # of which the soft DP ran on (the rest were ruled out by the prefilter's bound)

    @property
    def has_recipes(self) -> bool:
        return bool(self.recipes)


# --------------------------------------------------------------------------------------------
# Grouping
# --------------------------------------------------------------------------------------------


def group_by_similarity(similarity: np.ndarray, theta: float = DEFAULT_THETA) -> list[list[int]]:
    """Partition trajectories so that every two in a group have Sim >= theta (greedy, deterministic).

    ``similarity`` is the symmetric (n, n) matrix of Eq. (3). Trajectories are visited by
    decreasing number of neighbours (Sim >= theta), ties by index, so that well-connected ones
    seed groups; each joins the first existing group compatible with *all* its members, or starts a
    new one. Exact maximum cliques are NP-hard; this is the usual greedy stand-in and always
    satisfies the all-pairs constraint. Members of a group are listed in visiting order.
    """
    n = similarity.shape[0]
    if n == 0:
        return []
    linked = similarity >= theta
    np.fill_diagonal(linked, True)
    degree = linked.sum(axis=1)
    visit_order = np.lexsort((np.arange(n), -degree))
    groups: list[list[int]] = []
    for t in visit_order.tolist():
        for group in groups:
            if linked[t, group].all():
                group.append(t)
                break
        else:
            groups.append([t])
    return groups


def similarity_matrix(codes: Sequence[np.ndarray], table: MatchTable | np.ndarray) -> np.ndarray:
    """Sim (Eq. 3) between every two encoded trajectories of one task, as a symmetric matrix."""
    scores = table.scores if isinstance(table, MatchTable) else table
    return _similarity_matrices([list(codes)], [scores])[0]


SimilarityNorm = Literal["min", "mean"]
Grouping = Literal["all_pairs", "deduplicated", "prefiltered"]


def _similarity_matrices(
    codes_per_task: Sequence[Sequence[np.ndarray]], tables: Sequence[np.ndarray], norm: SimilarityNorm = "min"
) -> list[np.ndarray]:
    """Eq. (3) matrices of several tasks, all pairs of all tasks in one batched DP.

    ``norm="min"`` is Eq. (3): SoftLCS / min(|a|, |b|). ``"mean"`` divides by the mean length
    instead (2 SoftLCS / (|a| + |b|)), so a short trajectory is no longer "similar" to every longer
    one that contains it: variants of a task (with and without a detour that some instances need)
    then form groups, and recipes, of their own."""
    store = SequenceStore.from_sequences(codes for task_codes in codes_per_task for codes in task_codes)
    first_id = np.cumsum([0] + [len(c) for c in codes_per_task])
    spans = [np.triu_indices(len(codes), k=1) for codes in codes_per_task]
    a_ids = np.concatenate([first_id[t] + upper_i for t, (upper_i, _) in enumerate(spans)] or [np.zeros(0, int)])
    b_ids = np.concatenate([first_id[t] + upper_j for t, (_, upper_j) in enumerate(spans)] or [np.zeros(0, int)])
    table_index = np.repeat(np.arange(len(spans)), [upper_i.size for upper_i, _ in spans])
    scores = soft_lcs_scores_indexed(store, a_ids, b_ids, list(tables), table_index) if a_ids.size else np.zeros(0)
    # Eq. (3) (soft_lcs.trajectory_similarity), vectorised: SoftLCS / min length; 0 if one is empty.
    if norm == "mean":
        shorter = (store.lengths[a_ids] + store.lengths[b_ids]).astype(np.float64) / 2.0
    else:
        shorter = np.minimum(store.lengths[a_ids], store.lengths[b_ids]).astype(np.float64)
    sims = np.divide(scores, shorter, out=np.zeros_like(scores), where=shorter > 0)
    matrices: list[np.ndarray] = []
    start = 0
    for codes, (upper_i, upper_j) in zip(codes_per_task, spans, strict=True):
        matrix = np.eye(len(codes), dtype=np.float64)
        matrix[upper_i, upper_j] = sims[start : start + upper_i.size]
        matrix[upper_j, upper_i] = sims[start : start + upper_i.size]
        start += upper_i.size
        matrices.append(matrix)
    return matrices


def _task_sequences(codes: Sequence[np.ndarray], match_table: MatchTable) -> TaskSequences:
    """The task's successes as classes of identical sequences. Pairs of classes stand for pairs of
    trajectories only when Eq. (9)'s table is symmetric (then SoftLCS(a, b) = SoftLCS(b, a) bit for
    bit); otherwise every trajectory is its own class and pairs keep their order (i < j)."""
    table = match_table.scores
    if is_symmetric(table):
        class_of, distinct, counts = deduplicate(codes)
    else:
        class_of = np.arange(len(codes), dtype=np.int64)
        distinct = [np.asarray(c, dtype=np.int64) for c in codes]
        counts = np.ones(len(codes), dtype=np.int64)
    return TaskSequences(class_of, counts, SequenceStore.from_sequences(distinct), table, match_table)


# --------------------------------------------------------------------------------------------
# Recipes: left-associative pairwise LCS (Eq. 10)
# --------------------------------------------------------------------------------------------


def _fold_groups(
    member_codes: Sequence[Sequence[np.ndarray]], tables: Sequence[np.ndarray], table_of_group: Sequence[int]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """a_1 ⊙ a_2 ⊙ ... ⊙ a_n (Eq. 10) for every group; round r folds member r+1 into all groups at once.

    Returns, per group, (recipe symbols, their indices in the first member).
    """
    recipes = [(np.asarray(codes[0]), np.arange(len(codes[0]), dtype=np.int64)) for codes in member_codes]
    rounds = max((len(codes) for codes in member_codes), default=0)
    table_set = TableSet.of(tables) if rounds > 1 else tables
    for r in range(1, rounds):
        folding = [g for g, codes in enumerate(member_codes) if len(codes) > r and recipes[g][0].size > 0]
        if not folding:
            break
        _, alignments = soft_lcs_alignment_arrays(
            [recipes[g][0] for g in folding],
            [member_codes[g][r] for g in folding],
            table_set,
            [table_of_group[g] for g in folding],
        )
        for g, (recipe_idx, _) in zip(folding, alignments, strict=True):
            symbols, anchors = recipes[g]
            recipes[g] = (symbols[recipe_idx], anchors[recipe_idx])
    return recipes


def fold_group(member_codes: Sequence[np.ndarray], table: MatchTable | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The recipe of one group by Eq. (10): (symbols, indices of those steps in the first member)."""
    scores = table.scores if isinstance(table, MatchTable) else table
    return _fold_groups([list(member_codes)], [scores], [0])[0]


RecipeRule = Literal["fold", "consensus"]


def _consensus_groups(
    member_codes: Sequence[Sequence[np.ndarray]],
    similarities: Sequence[np.ndarray],
    tables: Sequence[np.ndarray],
    table_of_group: Sequence[int],
    support: float,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[int]]:
    """A noise-tolerant generalisation of Eq. (10) for the improved mode.

    Eq. (10) keeps only what *every* member shares, so one hurried or unusual (yet successful)
    human demonstration removes a step from the recipe of all the others. Here the group's medoid
    (the member with the highest total Sim, Eq. 3, to the others) is aligned with every other
    member, and its steps matched by at least ``support`` of them form the recipe. With
    ``support=1`` a step must be shared by all members, as in Eq. (10).

    Returns, per group, (recipe symbols, their indices in the medoid), and each group's medoid (its
    position among the group's members; the caller puts the medoid first).
    """
    medoids = [int(np.argmax(sim.sum(axis=1))) for sim in similarities]
    a_seqs, b_seqs, table_index, owner = [], [], [], []
    for g, (codes, medoid) in enumerate(zip(member_codes, medoids, strict=True)):
        for m, other in enumerate(codes):
            if m != medoid:
                a_seqs.append(codes[medoid])
                b_seqs.append(other)
                table_index.append(table_of_group[g])
                owner.append(g)
    support_counts = [
        np.zeros(len(codes[medoid]), dtype=np.int64) for codes, medoid in zip(member_codes, medoids, strict=True)
    ]
    if a_seqs:
        _, alignments = soft_lcs_alignment_arrays(a_seqs, b_seqs, list(tables), table_index)
        for g, (medoid_idx, _) in zip(owner, alignments, strict=True):
            support_counts[g][medoid_idx] += 1
    results = []
    for codes, medoid, counts in zip(member_codes, medoids, support_counts, strict=True):
        others = max(1, len(codes) - 1)
        keep = np.flatnonzero(counts >= support * others - 1e-9)
        results.append((np.asarray(codes[medoid])[keep], keep.astype(np.int64)))
    return results, medoids


def build_recipe_libraries(
    episodes_by_task: Mapping[str, Sequence[Episode]],
    tables: Mapping[str, MatchTable],
    *,
    theta: float = DEFAULT_THETA,
    min_group_size: int = DEFAULT_MIN_GROUP_SIZE,
    codes_by_episode: Mapping[str, np.ndarray] | None = None,
    recipe_rule: RecipeRule = "fold",
    support: float = 0.5,
    similarity_norm: SimilarityNorm = "min",
    grouping: Grouping = "prefiltered",
) -> dict[str, TaskRecipes]:
    """The recipe library of every task (§2.2 stage 1), all tasks' DPs batched together.

    ``grouping`` says how Eq. (3) is evaluated for the grouping: ``"all_pairs"`` runs the soft DP
    on every pair of successes (the definition); ``"deduplicated"`` once per pair of distinct
    sequences; ``"prefiltered"`` (default) also skips the pairs whose upper bound is below theta
    (:mod:`annotation.progress.grouping`). All three give the same groups and recipes.

    ``recipe_rule="fold"`` is Eq. (10); ``"consensus"`` keeps the steps of the group's medoid
    that at least ``support`` of the other members share (:func:`_consensus_groups`).
    Only successful episodes take part. ``codes_by_episode`` may hold the episodes' symbols
    (:meth:`MatchTable.encode`) when the caller already has them.
    """
    if min_group_size < 2:
        raise ValueError("min_group_size must be at least 2: a recipe is what two or more trajectories share")
    task_ids = list(episodes_by_task)
    successes = {task: [e for e in episodes_by_task[task] if e.success] for task in task_ids}
    results = _libraries_without_pairs(successes)
    comparable = [task for task in task_ids if len(successes[task]) >= 2]
    task_codes = {
        task: [_episode_codes(task, e, tables, codes_by_episode) for e in successes[task]] for task in comparable
    }
    grouped = _group_tasks(comparable, task_codes, tables, theta, similarity_norm, grouping)
    # Group every task, then fold all kept groups of all tasks together.
    groups_of, folded_of = _fold_kept_groups(
        comparable, task_codes, tables, grouped, min_group_size, recipe_rule, support
    )
    for task in comparable:
        results[task] = _task_library(task, successes[task], groups_of[task], folded_of, grouped, theta, min_group_size)
    return {task: results[task] for task in task_ids}


def _episode_codes(
    task: str, episode: Episode, tables: Mapping[str, MatchTable], codes_by_episode: Mapping[str, np.ndarray] | None
) -> np.ndarray:
    """The episode's symbols in its task's match table: the caller's if given, else encoded here."""
    if codes_by_episode is not None and episode.episode_id in codes_by_episode:
        return codes_by_episode[episode.episode_id]
    return tables[task].encode(episode.actions)


def _libraries_without_pairs(successes: Mapping[str, Sequence[Episode]]) -> dict[str, TaskRecipes]:
    """The empty libraries of tasks with fewer than two successes, each with its reason."""
    results: dict[str, TaskRecipes] = {}
    for task, episodes in successes.items():
        n = len(episodes)
        if n == 0:
            results[task] = TaskRecipes(
                task, (), (), 0, reason="no successful trajectory (a recipe needs at least two)"
            )
        elif n == 1:
            only = episodes[0].episode_id
            results[task] = TaskRecipes(
                task,
                (),
                ((only,),),
                1,
                reason=f"only one successful trajectory ({only}); a recipe is the common part of at least two",
            )
    return results


@dataclass
class _TaskGroups:
    """The Eq. (3) groups of each comparable task, and the similarities they were formed from."""

    groups_of: dict[str, list[list[int]]]
    similarity_norm: SimilarityNorm
    matrix_of: dict[str, np.ndarray] = field(default_factory=dict)  # grouping == "all_pairs"
    graphs: dict[str, SimilarityGraph] = field(default_factory=dict)  # the other groupings
    sequences: dict[str, TaskSequences] = field(default_factory=dict)  # the other groupings

    def group_matrix(self, task: str, group: Sequence[int]) -> np.ndarray:
        """Sim (Eq. 3) between the members of one group."""
        if task in self.graphs:
            return self.graphs[task].submatrix(group)
        return self.matrix_of[task][np.ix_(group, group)]

    def highest_sim(self, task: str) -> float:
        """The highest Sim (Eq. 3) between two successes of the task."""
        if task in self.graphs:
            return highest_similarity(self.sequences[task], self.graphs[task], self.similarity_norm)
        sim = self.matrix_of[task]
        return float(sim[~np.eye(sim.shape[0], dtype=bool)].max())

    def pairs(self, task: str, n_successful: int) -> tuple[int, int]:
        """Pairs of the task the grouping had to decide, and of those the pairs the soft DP ran on."""
        if task in self.graphs:
            return self.graphs[task].pairs_total, self.graphs[task].pairs_scored
        return n_successful * (n_successful - 1) // 2, n_successful * (n_successful - 1) // 2


def _group_tasks(
    comparable: Sequence[str],
    task_codes: Mapping[str, list[np.ndarray]],
    tables: Mapping[str, MatchTable],
    theta: float,
    similarity_norm: SimilarityNorm,
    grouping: Grouping,
) -> _TaskGroups:
    """Group the successes of every comparable task by Eq. (3), all tasks' DPs in one batch."""
    grouped = _TaskGroups({}, similarity_norm)
    if grouping == "all_pairs":
        matrices = _similarity_matrices(
            [task_codes[t] for t in comparable], [tables[t].scores for t in comparable], similarity_norm
        )
        grouped.matrix_of = dict(zip(comparable, matrices, strict=True))
        for task in comparable:
            grouped.groups_of[task] = group_by_similarity(grouped.matrix_of[task], theta)
    else:
        grouped.sequences = {task: _task_sequences(task_codes[task], tables[task]) for task in comparable}
        batch = [grouped.sequences[t] for t in comparable]
        for task, graph in zip(
            comparable,
            similarity_graphs(batch, theta, similarity_norm, prefilter=grouping == "prefiltered"),
            strict=True,
        ):
            grouped.graphs[task] = graph
            grouped.groups_of[task] = greedy_groups(graph)
    return grouped


#: (recipe symbols, their indices in the group's first member) by (task, group).
_FoldedGroups = dict[tuple[str, tuple[int, ...]], tuple[np.ndarray, np.ndarray]]


def _fold_kept_groups(
    comparable: Sequence[str],
    task_codes: Mapping[str, list[np.ndarray]],
    tables: Mapping[str, MatchTable],
    grouped: _TaskGroups,
    min_group_size: int,
    recipe_rule: RecipeRule,
    support: float,
) -> tuple[dict[str, list[list[int]]], _FoldedGroups]:
    """Recipe symbols and anchors of every group of at least ``min_group_size``, all tasks in one batch.

    Returns each task's groups (with ``"consensus"``, a kept group lists its medoid first and comes
    after the small groups) and, by (task, group), the kept groups' (symbols, anchors)."""
    groups_of = grouped.groups_of
    kept: list[tuple[str, list[int]]] = []
    for task in comparable:
        kept.extend((task, g) for g in groups_of[task] if len(g) >= min_group_size)
    table_position = {task: k for k, task in enumerate(comparable)}
    if recipe_rule == "consensus":
        folded, medoids = _consensus_groups(
            [[task_codes[task][m] for m in group] for task, group in kept],
            [grouped.group_matrix(task, group) for task, group in kept],
            [tables[t].scores for t in comparable],
            [table_position[task] for task, _ in kept],
            support,
        )
        # The medoid becomes the group's first member: recipe anchors index into it.
        reordered = [
            [group[medoid], *[m for k, m in enumerate(group) if k != medoid]]
            for (_, group), medoid in zip(kept, medoids, strict=True)
        ]
        groups_of = {task: [g for g in groups if len(g) < min_group_size] for task, groups in groups_of.items()}
        for (task, _), group in zip(kept, reordered, strict=True):
            groups_of[task].append(group)
        kept = [(task, group) for (task, _), group in zip(kept, reordered, strict=True)]
    else:
        folded = _fold_groups(
            [[task_codes[task][m] for m in group] for task, group in kept],
            [tables[t].scores for t in comparable],
            [table_position[task] for task, _ in kept],
        )
    folded_of = {(task, tuple(group)): result for (task, group), result in zip(kept, folded, strict=True)}
    return groups_of, folded_of


def _task_library(
    task: str,
    episodes: Sequence[Episode],
    groups: Sequence[list[int]],
    folded_of: _FoldedGroups,
    grouped: _TaskGroups,
    theta: float,
    min_group_size: int,
) -> TaskRecipes:
    """One comparable task's library: a recipe per kept group with a non-empty common part, notes for the rest."""
    recipes: list[Recipe] = []
    notes: list[str] = []
    for group in groups:
        members = tuple(episodes[m].episode_id for m in group)
        if len(group) < min_group_size:
            notes.append(f"group {list(members)} has {len(group)} member(s), fewer than {min_group_size}: no recipe")
            continue
        symbols, anchors = folded_of[(task, tuple(group))]
        if symbols.size == 0:
            notes.append(f"group {list(members)} has an empty common subsequence: no recipe")
            continue
        recipes.append(
            Recipe(
                recipe_id=f"{task}/recipe-{len(recipes)}",
                task_id=task,
                actions=tuple(episodes[group[0]].actions[i] for i in anchors.tolist()),
                symbols=tuple(symbols.tolist()),
                member_episode_ids=members,
                anchor_step_indices=tuple(anchors.tolist()),
            )
        )
    reason = None
    if not recipes:
        reason = (
            f"no group of {min_group_size} or more among the {len(episodes)} successful trajectories "
            f"with every Sim >= {theta:g} (highest Sim {grouped.highest_sim(task):.3f})"
            if all(len(g) < min_group_size for g in groups)
            else "every group's common subsequence is empty"
        )
    pairs_total, pairs_scored = grouped.pairs(task, len(episodes))
    return TaskRecipes(
        task_id=task,
        recipes=tuple(recipes),
        groups=tuple(tuple(episodes[m].episode_id for m in g) for g in groups),
        n_successful=len(episodes),
        reason=reason,
        notes=tuple(notes),
        pairs_total=pairs_total,
        pairs_scored=pairs_scored,
    )


def build_recipe_library(
    task_id: str,
    episodes: Sequence[Episode],
    table: MatchTable,
    *,
    theta: float = DEFAULT_THETA,
    min_group_size: int = DEFAULT_MIN_GROUP_SIZE,
) -> TaskRecipes:
    """The recipe library L^(g) of one task (see :func:`build_recipe_libraries`)."""
    return build_recipe_libraries({task_id: episodes}, {task_id: table}, theta=theta, min_group_size=min_group_size)[
        task_id
    ]
