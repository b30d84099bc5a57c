"""The reward-model trainer's data (:mod:`training.reward_models.train`): the kind's ``rm_examples``
rows read from Parquet or the warehouse, split and sampled (whole groups of alternatives, seeded),
turned into states, labels, loss weights (within-task balancing, the agent's exploits) and the
validation episodes checkpoint selection ranks; the samplers that keep a state's alternatives in
one batch and replay their order on resume; the collators of both encoder modes; the validation
metrics."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from training.base.states import StepState
from training.reward_models.balance import (
    has_within_task_contrast,
    validation_within_task_auc,
    within_task_balance_weights,
)
from training.reward_models.exploits import EXPLOIT_WEIGHT, exploit_loss_weights
from training.reward_models.kinds import STEP_JUDGE_KINDS
from training.reward_models.models import RewardModelConfig, collate_segments, prompt_texts, tokenize_prompts
from warehouse.purposes import AGENT_PURPOSES

log = logging.getLogger("training.reward_models.train")


@dataclass
class DataArguments:
    """Where the examples come from and where the results go (besides ``--output_dir``)."""

    examples: list[str] = field(default_factory=list, metadata={"help": "rm_examples Parquet file(s)"})
    home: str | None = field(default=None, metadata={"help": "read rm_examples from this STEPWISE_HOME's warehouse"})
    profile: str = field(default="cpu", metadata={"help": "defaults: cpu | llm (ProgRM Table 5)"})
    global_batch_size: int | None = field(default=None, metadata={"help": "per_device x accumulation x world size"})
    max_train_examples: int | None = field(default=None, metadata={"help": "a seeded sample of the training examples"})
    max_eval_examples: int | None = field(default=None, metadata={"help": "a seeded sample of the validation examples"})
    embedding_cache_dir: str | None = field(
        default=None, metadata={"help": "shared cache of frozen segment embeddings"}
    )
    export_dir: str | None = field(default=None, metadata={"help": "final model folder; default <output_dir>/final"})
    resume: str = field(default="auto", metadata={"help": "auto | never | a checkpoint folder"})
    threads: int = field(default=2, metadata={"help": "torch CPU threads"})
    min_optimizer_steps: int = field(
        default=0,
        metadata={
            "help": "more whole epochs if the epochs asked for give fewer optimizer steps "
            "(0: off; ignored with --max_steps)"
        },
    )
    early_stopping_patience: int = field(
        default=0,
        metadata={
            "help": "stop after this many evaluations without a lower validation loss, and export the checkpoint "
            "with the lowest one (0: off, export the last; needs evaluations)"
        },
    )
    max_train_seconds: float = field(
        default=0.0,
        metadata={
            "help": "stop training after this many seconds of optimizer steps (a time-limited GPU slot) and export "
            "what was trained, saying so in the summary (0: off)"
        },
    )
    balance_within_task: bool = field(
        default=True,
        metadata={
            "help": "weigh the examples of successful and failed episodes equally within each task "
            "(training.reward_models.balance; tasks with fewer than 5 episodes of an outcome are left as they are)"
        },
    )
    exploit_weight: float = field(
        default=EXPLOIT_WEIGHT,
        metadata={
            "help": "loss weight of the examples of episodes an RL run's reward misranked in their task "
            "(rm_examples.exploit, training.reward_models.exploits; 1: no extra weight)"
        },
    )
    select_by: str = field(
        default="auto",
        metadata={
            "help": "early stopping's and the best checkpoint's measure: loss | within_task_auc (of validation "
            "episodes' scores against their success, among episodes of one task) | auto (within_task_auc where "
            "some validation task has both outcomes, else loss)"
        },
    )
    dataset_materialization_id: str | None = None


@dataclass(frozen=True)
class SplitEpisodes:
    """Per example of a split: its task, episode, step, the episode's success (None: unknown) and
    whether the episode is the agent's own (``AGENT_PURPOSES``: a policy rollout or an RL episode)."""

    task_ids: list[str]
    episode_ids: list[str]
    step_idx: list[int]
    success: list[bool | None]
    agent: list[bool] = field(default_factory=list)

    @staticmethod
    def of(table: pa.Table) -> SplitEpisodes:
        return SplitEpisodes(
            [t or "" for t in table["task_id"].to_pylist()],
            table["episode_id"].to_pylist(),
            [int(i or 0) for i in table["step_idx"].to_pylist()],
            table["episode_success"].to_pylist(),
            [p in AGENT_PURPOSES for p in table["episode_purpose"].to_pylist()],
        )


