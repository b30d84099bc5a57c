"""Key-step discovery and progress labels (ProgRM §2.2 stages 2-3, Eq. 4), LCS and milestone variants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from annotation.progress.key_steps import (
    label_corpus,
    label_episodes,
    label_with_milestones,
    milestone_progress,
    progress_from_alignment,
)
from annotation.progress.recipes import Episode, build_recipe_library
from annotation.progress.soft_lcs import build_match_table
from annotation.progress.text_similarity import HashingTextEmbedder
from warehouse.model import Action, ActionType, UIElement


def click(element_id: str) -> Action:
    return Action(ActionType.CLICK, UIElement(ref=element_id, role="button", element_id=element_id))


def trajectory(spec: str) -> tuple[Action, ...]:
    """'abc' -> CLICK a, CLICK b, CLICK c; '.' is NOTHING, '<' is GOBACK."""
    special = {".": Action(ActionType.NOTHING), "<": Action(ActionType.GOBACK)}
    return tuple(special.get(c) or click(c) for c in spec)


def test_progress_from_alignment_follows_section_2_2() -> None:
    # Recipe of length 4; steps 1, 3, 4 match recipe positions 0, 1, 3 (position 2 skipped).
    progress, is_key = progress_from_alignment(6, [1, 3, 4], [0, 1, 3], 4)
    assert progress.tolist() == [0.0, 0.25, 0.25, 0.5, 1.0, 1.0]
    assert is_key.tolist() == [False, True, False, True, True, False]
    counted, _ = progress_from_alignment(6, [1, 3, 4], [0, 1, 3], 4, kappa_rule="matched_count")
    assert counted.tolist() == [0.0, 0.25, 0.25, 0.5, 0.75, 0.75]


def test_progress_from_alignment_rejects_a_non_monotone_alignment() -> None:
    with pytest.raises(ValueError):
        progress_from_alignment(3, [2, 1], [0, 1], 2)


def test_key_steps_and_labels_on_a_hand_made_task() -> None:
    episodes = [
        Episode("s1", trajectory("sabc"), True),  # s = search, a = open article, b = bookmark, c = confirm
        Episode("s2", trajectory("s.abc"), True),
        Episode("f1", trajectory("xsa<ab"), False),  # detour, go back, redo a, stop before c
        Episode("f2", trajectory("xyz"), False),
    ]
    table = build_match_table([e.actions for e in episodes])
    library = build_recipe_library("t", episodes, table)
    (recipe,) = library.recipes
    assert "".join(a.target.element_id for a in recipe.actions) == "sabc"
    labels = {lab.episode_id: lab for lab in label_episodes(library, episodes, table)}

    assert labels["s1"].progress == (0.25, 0.5, 0.75, 1.0) and labels["s1"].key_steps == (0, 1, 2, 3)
    assert labels["s2"].progress == (0.25, 0.25, 0.5, 0.75, 1.0) and labels["s2"].key_steps == (0, 2, 3, 4)
    # The repeated "a" is credited where it was redone (latest match); the failed run reaches 3/4.
    assert labels["f1"].key_steps == (1, 4, 5)
    assert labels["f1"].progress == (0.0, 0.25, 0.25, 0.25, 0.5, 0.75)
    assert labels["f1"].completion_ratio == 0.75
    assert labels["f2"].progress == (0.0, 0.0, 0.0) and labels["f2"].key_steps == ()
    assert {lab.recipe_id for lab in labels.values()} == {recipe.recipe_id}
    assert all(step.recipe_id == recipe.recipe_id for step in labels["f1"].steps)


def test_each_trajectory_uses_the_recipe_with_highest_completion_ratio() -> None:
    episodes = [
        Episode("p1", trajectory("abcd"), True),
        Episode("p2", trajectory("abcd"), True),
        Episode("q1", trajectory("vwxyz"), True),
        Episode("q2", trajectory("vwxyz"), True),
        Episode("mixed", trajectory("abvwxy"), False),  # CR 2/4 for "abcd", 4/5 for "vwxyz"
    ]
    result = label_corpus({"t": episodes}, None, mode="hard")
    recipe_of = {r.member_episode_ids[0]: r.recipe_id for r in result.recipes["t"].recipes}
    mixed = result.labels["mixed"]
    assert mixed.recipe_id == recipe_of["q1"] and mixed.completion_ratio == pytest.approx(0.8)
    assert mixed.key_steps == (2, 3, 4, 5)


def test_episodes_of_tasks_without_recipes_are_not_labelled() -> None:
    corpus = {"t": [Episode("only", trajectory("ab"), True), Episode("lost", trajectory("a"), False)]}
    result = label_corpus(corpus, None, mode="hard")
    for label in result.labels.values():
        assert not label.labelled and label.steps == ()
        assert "only one successful trajectory" in label.reason


@st.composite
def corpora(draw: st.DrawFn) -> dict[str, list[Episode]]:
    spec = st.text(alphabet="abcde.<", max_size=14)
    corpus = {}
    for t in range(draw(st.integers(1, 3))):
        corpus[f"t{t}"] = [
            Episode(f"t{t}-{k}", trajectory(draw(spec)), draw(st.booleans())) for k in range(draw(st.integers(0, 6)))
        ]
    return corpus


@settings(max_examples=150, deadline=None)
@given(corpora(), st.sampled_from(["recipe_position", "matched_count"]))
def test_labels_are_monotone_bounded_and_consistent(corpus: dict[str, list[Episode]], kappa_rule: str) -> None:
    result = label_corpus(corpus, HashingTextEmbedder(), theta=0.5, kappa_rule=kappa_rule)
    for episodes in corpus.values():
        for e in episodes:
            label = result.labels[e.episode_id]
            if not label.labelled:
                continue
            progress = np.array(label.progress)
            assert len(progress) == len(e.actions)
            assert ((progress >= 0) & (progress <= 1)).all()
            assert (np.diff(progress) >= 0).all()
            # Progress only changes at key steps, and each key step raises it.
            previous = 0.0
            for step in label.steps:
                assert (step.progress > previous) == step.is_key_step
                previous = step.progress
            assert 0.0 <= label.completion_ratio <= 1.0


def test_milestone_labels_on_a_hand_made_example() -> None:
    milestones = ["search", "open_article", "bookmark"]
    hits = [[], ["search"], [], ["bookmark"], ["open_article"], [], ["bookmark", "unrelated"]]
    progress, is_key = milestone_progress(hits, milestones)
    # In order: the early "bookmark" (step 3) does not count; it counts when hit again after step 4.
    assert progress.tolist() == [0.0, 1 / 3, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 1.0]
    assert np.flatnonzero(is_key).tolist() == [1, 4, 6]
    any_order, key_any = milestone_progress(hits, milestones, in_order=False)
    assert any_order.tolist() == [0.0, 1 / 3, 1 / 3, 2 / 3, 1.0, 1.0, 1.0]
    assert np.flatnonzero(key_any).tolist() == [1, 3, 4]


def test_one_step_can_reach_several_milestones() -> None:
    progress, is_key = milestone_progress([["a", "b"], [], ["d", "c"]], ["a", "b", "c", "d"])
    assert progress.tolist() == [0.5, 0.5, 1.0] and is_key.tolist() == [True, False, True]


def test_label_with_milestones() -> None:
    labels = label_with_milestones("e", [[], ["m1"], []], ["m1", "m2"])
    assert labels.source == "env" and labels.progress == (0.0, 0.5, 0.5) and labels.key_steps == (1,)
    assert labels.completion_ratio == 0.5 and labels.steps[1].recipe_id is None
    none = label_with_milestones("e", [[], []], [])
    assert not none.labelled and "no milestones" in none.reason
