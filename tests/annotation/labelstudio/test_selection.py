"""Active selection: uncertainty, stratification by task and outcome, budgets, spot checks, match pairs,
the budget's shares by episode source and disagreements first."""

from __future__ import annotations

from collections import Counter

import pytest

from annotation.labelstudio.selection import (
    DEFAULT_SOURCE_SHARES,
    MatchPairCandidate,
    Selected,
    StepCandidate,
    allocate_budget,
    allocate_by_share,
    is_disagreement,
    match_item_key,
    match_uncertainty,
    push_order,
    select_by_source,
    select_match_pairs,
    select_steps,
    share_key,
    uncertainty,
    validate_shares,
)


def cand(episode: str, step: int, task: str = "t", success: bool = True, **labels) -> StepCandidate:
    return StepCandidate(episode_id=episode, step_idx=step, task_id=task, success=success, **labels)


def test_uncertainty_prefers_the_larger_disagreement():
    assert uncertainty(cand("e", 0, lcs_progress=0.2, env_progress=0.8)) == (0.6000000000000001, "label_disagreement")
    # a key-step disagreement counts as at least 0.5 even with close progress values
    score, reason = uncertainty(cand("e", 0, lcs_progress=0.5, env_progress=0.5, lcs_key_step=True, env_key_step=False))
    assert (score, reason) == (0.5, "label_disagreement")
    # the model against the labels' consensus
    assert uncertainty(cand("e", 0, lcs_progress=0.2, env_progress=0.4, model_progress=1.0)) == (
        0.7,
        "model_disagreement",
    )
    assert uncertainty(cand("e", 0, lcs_progress=0.9, model_progress=0.1))[1] == "model_disagreement"
    # nothing to compare: in the middle, after clear disagreements and before clear agreements
    assert uncertainty(cand("e", 0, lcs_progress=0.3)) == (0.5, "no_signal")
    assert uncertainty(cand("e", 0, lcs_progress=0.3, env_progress=0.3))[0] == 0.0


def test_allocate_budget_is_even_and_hands_leftovers_on():
    assert allocate_budget({"a": 100, "b": 100, "c": 100}, 30) == {"a": 10, "b": 10, "c": 10}
    # a small stratum takes all it has; the others share the rest
    assert allocate_budget({"a": 2, "b": 100, "c": 100}, 30) == {"a": 2, "b": 14, "c": 14}
    assert sum(allocate_budget({"a": 5, "b": 7}, 100).values()) == 12
    assert allocate_budget({"a": 3, "b": 3}, 0) == {"a": 0, "b": 0}


def test_selection_is_stratified_by_task_and_outcome_and_ranked_by_uncertainty():
    candidates = []
    for task in ("common", "rare"):
        for success in (True, False):
            n_episodes = 50 if task == "common" and success else 3
            for e in range(n_episodes):
                for s in range(4):
                    gap = 0.1 * ((e + s) % 10)
                    candidates.append(
                        cand(f"{task}-{success}-{e}", s, task, success, lcs_progress=0.5, env_progress=0.5 + gap / 2)
                    )
    picked = select_steps(candidates, 40, spot_check_share=0.0, max_per_episode=2)
    strata = Counter(p.candidate.stratum for p in picked)
    assert len(picked) == 40
    assert set(strata) == {"common|success", "common|failure", "rare|success", "rare|failure"}
    assert min(strata.values()) >= 6  # failures and the rare task are not drowned by the big stratum
    per_episode = Counter(p.candidate.episode_id for p in picked)
    assert max(per_episode.values()) <= 2
    big = sorted((p for p in picked if p.candidate.stratum == "common|success"), key=lambda p: p.rank_in_stratum)
    assert [p.uncertainty for p in big] == sorted((p.uncertainty for p in big), reverse=True)


def test_selection_spot_checks_exclusions_and_determinism():
    candidates = [
        cand(
            f"e{e}", s, f"t{e % 3}", e % 2 == 0, lcs_progress=0.1 * s, env_progress=0.1 * s + (0.5 if e % 5 == 0 else 0)
        )
        for e in range(60)
        for s in range(5)
    ]
    picked = select_steps(candidates, 50, spot_check_share=0.2, seed=3)
    reasons = Counter(p.reason for p in picked)
    assert reasons["spot_check"] == 10 and len(picked) == 50
    assert len({(p.candidate.episode_id, p.candidate.step_idx) for p in picked}) == 50  # no step twice
    assert select_steps(candidates, 50, spot_check_share=0.2, seed=3) == picked  # reproducible
    exclude = {(p.candidate.episode_id, p.candidate.step_idx) for p in picked}
    again = select_steps(candidates, 50, spot_check_share=0.2, seed=3, exclude=exclude)
    assert not exclude & {(p.candidate.episode_id, p.candidate.step_idx) for p in again}
    assert select_steps(candidates, 0) == []
    assert len(select_steps(candidates[:3], 10, max_per_episode=5)) == 3  # fewer candidates than budget