NO_EPISODES = SplitEpisodes([], [], [], [])


def selection_episodes(episodes: SplitEpisodes) -> tuple[SplitEpisodes, str]:
    """The validation episodes checkpoint selection ranks (issue 41 item 2: "within-task AUC on
    held-out agent episodes"): the agent's own where some task has a successful and a failed agent
    episode, every episode otherwise; and which (``agent`` | ``all``). The others keep their place
    with no outcome, so the validation examples' order still lines up with the predictions."""
    if not episodes.agent:
        return episodes, "all"
    agent_success = [s if a else None for s, a in zip(episodes.success, episodes.agent, strict=True)]
    if not has_within_task_contrast(episodes.task_ids, agent_success):
        return episodes, "all"
    return replace(episodes, success=agent_success), "agent"


@dataclass(frozen=True)
class Groups:
    """Which alternatives group each example of a split is in (-1: none), and its rank value."""

    ids: np.ndarray
    values: np.ndarray

    @property
    def any(self) -> bool:
        return bool((self.ids >= 0).any())

    def add_to(self, out: dict[str, torch.Tensor], items: Sequence[int] | np.ndarray) -> None:
        """The batch's groups and rank values, for the pairwise loss (only where the split has groups)."""
        if self.any:
            index = np.asarray(items, dtype=np.int64)
            out["groups"] = torch.from_numpy(self.ids[index])
            out["rank_values"] = torch.from_numpy(self.values[index])


NO_GROUPS = Groups(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))


@dataclass
class SplitExamples:
    """The train and validation states and labels of one kind, and the label versions they carry."""

    train_states: list[StepState]
    train_labels: np.ndarray
    eval_states: list[StepState]
    eval_labels: np.ndarray
    label_versions: list[str]
    train_groups: Groups = NO_GROUPS
    eval_groups: Groups = NO_GROUPS
    eval_episodes: SplitEpisodes = NO_EPISODES
    train_weights: np.ndarray | None = None  # within-task balancing's and exploits' loss weights (None: all 1)
    train_exploit_examples: int = 0  # training examples of misranked RL episodes (rm_examples.exploit)
    exploit_weight: float = 1.0  # their loss weight relative to the others
    balanced_within_task: bool = False
    selection_episodes: str = "all"  # the validation episodes checkpoint selection ranks (agent | all)


def read_split_examples(data: DataArguments, kind: str) -> SplitExamples:
    """Read the kind's examples and turn its train and validation rows into states and labels."""
    table = read_examples(data, kind)
    train_table = split_table(table, "train", data.max_train_examples)
    eval_table = split_table(table, "validation", data.max_eval_examples)
    if train_table.num_rows == 0:
        raise ValueError(f"no training examples of kind {kind!r}")
    train_states, train_labels = states_and_labels(train_table)
    eval_states, eval_labels = states_and_labels(eval_table)
    label_versions = sorted({v for v in table["label_version"].to_pylist() if v})
    index: dict[str, int] = {}
    train_groups = Groups(*groups_and_values(train_table, index))
    eval_groups = Groups(*groups_and_values(eval_table, index))
    train_episodes = SplitEpisodes.of(train_table)
    eval_episodes, ranked_episodes = selection_episodes(SplitEpisodes.of(eval_table))
    weights = None
    if data.balance_within_task:
        weights = within_task_balance_weights(
            train_episodes.task_ids, train_episodes.episode_ids, train_episodes.success
        )
        log.info("%s: within-task balancing, example weights %.2f..%.2f", kind, weights.min(), weights.max())
    exploit = train_table["exploit"].to_pylist()
    exploit_examples = sum(map(bool, exploit))
    weights = exploit_loss_weights(weights, exploit, data.exploit_weight)
    if exploit_examples:
        log.info("%s: %d examples of misranked RL episodes weigh %.1fx", kind, exploit_examples, data.exploit_weight)
    del table, train_table, eval_table  # the states hold what is needed
    log.info(
        "%s: %d train / %d validation examples (%d groups of alternatives)",
        kind,
        len(train_states),
        len(eval_states),
        len(index),
    )
    return SplitExamples(
        train_states,
        train_labels,
        eval_states,
        eval_labels,
        label_versions,
        train_groups,
        eval_groups,
        eval_episodes,
        weights,
        exploit_examples,
        data.exploit_weight,
        data.balance_within_task,
        ranked_episodes,
    )


