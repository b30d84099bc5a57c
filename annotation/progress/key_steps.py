"""Key-step discovery and progress labels (ProgRM §2.2, stages 2 and 3; Eq. 4).

Stage 2, key step discovery: each trajectory T_i of a task is matched to the recipe L_j of the
task's library that maximises the completion ratio CR(T_i; L_j) = |l_ij| / |L_j| (Eq. 4); the
steps of T_i matched by that soft LCS are its *key steps*.

Stage 3, progress labels: if the lambda-th key step corresponds to the kappa-th position of L_j,
its label is kappa / |L_j|; every other step inherits the label of the nearest preceding key step
(0 before the first). Labels therefore lie in [0, 1] and never decrease along a trajectory.

The environment-milestone variant (§2.2, last paragraph; used for ProgRM_Env) takes key steps
from the environment instead: the steps that reach a new milestone, progress rising evenly
(m / |milestones|) as in §3.3.

All functions are pure. :func:`label_corpus` runs the whole annotation (tables, recipes, key
steps, labels) with every dynamic programme of the corpus batched.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from annotation.progress.grouping import UpperBounds
from annotation.progress.recipes import (
    DEFAULT_MIN_GROUP_SIZE,
    DEFAULT_THETA,
    Episode,
    Grouping,
    RecipeRule,
    SimilarityNorm,
    TaskRecipes,
    build_recipe_libraries,
)
from annotation.progress.soft_lcs import (
    EPSILON_NOTHING,
    MatchMode,
    MatchTable,
    SequenceStore,
    TableSet,
    build_match_tables_encoded,
    soft_lcs_alignment_arrays_indexed,
    soft_lcs_scores_indexed,
)
from annotation.progress.text_similarity import Embed

#: How kappa, the numerator of a key step's label, is counted.
#: "recipe_position" (the paper): the 1-based position in the recipe of the matched element.
#: "matched_count": how many recipe elements the trajectory has matched so far; it differs when
#: the trajectory skips recipe elements, and never credits skipped ones.
KappaRule = Literal["recipe_position", "matched_count"]

LabelSource = Literal["lcs", "env"]

#: Which recipe a trajectory takes when several have its highest completion ratio (Eq. 4).
TieBreak = Literal["earlier", "more_matched"]


@dataclass(frozen=True, slots=True)
class StepLabel:
    """The label of one step: progress p*_t in [0, 1], and where it came from."""

    progress: float
    is_key_step: bool
    recipe_id: str | None
    completion_ratio: float | None


@dataclass(frozen=True)
class TrajectoryLabels:
    """Per-step labels of one trajectory, or the reason it has none (then ``steps`` is empty)."""

    episode_id: str
    source: LabelSource
    steps: tuple[StepLabel, ...]
    recipe_id: str | None
    completion_ratio: float | None
    reason: str | None = None

    @property
    def labelled(self) -> bool:
        return self.reason is None

    @property
    def progress(self) -> tuple[float, ...]:
        return tuple(s.progress for s in self.steps)

    @property
    def key_steps(self) -> tuple[int, ...]:
        return tuple(t for t, s in enumerate(self.steps) if s.is_key_step)


@dataclass(frozen=True)
class CorpusLabels:
    """Everything :func:`label_corpus` derived: per-task tables and recipe libraries, per-episode labels."""

    tables: dict[str, MatchTable]
    recipes: dict[str, TaskRecipes]
    labels: dict[str, TrajectoryLabels]  # by episode id


# --------------------------------------------------------------------------------------------
# Stage 3: labels from key steps
# --------------------------------------------------------------------------------------------


def progress_from_alignment(
    n_steps: int,
    step_indices: Sequence[int] | np.ndarray,
    recipe_indices: Sequence[int] | np.ndarray,
    recipe_length: int,
    *,
    kappa_rule: KappaRule = "recipe_position",
) -> tuple[np.ndarray, np.ndarray]:
    """Progress labels (§2.2 stage 3) from the matched (step, recipe position) pairs of the soft LCS.

    Key step k_lambda matched to recipe position kappa (0-based index kappa-1) gets kappa / |L|;
    a non-key step t with k_lambda < t < k_lambda+1 gets p*_{k_lambda}; steps before the first key
    step get 0. Returns (progress float64 array, key-step bool array), both of length ``n_steps``.
    """
    steps = np.asarray(step_indices, dtype=np.int64)
    positions = np.asarray(recipe_indices, dtype=np.int64)
    if steps.shape != positions.shape:
        raise ValueError("step_indices and recipe_indices must pair up")
    if steps.size and (np.any(np.diff(steps) <= 0) or np.any(np.diff(positions) <= 0)):
        raise ValueError("an LCS alignment increases strictly in both sequences")
    if steps.size and (steps[0] < 0 or steps[-1] >= n_steps or positions[0] < 0 or positions[-1] >= recipe_length):
        raise ValueError("alignment indices out of range")
    is_key = np.zeros(n_steps, dtype=bool)
    is_key[steps] = True
    kappa = positions + 1 if kappa_rule == "recipe_position" else np.arange(1, steps.size + 1)
    at_key = np.zeros(n_steps, dtype=np.float64)
    at_key[steps] = kappa / recipe_length if recipe_length > 0 else 0.0
    # kappa increases along the alignment, so "inherit the preceding key step's label" is a running max.
    return np.maximum.accumulate(at_key) if n_steps else at_key, is_key


def _trajectory_labels(
    episode_id: str,
    source: LabelSource,
    progress: np.ndarray,
    is_key: np.ndarray,
    recipe_id: str | None,
    ratio: float | None,
) -> TrajectoryLabels:
    steps = tuple(
        StepLabel(progress=p, is_key_step=k, recipe_id=recipe_id, completion_ratio=ratio)
        for p, k in zip(progress.tolist(), is_key.tolist(), strict=True)
    )
    return TrajectoryLabels(episode_id, source, steps, recipe_id, ratio)


# --------------------------------------------------------------------------------------------
# Stage 2: key step discovery against the recipe library
# --------------------------------------------------------------------------------------------

#: A task's (episode, recipe) pairs are pruned by an upper bound on Eq. (4) only when it has this
#: many pairs and recipes: below, scoring them all is cheaper than bounding them.
PRUNE_MIN_PAIRS = 4096
PRUNE_MIN_RECIPES = 4
_SLACK = 1e-9


def _pairs_that_can_win(
    store: SequenceStore,
    jobs: Sequence[tuple[str, Episode]],
    job_task: np.ndarray,
    pair_job: np.ndarray,
    pair_recipe: np.ndarray,
    recipe_len: np.ndarray,
    tables: TableSet,
    match_tables: Sequence[MatchTable],
) -> np.ndarray:
    """Which (episode, recipe) pairs must be scored to find each episode's best recipe (Eq. 4).

    A pair whose CR upper bound (:class:`annotation.progress.grouping.UpperBounds` over |L|) is below the
    exact CR of the episode's most promising recipe can neither win nor tie, so it is skipped:
    first the recipe with the highest bound is scored for every episode, then every pair whose
    bound reaches that CR. The choice is the one all pairs would give. Returns a boolean mask.
    """
    evaluate = np.ones(pair_job.size, dtype=bool)
    pair_task = job_task[pair_job]
    upper = np.full(pair_job.size, np.inf)
    pruned_any = False
    for t in np.unique(pair_task).tolist():
        positions = np.flatnonzero(pair_task == t)
        task_jobs = np.unique(pair_job[positions])
        task_recipes = np.unique(pair_recipe[positions])
        if positions.size < PRUNE_MIN_PAIRS or task_recipes.size < PRUNE_MIN_RECIPES:
            continue
        pruned_any = True
        bounds = UpperBounds(
            [store[int(j)] for j in task_jobs] + [store[int(r)] for r in task_recipes], match_tables[t]
        ).between(np.arange(task_jobs.size), task_jobs.size + np.arange(task_recipes.size))
        rows = np.searchsorted(task_jobs, pair_job[positions])
        cols = np.searchsorted(task_recipes, pair_recipe[positions])
        upper[positions] = np.divide(
            bounds[rows, cols], recipe_len[positions], out=np.zeros(positions.size), where=recipe_len[positions] > 0
        )
    if not pruned_any:
        return evaluate
    # Round 1: each episode's recipe with the highest bound (the earliest on ties). Pairs are
    # grouped by episode, in recipe order.
    starts = np.flatnonzero(np.r_[True, pair_job[1:] != pair_job[:-1]])
    top = np.maximum.reduceat(upper, starts)
    position = np.arange(pair_job.size)
    first_top = np.minimum.reduceat(
        np.where(upper == np.repeat(top, np.diff(np.r_[starts, pair_job.size])), position, pair_job.size), starts
    )
    scores = soft_lcs_scores_indexed(store, pair_job[first_top], pair_recipe[first_top], tables, pair_task[first_top])
    best = np.full(len(jobs), -np.inf)
    lengths = recipe_len[first_top]
    best[pair_job[first_top]] = np.divide(scores, lengths, out=np.zeros_like(scores), where=lengths > 0)
    # Round 2: whatever could reach that CR (unbounded pairs always).
    evaluate = upper >= best[pair_job] - _SLACK
    evaluate[first_top] = True
    return evaluate


def assign_progress_labels(
    episodes_by_task: Mapping[str, Sequence[Episode]],
    recipes_by_task: Mapping[str, TaskRecipes],
    tables: Mapping[str, MatchTable],
    *,
    codes_by_episode: Mapping[str, np.ndarray] | None = None,
    kappa_rule: KappaRule = "recipe_position",
    tie_break: TieBreak = "earlier",
) -> dict[str, TrajectoryLabels]:
    """Key steps and progress labels of every episode, successful or not (§2.2 stages 2-3).

    Each episode is scored against every recipe of its task (one batched DP for the corpus), the
    recipe of highest completion ratio (Eq. 4) is chosen (ties: the earlier recipe, or with
    ``tie_break="more_matched"`` the recipe that matches more of the episode's steps), and the
    episode is aligned with it (a second batched DP) to find its key steps. Episodes of tasks
    without recipes get no labels and the task's reason.
    """
    labelled_tasks = [t for t in episodes_by_task if recipes_by_task[t].has_recipes]
    labels = _labels_without_recipe(episodes_by_task, recipes_by_task, labelled_tasks)
    score_tables = TableSet.of([tables[t].scores for t in labelled_tasks])
    jobs = _label_jobs(episodes_by_task, recipes_by_task, tables, labelled_tasks, codes_by_episode)
    # Stage 2a: CR (Eq. 4) of every (episode, recipe of its task) pair, or of those that can win.
    pair_job, pair_rank, scores, ratios = _completion_ratios(jobs, score_tables, [tables[t] for t in labelled_tasks])
    best_rank, best_ratio = _best_recipes(jobs, pair_job, pair_rank, scores, ratios, tie_break)
    # Stage 2b and 3: key steps from the alignment with the chosen recipe, then their labels.
    distinct = _key_step_labels(jobs, best_rank, best_ratio, recipes_by_task, score_tables, kappa_rule)
    for (_, episode), j in zip(jobs.all_jobs, jobs.job_of.tolist(), strict=True):
        shared = distinct[j]
        labels[episode.episode_id] = (
            shared if shared.episode_id == episode.episode_id else replace(shared, episode_id=episode.episode_id)
        )
    return {e.episode_id: labels[e.episode_id] for episodes in episodes_by_task.values() for e in episodes}


def _labels_without_recipe(
    episodes_by_task: Mapping[str, Sequence[Episode]],
    recipes_by_task: Mapping[str, TaskRecipes],
    labelled_tasks: Sequence[str],
) -> dict[str, TrajectoryLabels]:
    """The (empty) labels of the episodes of tasks without a recipe, with the task's reason."""
    labels: dict[str, TrajectoryLabels] = {}
    for task in episodes_by_task:
        if task not in labelled_tasks:
            reason = f"task {task} has no recipe: {recipes_by_task[task].reason}"
            for episode in episodes_by_task[task]:
                labels[episode.episode_id] = TrajectoryLabels(episode.episode_id, "lcs", (), None, None, reason)
    return labels


@dataclass(frozen=True)
class _LabelJobs:
    """The episodes to label as distinct (task, symbols) sequences, and one store of them and their recipes."""

    all_jobs: list[tuple[str, Episode]]  # every episode of a task with recipes
    job_of: np.ndarray  # all_jobs[k] gets the labels of jobs[job_of[k]]
    jobs: list[tuple[str, Episode]]  # one episode per distinct sequence of a task
    store: SequenceStore  # every job's symbols (index = job), then every recipe's
    first_recipe_id: np.ndarray  # per labelled task, the store index of its first recipe
    job_task: np.ndarray  # per job, its task's position among the labelled tasks
    n_recipes: np.ndarray  # per job, how many recipes its task has


def _label_jobs(
    episodes_by_task: Mapping[str, Sequence[Episode]],
    recipes_by_task: Mapping[str, TaskRecipes],
    tables: Mapping[str, MatchTable],
    labelled_tasks: Sequence[str],
    codes_by_episode: Mapping[str, np.ndarray] | None,
) -> _LabelJobs:
    """Encode the episodes of the labelled tasks, keep one per distinct sequence, and store them with the recipes."""
    table_position = {task: k for k, task in enumerate(labelled_tasks)}
    all_jobs: list[tuple[str, Episode]] = [(task, e) for task in labelled_tasks for e in episodes_by_task[task]]
    # Episodes of a task with the same symbols get the same labels: each distinct sequence is
    # scored and aligned once (the rest of the labelling runs on the distinct ones, ``jobs``).
    job_codes: list[np.ndarray] = []
    representative: dict[tuple[str, bytes], int] = {}
    job_of = np.empty(len(all_jobs), dtype=np.int64)
    jobs: list[tuple[str, Episode]] = []
    for k, (task, e) in enumerate(all_jobs):
        if codes_by_episode is not None and e.episode_id in codes_by_episode:
            codes = np.asarray(codes_by_episode[e.episode_id], dtype=np.int64)
        else:
            codes = np.asarray(tables[task].encode(e.actions), dtype=np.int64)
        key = (task, codes.tobytes())
        j = representative.get(key)
        if j is None:
            j = representative[key] = len(jobs)
            jobs.append((task, e))
            job_codes.append(codes)
        job_of[k] = j
    libraries = [recipes_by_task[task].recipes for task in labelled_tasks]
    # One store: every episode to label, then every recipe; pairs are index pairs into it.
    store = SequenceStore.from_sequences(
        job_codes + [np.asarray(r.symbols, dtype=np.int64) for recipes in libraries for r in recipes]
    )
    first_recipe_id = len(jobs) + np.cumsum([0] + [len(recipes) for recipes in libraries])[:-1]
    job_task = np.array([table_position[task] for task, _ in jobs], dtype=np.int64)
    n_recipes = np.array([len(recipes) for recipes in libraries], dtype=np.int64)[job_task]
    return _LabelJobs(all_jobs, job_of, jobs, store, first_recipe_id, job_task, n_recipes)


def _completion_ratios(
    jobs: _LabelJobs, score_tables: TableSet, match_tables: Sequence[MatchTable]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Score the (job, recipe) pairs that can win; returns their jobs, recipe ranks, SoftLCS and CR (Eq. 4)."""
    pair_job = np.repeat(np.arange(len(jobs.jobs)), jobs.n_recipes)
    pair_rank = np.arange(pair_job.size) - np.repeat(np.cumsum(jobs.n_recipes) - jobs.n_recipes, jobs.n_recipes)
    pair_recipe = jobs.first_recipe_id[jobs.job_task[pair_job]] + pair_rank
    recipe_len = jobs.store.lengths[pair_recipe].astype(np.float64)
    evaluated = _pairs_that_can_win(
        jobs.store, jobs.jobs, jobs.job_task, pair_job, pair_recipe, recipe_len, score_tables, match_tables
    )
    pair_job, pair_rank, pair_recipe, recipe_len = (
        pair_job[evaluated],
        pair_rank[evaluated],
        pair_recipe[evaluated],
        recipe_len[evaluated],
    )
    scores = soft_lcs_scores_indexed(jobs.store, pair_job, pair_recipe, score_tables, jobs.job_task[pair_job])
    # Eq. (4) (soft_lcs.completion_ratio), vectorised; an empty recipe has CR 0.
    ratios = np.divide(scores, recipe_len, out=np.zeros_like(scores), where=recipe_len > 0)
    return pair_job, pair_rank, scores, ratios


def _best_recipes(
    jobs: _LabelJobs,
    pair_job: np.ndarray,
    pair_rank: np.ndarray,
    scores: np.ndarray,
    ratios: np.ndarray,
    tie_break: TieBreak,
) -> tuple[np.ndarray, np.ndarray]:
    """Each job's chosen recipe (its rank in the task's library) and CR: the highest CR, ties by ``tie_break``."""
    # Ties go to the earliest recipe: ranks are visited in order and only a strictly better CR replaces.
    best_rank = np.zeros(len(jobs.jobs), dtype=np.int64)
    best_ratio = np.full(len(jobs.jobs), -1.0)
    best_score = np.full(len(jobs.jobs), -1.0)
    by_rank = np.argsort(pair_rank, kind="stable")
    bounds = np.searchsorted(pair_rank[by_rank], np.arange(int(jobs.n_recipes.max(initial=0)) + 1))
    for k in range(bounds.size - 1):
        at_k = by_rank[bounds[k] : bounds[k + 1]]
        jobs_k, ratios_k, scores_k = pair_job[at_k], ratios[at_k], scores[at_k]
        better = ratios_k > best_ratio[jobs_k] + 1e-12
        if tie_break == "more_matched":
            tied = np.abs(ratios_k - best_ratio[jobs_k]) <= 1e-12
            better |= tied & (scores_k > best_score[jobs_k] + 1e-12)
        best_rank[jobs_k[better]] = k
        best_ratio[jobs_k[better]] = ratios_k[better]
        best_score[jobs_k[better]] = scores_k[better]
    return best_rank, best_ratio


def _key_step_labels(
    jobs: _LabelJobs,
    best_rank: np.ndarray,
    best_ratio: np.ndarray,
    recipes_by_task: Mapping[str, TaskRecipes],
    score_tables: TableSet,
    kappa_rule: KappaRule,
) -> list[TrajectoryLabels]:
    """Align each job with its chosen recipe (one batched DP); the matched steps are its key steps, labelled."""
    chosen = jobs.first_recipe_id[jobs.job_task] + best_rank
    store = jobs.store
    _, alignments = soft_lcs_alignment_arrays_indexed(
        store, np.arange(len(jobs.jobs)), chosen, score_tables, jobs.job_task
    )
    distinct: list[TrajectoryLabels] = []
    for k, ((task, episode), (step_idx, recipe_idx)) in enumerate(zip(jobs.jobs, alignments, strict=True)):
        recipe = recipes_by_task[task].recipes[int(best_rank[k])]
        progress, is_key = progress_from_alignment(
            int(store.lengths[k]), step_idx, recipe_idx, len(recipe), kappa_rule=kappa_rule
        )
        distinct.append(
            _trajectory_labels(episode.episode_id, "lcs", progress, is_key, recipe.recipe_id, float(best_ratio[k]))
        )
    return distinct


def label_episodes(
    task_recipes: TaskRecipes,
    episodes: Sequence[Episode],
    table: MatchTable,
    *,
    kappa_rule: KappaRule = "recipe_position",
) -> list[TrajectoryLabels]:
    """Key steps and progress labels of one task's episodes (see :func:`assign_progress_labels`)."""
    task = task_recipes.task_id
    labels = assign_progress_labels({task: episodes}, {task: task_recipes}, {task: table}, kappa_rule=kappa_rule)
    return [labels[e.episode_id] for e in episodes]


def label_corpus(
    episodes_by_task: Mapping[str, Sequence[Episode]],
    embed: Embed | None,
    *,
    theta: float = DEFAULT_THETA,
    epsilon: float = EPSILON_NOTHING,
    mode: MatchMode = "soft",
    min_group_size: int = DEFAULT_MIN_GROUP_SIZE,
    kappa_rule: KappaRule = "recipe_position",
    input_target_must_match: bool = False,
    recipe_rule: RecipeRule = "fold",
    support: float = 0.5,
    similarity_norm: SimilarityNorm = "min",
    tie_break: TieBreak = "earlier",
    grouping: Grouping = "prefiltered",
) -> CorpusLabels:
    """The whole LCS self-annotation of §2.2: match tables, recipe libraries, key steps, labels.

    ``embed`` supplies the sentence embeddings of INPUT/ANSWER texts for Eq. (9) (e.g. a
    :class:`annotation.progress.text_similarity.TextEmbedder`); it may be None in ``mode="hard"``.
    Episode ids must be unique across the corpus.
    """
    encoded = build_match_tables_encoded(
        {task: [e.actions for e in episodes] for task, episodes in episodes_by_task.items()},
        embed,
        mode=mode,
        epsilon=epsilon,
        input_target_must_match=input_target_must_match,
    )
    tables = {task: table for task, (table, _) in encoded.items()}
    codes = {
        e.episode_id: task_codes
        for task, episodes in episodes_by_task.items()
        for e, task_codes in zip(episodes, encoded[task][1], strict=True)
    }
    if len(codes) != sum(len(episodes) for episodes in episodes_by_task.values()):
        raise ValueError("episode ids must be unique across the corpus")
    recipes = build_recipe_libraries(
        episodes_by_task,
        tables,
        theta=theta,
        min_group_size=min_group_size,
        codes_by_episode=codes,
        recipe_rule=recipe_rule,
        support=support,
        similarity_norm=similarity_norm,
        grouping=grouping,
    )
    labels = assign_progress_labels(
        episodes_by_task, recipes, tables, codes_by_episode=codes, kappa_rule=kappa_rule, tie_break=tie_break
    )
    return CorpusLabels(tables=tables, recipes=recipes, labels=labels)


# --------------------------------------------------------------------------------------------
# Environment milestones (ProgRM_Env)
# --------------------------------------------------------------------------------------------


def milestone_progress(
    milestones_hit: Sequence[Collection[str]],
    ordered_milestones: Sequence[str],
    *,
    in_order: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Progress from environment milestones: key steps are the steps that reach a new milestone.

    ``milestones_hit[t]`` lists the milestones step t triggered; ``ordered_milestones`` is the
    task's milestone sequence. With ``in_order`` (the default), milestones count only in their
    order: a step advances past milestone m only once milestones before m are reached (several at
    once if it triggers them all). Otherwise any first hit of a milestone counts. After a step
    with m milestones reached, progress is m / |milestones| (even gains, as in §3.3); milestones
    not in the task's list are ignored. Returns (progress, key-step mask).
    """
    if len(set(ordered_milestones)) != len(ordered_milestones):
        raise ValueError("a task's milestones must be distinct")
    total = len(ordered_milestones)
    progress = np.zeros(len(milestones_hit), dtype=np.float64)
    is_key = np.zeros(len(milestones_hit), dtype=bool)
    if total == 0:
        return progress, is_key
    reached: set[str] = set()
    next_index = 0  # in-order mode: the first milestone not reached yet
    for t, hits in enumerate(milestones_hit):
        before = len(reached)
        hit_now = set(hits)
        if in_order:
            while next_index < total and ordered_milestones[next_index] in hit_now:
                reached.add(ordered_milestones[next_index])
                next_index += 1
        else:
            reached.update(hit_now.intersection(ordered_milestones))
        is_key[t] = len(reached) > before
        progress[t] = len(reached) / total
    return progress, is_key


def label_with_milestones(
    episode_id: str,
    milestones_hit: Sequence[Collection[str]],
    ordered_milestones: Sequence[str],
    *,
    in_order: bool = True,
) -> TrajectoryLabels:
    """Environment-milestone labels of one trajectory (§2.2, ProgRM_Env), see :func:`milestone_progress`.

    ``completion_ratio`` is the share of milestones reached by the end of the trajectory.
    """
    if not ordered_milestones:
        return TrajectoryLabels(episode_id, "env", (), None, None, reason="the task defines no milestones")
    progress, is_key = milestone_progress(milestones_hit, ordered_milestones, in_order=in_order)
    final = float(progress[-1]) if progress.size else 0.0
    return _trajectory_labels(episode_id, "env", progress, is_key, None, final)