def test_match_pairs_nearest_the_threshold_first():
    assert match_uncertainty(0.75, 0.75) == 1.0
    assert match_uncertainty(0.0, 0.75) == 0.0
    pairs = [
        MatchPairCandidate("set", m, f"milestone {m}", f"ep{e}", s, "task", e % 2 == 0, sim)
        for m in range(2)
        for e in range(4)
        for s, sim in enumerate((0.1, 0.5, 0.74, 0.95))
    ]
    chosen = select_match_pairs(pairs, 6, threshold=0.75)
    assert len(chosen) == 6
    assert {p.stratum for p, _ in chosen} == {"task|success", "task|failure"}
    assert all(
        p.similarity in (0.74, 0.95) for p, _ in chosen
    )  # best match and nearest-threshold per (milestone, episode)
    keys = {match_item_key(p) for p, _ in chosen}
    assert not keys & {match_item_key(p) for p, _ in select_match_pairs(pairs, 6, threshold=0.75, exclude=keys)}


# -- the budget by episode source -------------------------------------------------------------------


def sourced(source: str, n_episodes: int, *, gap: float, tasks: int = 3, steps: int = 4) -> list[StepCandidate]:
    """Candidates of one episode source whose LCS and environment labels differ by ``gap``."""
    return [
        cand(
            f"{source}/{e}",
            s,
            f"t{e % tasks}",
            e % 2 == 0,
            episode_source=source,
            lcs_progress=0.2,
            env_progress=0.2 + gap,
        )
        for e in range(n_episodes)
        for s in range(steps)
    ]


def test_share_keys_name_a_source_its_family_or_any():
    shares = {"human_demo": 0.6, "synthetic": 0.1, "synthetic:mismatched_instruction": 0.0}
    assert share_key("human_demo", shares) == "human_demo"
    assert share_key("synthetic:random_walk", shares) == "synthetic"  # the family
    assert share_key("synthetic:mismatched_instruction", shares) == "synthetic:mismatched_instruction"
    assert share_key("rollout", shares) is None and share_key("rollout", shares | {"*": 1.0}) == "*"
    assert share_key(None, {"*": 1.0}) == "*"
    assert DEFAULT_SOURCE_SHARES["synthetic:mismatched_instruction"] == 0.0
    assert DEFAULT_SOURCE_SHARES["human_demo"] + DEFAULT_SOURCE_SHARES["rollout"] >= 0.8
    with pytest.raises(ValueError, match="must be a number >= 0"):
        validate_shares({"human_demo": -1})
    with pytest.raises(ValueError, match="every source share is 0"):
        validate_shares({"human_demo": 0, "rollout": 0})


def test_allocate_by_share_is_proportional_and_hands_leftovers_on():
    assert allocate_by_share({"h": 1000, "r": 1000, "s": 1000}, {"h": 0.6, "r": 0.3, "s": 0.1}, 500) == {
        "h": 300,
        "r": 150,
        "s": 50,
    }
    # few rollouts: what they cannot take goes to the others in proportion (6:1), a zero share gets nothing
    quota = allocate_by_share({"h": 1000, "r": 80, "s": 1000, "m": 1000}, {"h": 0.6, "r": 0.3, "s": 0.1, "m": 0}, 500)
    assert quota == {"h": 360, "r": 80, "s": 60, "m": 0}
    assert sum(allocate_by_share({"h": 5, "s": 7}, {"h": 1, "s": 1}, 100).values()) == 12
    assert allocate_by_share({"h": 10, "m": 10}, {"h": 1, "m": 0}, 15) == {"h": 10, "m": 0}  # never a zero share
    assert sum(allocate_by_share({"a": 9, "b": 9, "c": 9}, {"a": 1, "b": 1, "c": 1}, 10).values()) == 10  # rounding


