"""Active selection: uncertainty, stratification by task and outcome, budgets, spot checks, match pairs."""

from __future__ import annotations

from collections import Counter

from annotation.labelstudio.selection import (
    MatchPairCandidate,
    StepCandidate,
    allocate_budget,
    match_item_key,
    match_uncertainty,
    select_match_pairs,
    select_steps,
    uncertainty,
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
