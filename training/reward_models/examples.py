"""Training examples per kind, built from plain trajectories, splits and labels (pure), and the
TRL stepwise-supervision rows exported beside them."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from training.base.states import StepState, TextTrajectory, action_state, progress_state
from training.reward_models.kinds import KINDS, SPLITS, KindSpec, RewardModelKind, Verdict, kind_spec
from training.reward_models.labels import (
    GUIDNAV_REWARD,
    alternative_reward,
    alternative_verdict,
    derive_step_verdicts,
    outcome_anchored_progress,
    recording_verdict,
    sampled_steps,
)
from training.reward_models.prompts import (
    CANDIDATE_BULLET,
    SYSTEM_PROMPT,
    TokenCounter,
    TruncationBudget,
    approx_token_count,
    render_prompt,
)
from warehouse.tables_training import LABELLED_BY_RECORDING, LABELLED_BY_REPLAY, RM_EXAMPLES, RM_TRL_STEPWISE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeLabels:
    """Per-step progress labels of one episode from one source (``progress_labels`` rows)."""

    progress: tuple[float, ...]
    is_key_step: tuple[bool, ...]
    label_version: str | None


@dataclass(frozen=True)
class SplitInfo:
    """An episode's row of ``progress_split``."""

    split: str
    goal_key: str | None = None
    n_steps_sampled: int | None = None
    sampled: tuple[int, ...] | None = None  # which steps the balancing kept, when the split says


@dataclass(frozen=True)
class AlternativeLabel:
    """A replayed alternative at a recorded state (a ``step_alternatives`` row), as the step judges
    learn from it: the candidate as reward models read it, and what its replays showed."""

    alternative_id: str
    state_id: str
    episode_id: str
    step_idx: int
    description: str
    mc_value: float | None
    ended: bool = False
    ended_success: bool = False
    milestones_hit: tuple[str, ...] = ()
    labelled_by: str = LABELLED_BY_REPLAY  # or from the recording, where no replay reproduced the state
    is_recorded: bool = False
    matches_plan: bool | None = None
    field_match: bool | None = None

    def verdict(self) -> Verdict:
        """Step correctness: by its replays (:func:`alternative_verdict`), or from the recording
        (:func:`recording_verdict`)."""
        if self.labelled_by == LABELLED_BY_RECORDING:
            return recording_verdict(
                is_recorded=self.is_recorded,
                matches_plan=self.matches_plan,
                field_match=self.field_match,
                mc_value=self.mc_value,
            )
        return alternative_verdict(
            self.mc_value, ended=self.ended, ended_success=self.ended_success, milestones_hit=self.milestones_hit
        )

    def reward(self) -> float | None:
        """GuidNav's scalar target: by its replays (:func:`alternative_reward`), or from the recording
        (1 for a right step, 0 for a wrong one, None where the recording cannot tell)."""
        if self.labelled_by == LABELLED_BY_RECORDING:
            return {"positive": 1.0, "negative": 0.0}.get(self.verdict())
        return alternative_reward(
            self.mc_value, ended=self.ended, ended_success=self.ended_success, milestones_hit=self.milestones_hit
        )