def test_the_budget_goes_to_real_trajectories_first_and_never_to_mismatched_instructions():
    candidates = (
        sourced("human_demo", 40, gap=0.3)
        + sourced("rollout", 5, gap=0.3)
        + sourced("synthetic:random_walk", 40, gap=0.9)  # louder disagreements than any real step
        + sourced("synthetic:mismatched_instruction", 40, gap=1.0)
    )
    by_source = Counter(s.candidate.episode_source for s in select_steps(candidates, 100))
    assert by_source["synthetic:mismatched_instruction"] > 25  # what the selection did before sharing by source

    picked, report = select_by_source(candidates, 100, seed=1)
    by_source = Counter(s.candidate.episode_source for s in picked)
    assert len(picked) == 100 and "synthetic:mismatched_instruction" not in by_source
    assert by_source["rollout"] == 10  # all it has (5 episodes x at most 2 steps), the rest handed on
    assert by_source["synthetic:random_walk"] == 13 and by_source["human_demo"] == 77  # 0.1 : 0.6 of the other 90
    assert [s.candidate.episode_source for s in picked[:77]] == ["human_demo"] * 77  # the first items are real
    assert {s.candidate.episode_source for s in picked[77:87]} == {"rollout"}
    rows = {a.key: a for a in report}
    assert list(rows) == ["human_demo", "rollout", "synthetic", "synthetic:mismatched_instruction"]
    assert (rows["synthetic"].budget, rows["synthetic"].selected, rows["synthetic"].sources) == (
        13,
        13,
        ("synthetic:random_walk",),
    )
    assert (
        rows["synthetic:mismatched_instruction"].candidates == 160
        and rows["synthetic:mismatched_instruction"].budget == 0
    )

    # configurable: synthetic episodes only (the family: both kinds), a source no key covers gets nothing
    picked, report = select_by_source(candidates, 20, {"synthetic": 1.0})
    assert {s.candidate.episode_source.split(":")[0] for s in picked} == {"synthetic"}
    assert {a.key: a.candidates for a in report}["-"] == 160 + 20  # human_demo and rollout


def test_disagreements_come_first_within_a_source():
    agree = [
        cand(f"a{e}", s, f"t{e % 4}", True, episode_source="human_demo", lcs_progress=0.5, env_progress=0.5)
        for e in range(20)
        for s in range(3)
    ]
    nothing = [
        cand(f"n{e}", s, "other", False, episode_source="human_demo", lcs_progress=0.5)
        for e in range(20)
        for s in range(3)
    ]
    disagree = [
        cand(f"d{e}", s, "t0", True, episode_source="human_demo", lcs_progress=0.2, env_progress=0.5)
        for e in range(10)
        for s in range(3)
    ]
    candidates = agree + nothing + disagree
    # by uncertainty alone, "nothing to compare" (0.5) outranks a 0.3 disagreement and its strata take turns
    plain = select_steps(candidates, 20, spot_check_share=0.0)
    assert sum(s.reason == "label_disagreement" and s.uncertainty >= 0.25 for s in plain) < 20

    picked, report = select_by_source(candidates, 30, spot_check_share=0.1)
    main = [s for s in picked if s.reason != "spot_check"]
    assert len(main) == 27 and len(picked) == 30
    assert [s.candidate.episode_id[0] for s in main[:20]] == ["d"] * 20  # all 20 disagreements (2 per episode) first
    assert all(is_disagreement(s.uncertainty, s.reason) for s in main[:20])
    assert [s.tier for s in main] == sorted(s.tier for s in main)
    assert report[0].selected_disagreements == 20 and report[0].disagreements == 30
    spots = [i for i, s in enumerate(picked) if s.reason == "spot_check"]
    assert spots[0] > 0 and spots[-1] < len(picked) - 1  # spread through, not all at the end
    # the same selection again
    assert select_by_source(candidates, 30, spot_check_share=0.1)[0] == picked
    exclude = {(s.candidate.episode_id, s.candidate.step_idx) for s in picked}
    again, _ = select_by_source(candidates, 30, exclude=exclude)
    assert not exclude & {(s.candidate.episode_id, s.candidate.step_idx) for s in again}


def test_push_order_puts_groups_in_turn_and_strata_in_turn():
    a = [Selected(cand(f"a{i}", 0, f"t{i % 2}"), 0.9, "label_disagreement", i // 2) for i in range(4)]
    b = [Selected(cand("b", 0, "t"), 0.9, "no_signal", 0, tier=1), Selected(cand("c", 0, "t"), 0.1, "spot_check", 0, 2)]
    order = push_order([a + b[:1], b[1:]])
    assert [s.candidate.episode_id for s in order] == ["a0", "a1", "a2", "a3", "b", "c"]