def read_examples(data: DataArguments, kind: str) -> pa.Table:
    """The kind's ``rm_examples`` rows, from Parquet files or from the warehouse."""
    columns = [
        "example_id",
        "kind",
        "split",
        "episode_id",
        "task_id",
        "episode_success",
        "exploit",
        "episode_purpose",
        "step_idx",
        "instruction",
        "history",
        "screen_lines",
        "action",
        "label",
        "label_version",
    ]
    if data.examples:
        # files written before alternatives existed have no group columns: they read as null
        table = pa.concat_tables([_read_parquet(p, columns + list(GROUP_COLUMNS)) for p in data.examples])
        # pyarrow.compute generates its kernels (equal, ...) at import time: its typing does not list them.
        mask = pc.equal(table["kind"], kind)  # type: ignore[attr-defined]
        return table.filter(mask)
    from warehouse.catalog import Warehouse

    cols = ", ".join(columns + list(GROUP_COLUMNS))
    return Warehouse(data.home).query(f"SELECT {cols} FROM rm_examples WHERE kind = ? ORDER BY example_id", [kind])


#: rm_examples columns of alternatives at one state: which state an example's candidate belongs to,
#: and its Monte-Carlo value (the pairwise loss ranks the candidates of a state by it).
GROUP_COLUMNS = ("group_id", "rank_value")


def _read_parquet(path: str, columns: list[str]) -> pa.Table:
    """The columns of a Parquet file, those it lacks as nulls (strings for ids, floats for values)."""
    present = set(pq.read_schema(path).names)
    table = pq.read_table(path, columns=[c for c in columns if c in present])
    for name in columns:
        if name not in present:
            kind = {
                "rank_value": pa.float64(),
                "episode_success": pa.bool_(),
                "exploit": pa.bool_(),
                "step_idx": pa.int32(),
            }.get(name, pa.string())
            table = table.append_column(name, pa.nulls(table.num_rows, type=kind))
    return table.select(columns)


