"""One kind's reward-model dataset built from the warehouse: read, build the examples, record lineage."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from training.base.states import TextTrajectory
from training.reward_models.examples import (
    DatasetOptions,
    DatasetStats,
    EpisodeLabels,
    build_examples,
    fallback_sources,
    step_verdicts_for_export,
    trl_stepwise_rows,
)
from training.reward_models.exploits import Exploit, exploit_counts, select_exploits
from training.reward_models.kinds import kind_spec
from training.reward_models.readers import (
    read_alternatives,
    read_human_verdicts,
    read_paid_episodes,
    read_progress_labels,
    read_splits,
    read_trajectories,
)
from warehouse.catalog import LineageInput, Warehouse

log = logging.getLogger(__name__)


@dataclass
class RewardModelDataset:
    """One kind's dataset as built from the warehouse (see :func:`build_reward_model_dataset`)."""

    kind: str
    examples: pa.Table
    stats: DatasetStats
    inputs: list[LineageInput]
    trl_stepwise: pa.Table | None = None
    human_labels_present: bool = False

    def summary(self) -> dict:
        return self.stats.to_json() | {"human_labels_present": self.human_labels_present}


def build_reward_model_dataset(
    warehouse: Warehouse,
    kind: str,
    options: DatasetOptions | None = None,
    *,
    trajectories: Mapping[str, TextTrajectory] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RewardModelDataset:
    """Read splits, labels and trajectories from the warehouse and build ``kind``'s examples
    (plus, for ``prm``, the TRL stepwise export), with the lineage inputs to record; ``options``
    defaults to :class:`DatasetOptions`'s defaults."""
    options = options or DatasetOptions()
    spec = kind_spec(kind)
    splits = read_splits(warehouse)
    if not splits:
        raise ValueError("progress_split is empty: the reward-model split has not been materialized")
    labels: dict[str, dict[str, EpisodeLabels]] = {}
    needed: set[str] = (
        ({spec.label_source or "lcs", *fallback_sources(kind, options)} - {"outcome"})
        if spec.target == "progress"
        else set()
    )
    if spec.target in ("step_correctness", "step_reward"):
        needed.add(options.derived_from)
    for source in needed:
        labels[source] = read_progress_labels(warehouse, source, options.lcs_method if source == "lcs" else None)
    human, human_tables = (
        read_human_verdicts(warehouse) if spec.target in ("step_correctness", "step_reward") else ({}, [])
    )
    alternatives = read_alternatives(warehouse) if spec.state == "before_action" and options.alternatives else []
    if trajectories is None:
        trajectories = read_trajectories(warehouse, splits.keys(), progress=progress)
    unknown = sorted(set(options.excluded_tasks) - {t.task_id for t in trajectories.values()})
    if unknown:  # a typo would give a dataset that still holds the task while lineage says it does not
        raise ValueError(f"excluded_tasks: no episode of {unknown} in the reward-model split")
    excluded = {e for e, t in trajectories.items() if t.task_id in set(options.excluded_tasks)}
    if excluded:  # as if never collected: no example, no alternative, no TRL row of these tasks
        trajectories = {e: t for e, t in trajectories.items() if e not in excluded}
        splits = {e: info for e, info in splits.items() if e not in excluded}
    exploits = select_exploits(read_paid_episodes(warehouse))
    examples, stats = build_examples(
        kind,
        trajectories,
        splits,
        progress_labels=labels,
        human_verdicts=human,
        alternatives=alternatives,
        options=options,
        exploit_episodes={e.episode_id for e in exploits},
    )
    examples = with_episode_purposes(warehouse, examples)
    if excluded:
        stats.dropped["episodes of excluded tasks"] = len(excluded)
    stats.examples_by_purpose = examples_by_purpose(examples)
    stats.exploits = exploits_in(examples, exploits)
    tables = ["episodes", "steps", "progress_split"] + (["progress_labels"] if needed else []) + human_tables
    tables += ["step_alternatives"] if alternatives else []
    tables += ["rl_step_rewards"] if exploits else []
    trl = None
    if kind == "prm":
        source = options.derived_from
        derived_name = f"derived:{source}" + (f":{options.lcs_method}" if source == "lcs" else "")
        verdicts = step_verdicts_for_export(trajectories, labels.get(source, {}), human, derived_name)
        trl = trl_stepwise_rows(trajectories, splits, verdicts)
    return RewardModelDataset(kind, examples, stats, warehouse.current_inputs(tables), trl, bool(human))


def exploits_in(examples: pa.Table, exploits: Sequence[Exploit]) -> dict[str, Any]:
    """The RL runs' misranked episodes a dataset holds: episodes of each kind (paid failures,
    unpaid successes) that have examples in it, and the flagged examples per split."""
    present = set(examples.column("episode_id").to_pylist()) if examples.num_rows else set()
    splits, flags = examples.column("split").to_pylist(), examples.column("exploit").to_pylist()
    flagged = Counter(split for split, flag in zip(splits, flags, strict=True) if flag)
    return exploit_counts([e for e in exploits if e.episode_id in present]) | {"examples_by_split": dict(flagged)}


def with_episode_purposes(warehouse: Warehouse, examples: pa.Table) -> pa.Table:
    """``examples`` with ``episode_purpose`` filled from ``episodes.purpose`` (training uses it to
    select checkpoints on the agent's own validation episodes, ``train_data.selection_episodes``)."""
    if not examples.num_rows:
        return examples
    ids = pc.unique(examples.column("episode_id")).to_pylist()  # type: ignore[attr-defined]
    purpose_of = dict(
        warehouse.query("SELECT episode_id, purpose FROM episodes WHERE list_contains(?, episode_id)", [ids])
        .to_pandas()
        .itertuples(index=False, name=None)
    )
    purposes = pa.array(map(purpose_of.get, examples.column("episode_id").to_pylist()), type=pa.string())
    if "episode_purpose" not in examples.column_names:  # a file written before the column
        return examples.append_column("episode_purpose", purposes)
    return examples.set_column(examples.schema.get_field_index("episode_purpose"), "episode_purpose", purposes)


def examples_by_purpose(examples: pa.Table) -> dict[str, dict[str, int]]:
    """How many examples of each split come from episodes of each purpose (demonstration,
    synthetic, exploration, policy_rollout, ...; ``episode_purpose``): the data mix, recorded with
    the dataset and the model."""
    if not examples.num_rows:
        return {}
    counts = Counter(
        zip(
            examples.column("split").to_pylist(),
            examples.column("episode_purpose").to_pylist(),
            strict=True,
        )
    )
    out: dict[str, dict[str, int]] = {}
    for (split, purpose), n in sorted(counts.items(), key=str):
        out.setdefault(split, {})[purpose or "unknown"] = n
    return out