@dataclass
class DatasetStats:
    """What building one kind's dataset kept, and what it dropped and why."""

    kind: str
    examples_by_split: dict[str, int] = field(default_factory=dict)
    label_mean_by_split: dict[str, float] = field(default_factory=dict)
    dropped: Counter = field(default_factory=Counter)
    label_sources: Counter = field(default_factory=Counter)
    label_versions: set[str] = field(default_factory=set)
    # split -> episode purpose (warehouse.purposes) -> examples: the mix a model learns from
    examples_by_purpose: dict[str, dict[str, int]] = field(default_factory=dict)
    # the RL runs' misranked episodes this dataset holds (training.reward_models.exploits):
    # episodes of each kind, and their examples per split
    exploits: dict[str, Any] = field(default_factory=dict)
    # task -> how its candidates were labelled (replay | recording) -> states in the train split with
    # at least one candidate example: which tasks a verifier saw candidates of (issue 42 item 2)
    alternative_states: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def alternative_states_by_task(self) -> dict[str, dict[str, int]]:
        return {
            task: {how: len(states) for how, states in sorted(by.items())}
            for task, by in sorted(self.alternative_states.items())
        }

    def to_json(self) -> dict:
        return {
            "alternative_states_by_task": self.alternative_states_by_task(),
            "examples_by_purpose": self.examples_by_purpose,
            "exploits": self.exploits,
            "kind": self.kind,
            "examples_by_split": self.examples_by_split,
            "label_mean_by_split": {k: round(v, 4) for k, v in self.label_mean_by_split.items()},
            "dropped": dict(self.dropped),
            "label_sources": dict(self.label_sources),
            "label_versions": sorted(self.label_versions),
        }


@dataclass(frozen=True)
class DatasetOptions:
    """Parameters of dataset building (recorded in lineage)."""

    # progress_labels.method of the LCS labels: improved (the pipeline's better labels, about half
    # the paper mode's key-step error against milestones) | paper (ProgRM §2.2 as published)
    lcs_method: str = "improved"
    derived_from: str = "lcs"  # labels step verdicts are derived from where no human label: lcs | env
    prompt_budget: TruncationBudget = TruncationBudget()
    sample_failed_steps: bool = True  # ProgRM App. C balancing (progrm_* kinds)
    # progrm_* kinds: the outcome as the final milestone (:func:`outcome_anchored_progress`); an
    # episode without labels of its kind's source then falls back (see :func:`fallback_sources`)
    # instead of being dropped
    anchor_outcome: bool = True
    # step judges: also the replayed alternatives at training states (step_alternatives)
    alternatives: bool = True
    # tasks no example comes from, in any split: a model judged on tasks it never saw (issue 42)
    excluded_tasks: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "alternatives": self.alternatives,
            "excluded_tasks": sorted(self.excluded_tasks),
            "anchor_outcome": self.anchor_outcome,
            "lcs_method": self.lcs_method,
            "derived_from": self.derived_from,
            "prompt_max_tokens": self.prompt_budget.max_tokens,
            "keep_recent_actions": self.prompt_budget.keep_recent_actions,
            "sample_failed_steps": self.sample_failed_steps,
        }


def fallback_sources(kind: str, options: DatasetOptions) -> tuple[str, ...]:
    """Where a progress kind's labels come from for an episode its own source did not label.

    ProgRM-Env's milestone labels exist only for tasks with a task spec; on the others the best
    progress label there is, is the LCS one. Anchored to the outcome (``anchor_outcome``), an
    episode labelled by nobody gets outcome-only labels (0, then 1 at a success's last step),
    since the outcome is the one milestone every task has. Without anchoring (§2.2 as
    published) such episodes are dropped.
    """
    if not options.anchor_outcome:
        return ()
    return ("lcs", "outcome") if kind_spec(kind).label_source == "env" else ("outcome",)


