"""Labelling a corpus task group by task group, so memory depends on the largest group, not the corpus.

The labels of ProgRM §2.2 are per task: a task's recipes (Eqs. 3, 10) come from its own
successes and its trajectories are labelled against them (Eq. 4, kappa / |L|). Only one thing
is shared across tasks: the sentence embeddings of Eq. (9), and only through the embedder's
cache. So a corpus can be labelled in *batches of whole tasks* (:func:`stream_labels`):

* ``embed_scope="corpus"`` (default) gives exactly the rows of the all-at-once
  :func:`annotation.progress.labeling.lcs_labels`: a first pass prepares every batch (cleaning, rewriting;
  screens are dropped as soon as a batch is prepared) and collects the INPUT/ANSWER texts of
  each mode; the texts are then embedded in the same calls, in the same order, as the
  all-at-once path makes (a model's embeddings depend slightly on what shares their batch); a
  second pass labels batch by batch. Prepared batches are small (actions without screens) and
  can be spilled to disk (``spill_dir``).
* ``embed_scope="batch"``: one pass, each batch embedding its own texts (the embedder's cache is
  cleared after each batch): memory flat in the corpus size. Rows are the same as with
  ``"corpus"`` for any embedder whose vectors do not depend on what else is embedded with them
  (the hashing embedder); with MiniLM a similarity can move by one step of its 2^-20 grid.

Environment-milestone labels need the screens and are produced in the first pass.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from annotation.progress.instruction_relative import ScreenStates
from annotation.progress.labeling import (
    LCS_METHODS,
    LabelRun,
    LcsMethod,
    PreparedLcs,
    env_labels,
    label_prepared,
    prepare_lcs,
)
from annotation.progress.recipes import DEFAULT_THETA, Grouping
from annotation.progress.text_similarity import Embed
from envs.tasks import TaskSpec
from warehouse.trajectories import Trajectory

EmbedScope = Literal["corpus", "batch"]


@dataclass
class BatchLabels:
    """What one batch of tasks produced: LCS labels per method and milestone labels."""

    index: int
    task_ids: list[str]
    episodes: int
    lcs: dict[LcsMethod, LabelRun] = field(default_factory=dict)
    prepared: dict[LcsMethod, PreparedLcs] = field(default_factory=dict)  # with ``lcs``: what it was labelled from
    env: LabelRun | None = None
    trajectories: list[Trajectory] = field(default_factory=list)  # only with ``keep_trajectories``


@dataclass
class _Prepared:
    index: int
    task_ids: list[str]
    episodes: int
    by_method: dict[LcsMethod, PreparedLcs]


class _Store:
    """Prepared batches kept between the passes: in memory, or pickled to a folder."""

    def __init__(self, spill_dir: Path | None) -> None:
        self.items: list[_Prepared | Path] = []
        self.folder = Path(tempfile.mkdtemp(prefix="labels-", dir=spill_dir)) if spill_dir is not None else None

    def add(self, prepared: _Prepared) -> None:
        if self.folder is None:
            self.items.append(prepared)
            return
        path = self.folder / f"{prepared.index:06d}.pickle"
        with path.open("wb") as f:
            pickle.dump(prepared, f, protocol=pickle.HIGHEST_PROTOCOL)
        self.items.append(path)

    def __iter__(self) -> Iterator[_Prepared]:
        for item in self.items:
            if isinstance(item, Path):
                with item.open("rb") as f:
                    prepared = pickle.load(f)
                item.unlink()
                yield prepared
            else:
                yield item

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _prepare_batch(
    index: int, batch: Sequence[Trajectory], methods: Sequence[LcsMethod], rare_share: float
) -> _Prepared:
    states = ScreenStates()  # screen signatures shared by the batch's trajectories, dropped with it
    by_method = {method: prepare_lcs(batch, method, rare_share=rare_share, states=states) for method in methods}
    task_ids = list(dict.fromkeys(t.task_id for t in batch))
    return _Prepared(index, task_ids, len(batch), by_method)


def stream_labels(
    batches: Iterable[Sequence[Trajectory]],
    embed: Embed | None,
    specs: Mapping[str, TaskSpec] | None,
    *,
    methods: Sequence[LcsMethod] = LCS_METHODS,
    theta: float = DEFAULT_THETA,
    support: float = 0.5,
    rare_share: float = 0.02,
    grouping: Grouping = "prefiltered",
    embed_scope: EmbedScope = "corpus",
    spill_dir: Path | None = None,
    keep_trajectories: Callable[[Trajectory], bool] | None = None,
    version_of: Mapping[str, int] | None = None,
    replay_milestones: bool = False,
) -> Iterator[BatchLabels]:
    """Labels (LCS per method, and milestones when ``specs`` is given) of every batch of whole
    tasks, yielded as soon as each is done (see the module docstring for the two scopes).

    Every trajectory of a task must be in one batch (:func:`warehouse.trajectories.iter_task_batches`
    reads them so). With ``embed_scope="corpus"``, milestone labels come first, batch by batch,
    then the LCS labels. ``keep_trajectories`` selects trajectories to hand back with their
    batch (screens included), e.g. a few to plot. ``version_of``: the library version of
    rebuilt tasks, named by their recipe ids (:func:`annotation.progress.labeling.recipe_id`).
    ``replay_milestones``: milestone labels from the specs replayed, not from the milestones
    recorded online (:func:`annotation.progress.labeling.env_labels`).
    """
    if embed_scope == "batch":
        for index, batch in enumerate(batches):
            prepared = _prepare_batch(index, batch, methods, rare_share)
            out = BatchLabels(index, prepared.task_ids, prepared.episodes)
            if specs is not None:
                out.env = env_labels(batch, specs, replay_milestones=replay_milestones)
            if keep_trajectories is not None:
                out.trajectories = [t for t in batch if keep_trajectories(t)]
            del batch
            for method in methods:
                batch_texts = prepared.by_method[method].texts()
                if batch_texts and embed is not None:
                    embed(sorted(batch_texts))
                out.lcs[method] = label_prepared(
                    prepared.by_method[method],
                    embed,
                    theta=theta,
                    support=support,
                    grouping=grouping,
                    version_of=version_of,
                )
            out.prepared = prepared.by_method
            clear = getattr(embed, "clear", None)
            if callable(clear):
                clear()
            yield out
        return

    store = _Store(spill_dir)
    try:
        texts: dict[str, set[str]] = {method: set() for method in methods}
        for index, batch in enumerate(batches):
            prepared = _prepare_batch(index, batch, methods, rare_share)
            for method in methods:
                texts[method] |= prepared.by_method[method].texts()
            first = BatchLabels(index, prepared.task_ids, prepared.episodes)
            if specs is not None:
                first.env = env_labels(batch, specs, replay_milestones=replay_milestones)
            if keep_trajectories is not None:
                first.trajectories = [t for t in batch if keep_trajectories(t)]
            del batch
            store.add(prepared)
            yield first
        # The embedding calls of the all-at-once path: one per mode, in mode order, over the
        # sorted texts of the whole corpus (the cache then answers every batch).
        if embed is not None:
            for method in methods:
                if texts[method]:
                    embed(sorted(texts[method]))
        del texts
        for prepared in store:
            out = BatchLabels(prepared.index, prepared.task_ids, prepared.episodes)
            for method in methods:
                out.lcs[method] = label_prepared(
                    prepared.by_method[method],
                    embed,
                    theta=theta,
                    support=support,
                    grouping=grouping,
                    version_of=version_of,
                )
            out.prepared = prepared.by_method
            yield out
    finally:
        store.close()