def groups_and_values(table: pa.Table, index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per example: its group as an int (-1: in no group), numbered through ``index`` (shared by the
    splits), and its rank value (0 where there is none)."""
    ids = table["group_id"].to_pylist() if "group_id" in table.column_names else [None] * table.num_rows
    raw = table["rank_value"].to_pylist() if "rank_value" in table.column_names else [None] * table.num_rows
    groups = np.array([-1 if g is None else index.setdefault(g, len(index)) for g in ids], dtype=np.int64)
    values = np.array([0.0 if v is None else v for v in raw], dtype=np.float32)
    return groups, values


def states_and_labels(table: pa.Table) -> tuple[list[StepState], np.ndarray]:
    instructions = table["instruction"].to_pylist()
    histories = table["history"].to_pylist()
    screens = table["screen_lines"].to_pylist()
    actions = table["action"].to_pylist()
    states = [
        StepState(i or "", tuple(h or ()), tuple(s or ()), a)
        for i, h, s, a in zip(instructions, histories, screens, actions, strict=True)
    ]
    return states, np.asarray(table["label"].to_pylist(), dtype=np.float32)


#: Seed of the sample ``--max_train_examples`` / ``--max_eval_examples`` take (fixed: a rerun trains
#: on the same examples).
SAMPLE_SEED = 0


def split_table(table: pa.Table, split: str, limit: int | None) -> pa.Table:
    """The rows of one split; with ``limit``, a seeded uniform sample of them (whole groups of
    alternatives, in the table's order). Not the first rows: the table is ordered by episode, so a
    prefix would hold the demonstrations and none of the agent's own episodes."""
    part = table.filter(pc.equal(table["split"], split))  # type: ignore[attr-defined]  # see read_examples
    if limit is None or part.num_rows <= limit:
        return part
    groups = part["group_id"].to_pylist() if "group_id" in part.column_names else [None] * part.num_rows
    units: dict[object, list[int]] = {}
    for i, g in enumerate(groups):
        units.setdefault(("row", i) if g is None else ("group", g), []).append(i)
    order = np.random.default_rng(SAMPLE_SEED).permutation(len(units))
    members = list(units.values())
    chosen: list[int] = []
    for u in order:
        if len(chosen) + len(members[u]) > limit:
            continue
        chosen += members[u]
        if len(chosen) == limit:
            break
    return part.take(pa.array(sorted(chosen), type=pa.int64()))


class IndexDataset(torch.utils.data.Dataset):
    """Examples of one split by index; the collator does the work."""

    def __init__(self, n: int, split: str) -> None:
        self.n, self.split = n, split

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"item": i, "split": self.split}


class SplitCollator:
    """Dispatches a batch to the collator of its split (train / validation)."""

    def __init__(self, **by_split) -> None:
        self.by_split = by_split

    def __call__(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        return self.by_split[batch[0]["split"]](batch)


class EpochLengthGroupedSampler(torch.utils.data.Sampler):
    """Length-grouped batches (``transformers``' LengthGroupedSampler), reseeded per epoch with
    ``seed + epoch`` so that a resumed run replays exactly the order the killed run would have used."""

    def __init__(self, batch_size: int, lengths: list[int], seed: int) -> None:
        self.batch_size, self.lengths, self.seed, self.epoch = batch_size, lengths, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        from transformers.trainer_pt_utils import get_length_grouped_indices

        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=generator))


class GroupedLengthSampler(EpochLengthGroupedSampler):
    """Length-grouped batches that keep the alternatives of one state together (the pairwise loss
    compares them within a batch): the units shuffled are whole groups (an example outside any group
    is a unit of one), ordered by length within mega-batches of 50 batches as ``transformers``'
    sampler does, reseeded per epoch with ``seed + epoch`` (a resumed run replays the order). A
    group is split only where it straddles a batch boundary."""

    def __init__(self, batch_size: int, lengths: list[int], groups: np.ndarray, seed: int) -> None:
        super().__init__(batch_size, lengths, seed)
        members: dict[int, list[int]] = {}
        units: list[list[int]] = []
        for i, g in enumerate(groups.tolist()):
            if g < 0:
                units.append([i])
            else:
                members.setdefault(g, []).append(i)
        self.units = units + list(members.values())

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.units), generator=generator).tolist()
        mega = 50 * self.batch_size
        out: list[int] = []
        chunk: list[list[int]] = []
        size = 0
        for u in order:
            chunk.append(self.units[u])
            size += len(self.units[u])
            if size >= mega:
                out += _longest_first(chunk, self.lengths)
                chunk, size = [], 0
        out += _longest_first(chunk, self.lengths)
        return iter(out)


def _longest_first(units: list[list[int]], lengths: list[int]) -> list[int]:
    ranked = sorted(units, key=lambda unit: -max(lengths[i] for i in unit))
    return [i for unit in ranked for i in unit]