@dataclass
class _ExampleRows:
    """The ``rm_examples`` columns of one kind being filled, and the stats of what went in."""

    kind: str
    options: DatasetOptions
    count_tokens: TokenCounter
    stats: DatasetStats
    exploit_episodes: AbstractSet[str] = frozenset()
    rows: dict[str, list] = field(default_factory=lambda: {name: [] for name in RM_EXAMPLES.names})

    def add(
        self,
        traj: TextTrajectory,
        info: SplitInfo,
        t: int,
        state: StepState,
        label: float,
        source: str,
        version: str | None,
        key: bool | None,
        *,
        example_id: str | None = None,
        group_id: str | None = None,
        rank_value: float | None = None,
    ) -> None:
        """Append one example, its prompt rendered, and count its label source and version."""
        rows = self.rows
        rows["example_id"].append(example_id or f"{self.kind}:{traj.episode_id}:{t}")
        rows["group_id"].append(group_id)
        rows["rank_value"].append(rank_value)
        rows["kind"].append(self.kind)
        rows["split"].append(info.split)
        rows["episode_id"].append(traj.episode_id)
        rows["task_id"].append(traj.task_id)
        rows["goal_key"].append(info.goal_key)
        rows["step_idx"].append(t)
        rows["n_steps"].append(len(traj))
        rows["instruction"].append(state.instruction)
        rows["history"].append(list(state.history))
        rows["screen_lines"].append(list(state.screen_lines))
        rows["action"].append(state.action)
        rows["prompt"].append(render_prompt(self.kind, state, self.options.prompt_budget, self.count_tokens))
        rows["label"].append(float(label))
        rows["label_source"].append(source)
        rows["label_version"].append(version)
        rows["is_key_step"].append(key)
        rows["episode_success"].append(traj.success)
        rows["exploit"].append(traj.episode_id in self.exploit_episodes)
        rows["episode_purpose"].append(None)  # filled from the warehouse (dataset.episode_purposes)
        self.stats.label_sources[source] += 1
        if version:
            self.stats.label_versions.add(version)


def build_examples(
    kind: str,
    trajectories: Mapping[str, TextTrajectory],
    splits: Mapping[str, SplitInfo],
    *,
    progress_labels: Mapping[str, Mapping[str, EpisodeLabels]],
    human_verdicts: Mapping[tuple[str, int], tuple[Verdict, int]] | None = None,
    alternatives: Sequence[AlternativeLabel] = (),
    options: DatasetOptions = DatasetOptions(),
    count_tokens: TokenCounter = approx_token_count,
    exploit_episodes: AbstractSet[str] = frozenset(),
) -> tuple[pa.Table, DatasetStats]:
    """One kind's examples (``rm_examples`` rows) from trajectories, splits and labels.

    ``progress_labels[source][episode_id]`` holds the labels of a source: ``"lcs"`` (already
    restricted to ``options.lcs_method``) and ``"env"``. Episodes without a split are skipped;
    episodes without the labels a kind needs are skipped and counted in ``stats.dropped``.
    ``alternatives`` (step judges only) add every replayed candidate of a state as an example of
    its own, grouped by state (:func:`_add_alternative_examples`). The examples of
    ``exploit_episodes`` (:mod:`training.reward_models.exploits`) are flagged ``exploit``.
    """
    spec = kind_spec(kind)
    human_verdicts = human_verdicts or {}
    out = _ExampleRows(kind, options, count_tokens, DatasetStats(kind), exploit_episodes)
    by_episode: dict[str, list[AlternativeLabel]] = {}
    if spec.state == "before_action":
        for alternative in alternatives:
            by_episode.setdefault(alternative.episode_id, []).append(alternative)
    derived_source = "lcs" if options.derived_from == "lcs" else "env"
    derived_name = f"derived:{derived_source}" + (f":{options.lcs_method}" if derived_source == "lcs" else "")
    for episode_id in sorted(trajectories):
        traj = trajectories[episode_id]
        info = splits.get(episode_id)
        if info is None:
            out.stats.dropped["no split"] += 1
        elif not traj.steps:
            out.stats.dropped["no steps"] += 1
        elif spec.target == "outcome":
            _add_outcome_example(out, traj, info)
        elif spec.target == "progress":
            _add_progress_examples(out, spec, episode_id, traj, info, progress_labels)
        else:  # step judges: human verdicts where present, derived verdicts otherwise
            derived_labels = progress_labels.get(derived_source, {}).get(episode_id)
            replayed = by_episode.get(episode_id, [])
            _add_step_judge_examples(
                out,
                spec.target,
                episode_id,
                traj,
                info,
                derived_labels,
                derived_name,
                human_verdicts,
                replaced={a.step_idx for a in replayed},
            )
            _add_alternative_examples(out, spec.target, traj, info, replayed)
    outside = sum(len(v) for k, v in by_episode.items() if k not in splits or k not in trajectories)
    if outside:
        out.stats.dropped["alternatives of episodes outside the split"] += outside

    table = pa.Table.from_pydict(out.rows, schema=RM_EXAMPLES)
    _count_examples_by_split(out.stats, out.rows)
    return table, out.stats


