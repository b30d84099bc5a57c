"""Eq. (3) grouping without all pairs (annotation.progress.grouping) gives the all-pairs groups; the
faster pure-Python paths decide as the code they replace did."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import annotation.progress.grouping as grouping_module
import annotation.progress.key_steps as progress_module
from annotation.progress.grouping import (
    TaskSequences,
    UpperBounds,
    deduplicate,
    greedy_groups,
    highest_similarity,
    similarity_graphs,
)
from annotation.progress.instruction_relative import ScreenStates, named_by_instruction, screen_signature
from annotation.progress.key_steps import label_corpus
from annotation.progress.recipes import Episode, _similarity_matrices, build_recipe_libraries, group_by_similarity
from annotation.progress.soft_lcs import SequenceStore, build_match_table, soft_lcs_scores
from annotation.progress.text_similarity import HashingTextEmbedder
from warehouse.model import Action, ActionType, Screen, UIElement

FIELDS = ["user", "pass", "ok", "cancel", "next"]


def _action(code: str) -> Action:
    """``c<k>``: click field k; ``t<k><word>``: type word into field k; ``n``: nothing."""
    if code == "n":
        return Action(ActionType.NOTHING)
    target = UIElement(ref=code[1], role="textbox", element_id=FIELDS[int(code[1])])
    if code[0] == "c":
        return Action(ActionType.CLICK, target=target)
    return Action(ActionType.INPUT, target=target, text=code[2:])


STEP = st.sampled_from(["c0", "c1", "c2", "c3", "c4", "n", "t0alice", "t0bob", "t1secret", "t1hunter2"])
TRAJECTORIES = st.lists(st.lists(STEP, min_size=0, max_size=7), min_size=2, max_size=14)


def _with_duplicates(trajectories: list[list[str]], data: st.DataObject) -> list[tuple[Action, ...]]:
    """The trajectories, some repeated (identical sequences form one class in the grouping)."""
    repeats = data.draw(st.lists(st.integers(0, len(trajectories) - 1), max_size=6))
    return [tuple(_action(c) for c in t) for t in trajectories + [trajectories[r] for r in repeats]]


def _graph(codes, table, theta, norm, prefilter):
    class_of, distinct, counts = deduplicate(codes)
    task = TaskSequences(class_of, counts, SequenceStore.from_sequences(distinct), table.scores, table)
    return task, similarity_graphs([task], theta, norm, prefilter=prefilter)[0]


@settings(max_examples=40, deadline=None)
@given(trajectories=TRAJECTORIES, theta=st.sampled_from([0.3, 0.5, 0.6, 0.8]), data=st.data())
def test_prefiltered_and_deduplicated_grouping_equal_all_pairs(trajectories, theta, data):
    actions = _with_duplicates(trajectories, data)
    mode = data.draw(st.sampled_from(["hard", "soft"]))
    norm = data.draw(st.sampled_from(["min", "mean"]))
    table = build_match_table(actions, HashingTextEmbedder() if mode == "soft" else None, mode=mode)
    codes = [table.encode(a) for a in actions]
    matrix = _similarity_matrices([codes], [table.scores], norm)[0]
    expected = group_by_similarity(matrix, theta)
    old_minimum = grouping_module.PREFILTER_MIN_CLASSES
    grouping_module.PREFILTER_MIN_CLASSES = 0  # bound every pair, however small the task
    try:
        for prefilter in (False, True):
            task, graph = _graph(codes, table, theta, norm, prefilter)
            assert greedy_groups(graph) == expected
            # Where Sim was computed it is the all-pairs Sim; pruned pairs are below theta.
            computed = ~np.isnan(graph.submatrix(range(len(codes))))
            full = graph.submatrix(range(len(codes)))
            assert np.array_equal(full[computed], matrix[computed])
            assert (matrix[~computed] < theta).all()
            off_diagonal = matrix[~np.eye(len(codes), dtype=bool)]
            assert highest_similarity(task, graph, norm) == pytest.approx(off_diagonal.max(), abs=1e-12)
    finally:
        grouping_module.PREFILTER_MIN_CLASSES = old_minimum


@settings(max_examples=40, deadline=None)
@given(trajectories=TRAJECTORIES, mode=st.sampled_from(["hard", "soft"]))
def test_the_upper_bound_is_never_below_the_soft_lcs(trajectories, mode):
    actions = [tuple(_action(c) for c in t) for t in trajectories]
    table = build_match_table(actions, HashingTextEmbedder() if mode == "soft" else None, mode=mode)
    codes = [table.encode(a) for a in actions]
    n = len(codes)
    a, b = np.triu_indices(n, k=1)
    scores = soft_lcs_scores([codes[i] for i in a], [codes[j] for j in b], table.scores)
    for source in (table, table.scores):  # match classes from the actions, or from the matrix
        bounds = UpperBounds(codes, source).pairs(a.astype(np.int64), b.astype(np.int64))
        assert (bounds >= scores - 1e-9).all()


def test_recipe_libraries_are_the_same_whatever_the_grouping():
    rng = np.random.default_rng(3)
    steps = ["c0", "c1", "c2", "c3", "t0alice", "t1secret", "n"]
    episodes = [
        Episode(f"e{k}", tuple(_action(s) for s in rng.choice(steps, size=int(rng.integers(2, 7)))), True)
        for k in range(60)
    ]
    episodes += [Episode(f"d{k}", episodes[k].actions, True) for k in range(20)]  # duplicates
    table = build_match_table([e.actions for e in episodes], HashingTextEmbedder(), mode="soft")
    old_minimum = grouping_module.PREFILTER_MIN_CLASSES
    grouping_module.PREFILTER_MIN_CLASSES = 0
    try:
        libraries = {
            g: build_recipe_libraries({"t": episodes}, {"t": table}, theta=0.5, grouping=g)["t"]
            for g in ("all_pairs", "deduplicated", "prefiltered")
        }
    finally:
        grouping_module.PREFILTER_MIN_CLASSES = old_minimum
    reference = libraries["all_pairs"]
    assert reference.recipes
    for g, library in libraries.items():
        assert library.recipes == reference.recipes, g
        assert library.reason == reference.reason
    assert libraries["prefiltered"].pairs_scored <= libraries["deduplicated"].pairs_scored
    assert libraries["deduplicated"].pairs_total < reference.pairs_total  # the duplicates' pairs are shared


def test_pruned_recipe_choice_labels_as_scoring_every_pair(monkeypatch):
    rng = np.random.default_rng(5)
    steps = ["c0", "c1", "c2", "c3", "c4", "t0alice", "t0bob", "t1secret"]
    episodes = {
        "t": [
            Episode(f"e{k}", tuple(_action(s) for s in rng.choice(steps, size=int(rng.integers(1, 8)))), k % 3 != 0)
            for k in range(90)
        ]
    }
    embed = HashingTextEmbedder()
    unpruned = label_corpus(episodes, embed, theta=0.4, mode="soft")
    monkeypatch.setattr(progress_module, "PRUNE_MIN_PAIRS", 0)
    monkeypatch.setattr(progress_module, "PRUNE_MIN_RECIPES", 1)
    pruned = label_corpus(episodes, embed, theta=0.4, mode="soft")
    assert len(unpruned.recipes["t"].recipes) >= 2
    assert pruned.labels == unpruned.labels


def _regex_named(text: str, instruction: str) -> bool:
    """The code that :func:`named_by_instruction` replaced (a compiled pattern per text)."""
    wanted = " ".join(text.split()).casefold()
    if not wanted:
        return False
    left = r"(?<!\w)" if re.match(r"\w", wanted[0]) else ""
    right = r"(?!\w)" if re.match(r"\w", wanted[-1]) else ""
    return re.search(left + re.escape(wanted) + right, " ".join(instruction.split()).casefold()) is not None


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab $_1é. ", max_size=5),
    instruction=st.text(alphabet="ab $_1é. É", max_size=14),
)
def test_named_by_instruction_decides_as_the_regex_did(text, instruction):
    assert named_by_instruction(text, instruction) == _regex_named(text, instruction)


def test_screen_states_are_equal_iff_signatures_are():
    root = UIElement(ref="0", role="body", bounds=(0, 0, 100, 100))

    def screen(text, x=10.0):
        return Screen((root, UIElement(ref="1", role="button", text=text, bounds=(x, 10, x + 20, 30))))

    screens = [screen("ok"), screen("ok"), screen("no"), screen("ok", x=500.0), screen("gone", x=500.0)]
    states = ScreenStates()
    ids = [states.state(s) for s in screens] + [states.state(screens[0])]
    for i, a in enumerate(screens):
        for j, b in enumerate(screens):
            assert (ids[i] == ids[j]) == (screen_signature(a) == screen_signature(b))
    assert ids[-1] == ids[0] and len(states) == len(screens)