class SegmentCollator:
    """Batches for frozen_segments mode: cached segment embeddings gathered per state."""

    def __init__(
        self,
        features,
        labels: np.ndarray,
        matrix: torch.Tensor,
        groups: Groups = NO_GROUPS,
        weights: np.ndarray | None = None,
    ) -> None:
        self.features, self.labels, self.matrix, self.groups = features, labels, matrix, groups
        self.weights = weights

    def __call__(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        items = np.array([b["item"] for b in batch], dtype=np.int64)
        out = collate_segments(self.features, items, self.matrix)
        out["labels"] = torch.from_numpy(self.labels[items])
        self.groups.add_to(out, items)
        add_weights(out, self.weights, items)
        return out


def add_weights(out: dict[str, torch.Tensor], weights: np.ndarray | None, items: Sequence[int] | np.ndarray) -> None:
    """The batch's loss weights (within-task balancing), where the split has them."""
    if weights is not None:
        out["weights"] = torch.from_numpy(weights[np.asarray(items, dtype=np.int64)])


class PromptCollator:
    """Batches for full mode: the kind's prompt rendered, truncated and tokenized."""

    def __init__(
        self,
        states: list[StepState],
        labels: np.ndarray,
        tokenizer,
        config: RewardModelConfig,
        groups: Groups = NO_GROUPS,
        weights: np.ndarray | None = None,
    ) -> None:
        self.states, self.labels, self.tokenizer, self.config, self.groups = states, labels, tokenizer, config, groups
        self.weights = weights

    def __call__(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        items = [b["item"] for b in batch]
        texts = prompt_texts([self.states[i] for i in items], self.config.kind, self.tokenizer, self.config)
        out = tokenize_prompts(texts, self.tokenizer, self.config.max_length)
        out["labels"] = torch.from_numpy(self.labels[items])
        self.groups.add_to(out, items)
        add_weights(out, self.weights, items)
        return out


def regression_metrics(scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Validation metrics on sigmoid outputs: MAE, RMSE, BCE, and accuracy at 0.5 vs labels >= 0.5."""
    scores = np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)
    labels = labels.astype(np.float64)
    bce = -np.mean(labels * np.log(scores) + (1 - labels) * np.log(1 - scores))
    return {
        "mae": float(np.mean(np.abs(scores - labels))),
        "rmse": float(np.sqrt(np.mean((scores - labels) ** 2))),
        "bce": float(bce),
        "accuracy_at_0.5": float(np.mean((scores >= 0.5) == (labels >= 0.5))),
    }


def compute_metrics(eval_prediction) -> dict[str, float]:
    logits = np.asarray(eval_prediction.predictions, dtype=np.float64).reshape(-1)
    labels = np.asarray(eval_prediction.label_ids, dtype=np.float64).reshape(-1)
    return regression_metrics(1.0 / (1.0 + np.exp(-logits)), labels)


def episode_metrics(episodes: SplitEpisodes, order: Sequence[int], kind: str):
    """``compute_metrics`` plus ``within_task_auc``: the validation episodes' scores against their
    success within tasks (:func:`validation_within_task_auc`). ``order``: the validation examples'
    indices in the order the Trainer predicts them (its eval sampler's)."""
    ordered = SplitEpisodes(
        [episodes.task_ids[i] for i in order],
        [episodes.episode_ids[i] for i in order],
        [episodes.step_idx[i] for i in order],
        [episodes.success[i] for i in order],
    )
    weakest = kind in STEP_JUDGE_KINDS

    def metrics(eval_prediction) -> dict[str, float]:
        out = compute_metrics(eval_prediction)
        logits = np.asarray(eval_prediction.predictions, dtype=np.float64).reshape(-1)
        if len(logits) == len(order):
            out["within_task_auc"] = validation_within_task_auc(
                logits, ordered.task_ids, ordered.episode_ids, ordered.step_idx, ordered.success, weakest_step=weakest
            )
        return out

    return metrics


def resolve_selection(select_by: str, eval_episodes: SplitEpisodes) -> str:
    """The measure early stopping and the best checkpoint use: ``loss`` or ``within_task_auc``
    (``auto``: the AUC where some validation task has a successful and a failed episode)."""
    if select_by not in ("auto", "loss", "within_task_auc"):
        raise ValueError(f"--select_by must be auto, loss or within_task_auc, not {select_by!r}")
    contrast = has_within_task_contrast(eval_episodes.task_ids, eval_episodes.success)
    if select_by == "within_task_auc" and not contrast:
        raise ValueError("--select_by within_task_auc: no validation task has both a successful and a failed episode")
    return "within_task_auc" if select_by == "within_task_auc" or (select_by == "auto" and contrast) else "loss"