def _add_outcome_example(out: _ExampleRows, traj: TextTrajectory, info: SplitInfo) -> None:
    """An outcome kind's one example per episode: the final state, labelled with the outcome."""
    if traj.success is None:
        out.stats.dropped["no outcome"] += 1
        return
    n = len(traj)
    out.add(traj, info, n - 1, progress_state(traj, n - 1), float(traj.success), "outcome", None, None)


def _add_progress_examples(
    out: _ExampleRows,
    spec: KindSpec,
    episode_id: str,
    traj: TextTrajectory,
    info: SplitInfo,
    progress_labels: Mapping[str, Mapping[str, EpisodeLabels]],
) -> None:
    """A progress kind's examples: the kept steps of an episode, labelled with its progress."""
    n = len(traj)
    found = _episode_progress_labels(out, spec, episode_id, traj, progress_labels)
    if found is None:
        return
    labels, source = found
    name = {"lcs": f"lcs:{out.options.lcs_method}", "outcome": "outcome"}.get(source, source)
    if source != "outcome" and out.options.anchor_outcome and traj.success is not None:
        labels = EpisodeLabels(
            tuple(float(v) for v in outcome_anchored_progress(labels.progress, traj.success)),
            labels.is_key_step,
            labels.label_version,
        )
        name += "+outcome"
    keep = _kept_steps(episode_id, traj, info, out.options)
    out.stats.dropped["failed steps not sampled (App. C)"] += n - len(keep)
    for t in keep:
        out.add(
            traj,
            info,
            t,
            progress_state(traj, t),
            labels.progress[t],
            name,
            labels.label_version,
            labels.is_key_step[t],
        )


def _episode_progress_labels(
    out: _ExampleRows,
    spec: KindSpec,
    episode_id: str,
    traj: TextTrajectory,
    progress_labels: Mapping[str, Mapping[str, EpisodeLabels]],
) -> tuple[EpisodeLabels, str] | None:
    """An episode's progress labels and their source (the kind's own, else a fallback); None if dropped."""
    n = len(traj)
    source = spec.label_source or "lcs"
    labels = progress_labels.get(source, {}).get(episode_id)
    if labels is not None and len(labels.progress) != n:
        out.stats.dropped[f"{source} labels length mismatch"] += 1
        return None
    if labels is None and traj.success is not None:
        for fallback in fallback_sources(out.kind, out.options):
            if fallback == "outcome":  # the one milestone every task has
                progress = outcome_anchored_progress(np.zeros(n), bool(traj.success))
                labels = EpisodeLabels(tuple(float(v) for v in progress), tuple(bool(v > 0) for v in progress), None)
            else:
                labels = progress_labels.get(fallback, {}).get(episode_id)
                labels = labels if labels is not None and len(labels.progress) == n else None
            if labels is not None:
                source = fallback
                break
    if labels is None:
        out.stats.dropped[f"no {spec.label_source or 'lcs'} labels"] += 1
        return None
    return labels, source


def _kept_steps(episode_id: str, traj: TextTrajectory, info: SplitInfo, options: DatasetOptions) -> Sequence[int]:
    """The steps of an episode that become examples: all, or a failed episode's sample (App. C)."""
    n = len(traj)
    if not options.sample_failed_steps:
        return range(n)
    if info.sampled is not None:  # the split's own choice of steps (App. C balancing)
        return sorted(t for t in set(info.sampled) if 0 <= t < n)
    if traj.success is False:
        return sampled_steps(episode_id, n, info.n_steps_sampled)
    return range(n)


def _add_step_judge_examples(
    out: _ExampleRows,
    target: str,
    episode_id: str,
    traj: TextTrajectory,
    info: SplitInfo,
    derived_labels: EpisodeLabels | None,
    derived_name: str,
    human_verdicts: Mapping[tuple[str, int], tuple[Verdict, int]],
    replaced: Collection[int] = (),
) -> None:
    """A step judge's examples: each step with a human verdict, else one derived from progress labels.
    Steps in ``replaced`` have replayed alternatives, whose Monte-Carlo labels stand in for a derived
    verdict there (a human verdict is kept)."""
    n = len(traj)
    derived: list[Verdict] | None = None
    if derived_labels is not None and len(derived_labels.progress) == n and traj.success is not None:
        derived = derive_step_verdicts(derived_labels.progress, traj.success)
    for t in range(n):
        human = human_verdicts.get((episode_id, t))
        version: str | None
        if human is not None:  # a person looked at the step; if they were unsure, so are we
            verdict, source, version = human[0], "human", "human_labels"
        elif t in replaced:
            out.stats.dropped["derived verdict replaced by alternatives' labels"] += 1
            continue
        elif derived is not None and derived_labels is not None:
            verdict, source, version = derived[t], derived_name, derived_labels.label_version
        else:
            out.stats.dropped["no step label"] += 1
            continue
        if target == "step_correctness":
            if verdict == "unsure":
                out.stats.dropped[f"unsure ({source.split(':')[0]})"] += 1
                continue
            label = 1.0 if verdict == "positive" else 0.0
        else:
            label = GUIDNAV_REWARD[verdict]
        key = derived_labels.is_key_step[t] if derived is not None and derived_labels is not None else None
        out.add(traj, info, t, action_state(traj, t), label, source, version, key)


def _add_alternative_examples(
    out: _ExampleRows, target: str, traj: TextTrajectory, info: SplitInfo, alternatives: Sequence[AlternativeLabel]
) -> None:
    """Every replayed candidate of a state as an example of its own: the state before the action
    with the candidate as the action (GUI-Shepherd Eq. 1's input), labelled by its replays: the PRM
    by :func:`alternative_verdict` (Math-Shepherd's hard estimate), GuidNav by
    :func:`alternative_reward` (the soft one). The examples of one state share ``group_id``, and
    ``rank_value`` (the Monte-Carlo value) orders them for the pairwise loss."""
    n = len(traj)
    for a in sorted(alternatives, key=lambda a: a.alternative_id):
        if not 0 <= a.step_idx < n:
            out.stats.dropped["alternative at a step the episode does not have"] += 1
            continue
        if target == "step_correctness":
            verdict = a.verdict()
            if verdict == "unsure":
                out.stats.dropped["unsure (alternatives)"] += 1
                continue
            label = 1.0 if verdict == "positive" else 0.0
        else:
            reward = a.reward()
            if reward is None:
                out.stats.dropped["no estimate (alternatives)"] += 1
                continue
            label = reward
        before = action_state(traj, a.step_idx)
        state = StepState(before.instruction, before.history, before.screen_lines, a.description)
        if a.labelled_by == LABELLED_BY_RECORDING:
            source = "alternatives:recording"
        else:
            source = "alternatives:monte_carlo" if a.mc_value is not None and not a.ended else "alternatives:step"
        value = a.mc_value if a.mc_value is not None else label
        out.add(
            traj,
            info,
            a.step_idx,
            state,
            label,
            source,
            None,
            None,
            example_id=f"{out.kind}:alt:{a.alternative_id}",
            group_id=a.state_id,
            rank_value=float(value),
        )
        if info.split == "train":
            by_source = out.stats.alternative_states.setdefault(traj.task_id, {})
            by_source.setdefault(a.labelled_by, set()).add(a.state_id)


def _count_examples_by_split(stats: DatasetStats, rows: Mapping[str, list]) -> None:
    """Record each split's number of examples and, where it has any, their mean label."""
    for split in SPLITS:
        split_labels = [lab for lab, s in zip(rows["label"], rows["split"], strict=True) if s == split]
        stats.examples_by_split[split] = len(split_labels)
        if split_labels:
            stats.label_mean_by_split[split] = float(np.mean(split_labels))


def trl_stepwise_rows(
    trajectories: Mapping[str, TextTrajectory],
    splits: Mapping[str, SplitInfo],
    verdicts: Mapping[str, Sequence[tuple[Verdict, str]]],
    *,
    max_screen_chars: int = 4000,
) -> pa.Table:
    """Step-correctness labels in TRL's stepwise-supervision format (``prompt``, ``completions``,
    ``labels``; one bool per completion), so a PRM can be trained with ``trl.PRMTrainer``.

    ``verdicts[episode_id][t] = (verdict, label_source)``. The prompt carries the instruction and
    the actions before the row's first step; each completion is one step: the screen the agent
    saw (cut at ``max_screen_chars``) and its action. TRL has no "ignore" label, so an ``unsure``
    step ends a row and the next labelled step starts a new one whose prompt lists the history.
    """
    rows: dict[str, list] = {name: [] for name in RM_TRL_STEPWISE.names}

    def flush(traj: TextTrajectory, start: int, completions: list[str], labels: list[bool], sources: list[str]) -> None:
        if not completions:
            return
        history = traj.actions[:start]
        history_text = "\n".join(f"{i + 1}. {a}" for i, a in enumerate(history)) if history else "None"
        prompt = (
            f"{SYSTEM_PROMPT}{CANDIDATE_BULLET}\n{KINDS[RewardModelKind.PRM].question}\n"
            f"Instructions: {traj.instruction}\nHistory Actions: {history_text}"
        )
        info = splits[traj.episode_id]
        rows["example_id"].append(f"{traj.episode_id}:{start}")
        rows["split"].append(info.split)
        rows["episode_id"].append(traj.episode_id)
        rows["task_id"].append(traj.task_id)
        rows["first_step_idx"].append(start)
        rows["prompt"].append(prompt)
        rows["completions"].append(list(completions))
        rows["labels"].append(list(labels))
        rows["label_sources"].append(list(sources))

    for episode_id in sorted(verdicts):
        traj = trajectories.get(episode_id)
        if traj is None or episode_id not in splits:
            continue
        start = 0
        completions: list[str] = []
        labels: list[bool] = []
        sources: list[str] = []
        for t, (verdict, source) in enumerate(verdicts[episode_id]):
            if verdict == "unsure":
                flush(traj, start, completions, labels, sources)
                start, completions, labels, sources = t + 1, [], [], []
                continue
            screen = "\n".join(traj.steps[t].screen_lines)
            if len(screen) > max_screen_chars:
                screen = screen[:max_screen_chars] + "\n[...]"
            completions.append(f"Current screen:\n{screen}\nAction: {traj.steps[t].action}")
            labels.append(verdict == "positive")
            sources.append(source)
        flush(traj, start, completions, labels, sources)
    return pa.Table.from_pydict(rows, schema=RM_TRL_STEPWISE)


def step_verdicts_for_export(
    trajectories: Mapping[str, TextTrajectory],
    progress_labels: Mapping[str, EpisodeLabels],
    human_verdicts: Mapping[tuple[str, int], tuple[Verdict, int]],
    derived_name: str,
) -> dict[str, list[tuple[Verdict, str]]]:
    """Per episode and step: (verdict, source), human where present, else derived (PRM rule)."""
    result: dict[str, list[tuple[Verdict, str]]] = {}
    for episode_id, traj in trajectories.items():
        labels = progress_labels.get(episode_id)
        derived = (
            derive_step_verdicts(labels.progress, traj.success)
            if labels is not None and len(labels.progress) == len(traj) and traj.success is not None
            else None
        )
        out: list[tuple[Verdict, str]] = []
        for t in range(len(traj)):
            human = human_verdicts.get((episode_id, t))
            if human is not None:
                out.append((human[0], "human"))
            elif derived is not None:
                out.append((derived[t], derived_name))
            else:
                out.append(("unsure", "none"))
        result[episode_id] = out
    return result
