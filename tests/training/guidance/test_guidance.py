"""Reward-guided agents at inference time, without a browser: candidates of the learned policy
(real MiniLM encoder), best-of-N selection, the PRM / ProgRM-gain verifiers on really trained
reward models, the oracle's plan tracking, the GUI-PRA judge's memory, perception, rubric and
answer parsing, its local mode and its fallbacks when an endpoint is down, slow or talks nonsense,
reflect-and-retry, and every refusal before a rollout."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from envs.policies import PlanTracker, same_action
from envs.protocol import EpisodeContext, EpisodeRecord, StepRecord, StepResult
from envs.task_catalog import load_catalog
from tests.training.llm.llm_fixtures import MINIWOB_ACTIONS, login_screen
from training.base.states import StepState, describe_action, screen_lines
from training.guidance.abstention import fit_margin, fit_verifier_margin
from training.guidance.agent import GuidedPolicy, select, select_with_margin, with_prior
from training.guidance.judge import (
    GLOBAL_PARSE,
    LOCAL_LOOKUP,
    TERMINATE,
    JudgeSettings,
    MemoryStep,
    build_memory,
    extractive_summary,
    global_parse,
    local_lookup,
    parse_judgement,
    parse_tool,
    perceive,
    route_rule,
    rubric_score,
    screen_change,
    split_history,
    tier_of,
)
from training.guidance.proposals import GuidanceError, LearnedProposer, Proposal, rank_candidates
from training.guidance.reflection import AttemptGuidance, Ban, blame_step, next_guidance, pass_at, reflect
from training.guidance.registry import make_verifier
from training.guidance.report import check_best_of_n, guidance_report, report_markdown
from training.guidance.runs import (
    LLM_EPISODE_CLOCK_MS,
    GuidanceSettings,
    episode_id_for,
    paired_delta,
    plan_settings,
    setting_rows,
    verifier_model_id,
)
from training.guidance.storage import evaluation_dataset
from training.guidance.verifiers import EnsembleVerifier, StepView, Verdict, mean_rank, step_ranks
from training.llm.chat_client import ChatClient, ChatEndpoint
from warehouse.catalog import LineageInput, Warehouse
from warehouse.model import Action, ActionType, Screen

LOGIN = load_catalog("miniwob")["login-user"]
INSTRUCTION = 'Enter the username "ada" and the password "xy" into the text fields and press login.'
SLOTS = {"username": "ada", "password": "xy"}


def _context(episode_id: str = "ep-1", max_steps: int = 6) -> EpisodeContext:
    return EpisodeContext(LOGIN.spec, INSTRUCTION, SLOTS, 1, "miniwob", MINIWOB_ACTIONS, max_steps, episode_id)


def _el(screen: Screen, element_id: str):
    return next(e for e in screen.elements if e.element_id == element_id)


def _view(screen: Screen, history: tuple[str, ...] = (), previous: Screen | None = None) -> StepView:
    return StepView(INSTRUCTION, len(history), screen, screen_lines(screen), history, previous_screen=previous)


def _proposals(screen: Screen) -> list[Proposal]:
    actions = [
        Action(ActionType.CLICK, _el(screen, "subbtn")),
        Action(ActionType.INPUT, _el(screen, "username"), text="ada"),
        Action(ActionType.SCROLL, direction="DOWN"),
    ]
    return [Proposal(a, describe_action(a, screen), -float(i), i) for i, a in enumerate(actions)]


def _record(actions: list[Action], *, success: bool = False, end: str = "max_steps", problem_at: int = -1):
    screen = login_screen()
    steps = tuple(
        StepRecord(i, screen, a, 0.0, (), i == len(actions) - 1, 10 * i, 1.0, "gone" if i == problem_at else None)
        for i, a in enumerate(actions)
    )
    return EpisodeRecord(
        "ep", "login-user", "miniwob-forms", INSTRUCTION, 7, "p", "miniwob", steps, screen, {}, SLOTS,
        success, 1.0 if success else 0.0, None, end, 0, 3, 1.0, 100, datetime.now(UTC),
    )  # fmt: skip


# -- selection and candidates ----------------------------------------------------------------


def test_select_takes_the_argmax_ties_go_to_the_policy_and_unjudged_never_win():
    assert select([0.2, 0.9, 0.9]) == 1
    assert select([None, 0.1, None]) == 1
    assert select([None, None]) == 0  # nothing judged: the policy's first
    assert select([0.5]) == 0
    # the +prior variant re-weights by the policy: a slightly better score does not beat a far likelier action
    assert select(with_prior([0.80, 0.85], [np.log(0.9), np.log(0.01)])) == 0


def test_rank_candidates_top_n_bans_and_sampling_without_replacement():
    logp = np.log(np.array([0.1, 0.5, 0.3, 0.1]))
    assert rank_candidates(logp, 3) == [1, 2, 0]  # ties keep the enumeration order
    assert rank_candidates(logp, 9) == [1, 2, 0, 3]
    assert rank_candidates(logp, 2, banned=np.array([False, True, False, False])) == [2, 0]
    assert rank_candidates(logp, 2, banned=np.ones(4, dtype=bool)) == [1, 2]  # all banned: the ban is ignored
    with pytest.raises(GuidanceError, match="at least 1"):
        rank_candidates(logp, 0)
    rng = np.random.default_rng(0)
    firsts = [rank_candidates(logp, 2, gumbel=rng.gumbel(size=4)) for _ in range(4000)]
    assert all(len(set(f)) == 2 for f in firsts)  # without replacement
    share = np.bincount([f[0] for f in firsts], minlength=4) / len(firsts)
    assert np.allclose(share, [0.1, 0.5, 0.3, 0.1], atol=0.03)  # the first draw follows softmax(logp)


@pytest.fixture(scope="module")
def policy_model():
    from training.policy.learned import PolicyModel

    return PolicyModel()


def test_the_learned_policys_top_n_starts_with_its_greedy_choice_and_respects_bans(policy_model):
    from training.policy.learned import LearnedPolicy

    screen = login_screen()
    greedy = LearnedPolicy(policy_model, greedy=True).start(_context()).act(screen)
    episode = LearnedProposer(policy_model).start(_context())
    proposed = episode.propose(screen, 5)
    assert len(proposed.proposals) == 5 and proposed.calls == 1
    assert [p.rank for p in proposed.proposals] == list(range(5))
    priors = [p.prior for p in proposed.proposals]
    assert priors == sorted(priors, reverse=True)
    assert proposed.proposals[0].action == greedy  # N = 1 is the base policy
    assert len({p.action.canonical_text() for p in proposed.proposals}) == 5
    first = proposed.proposals[0].action.canonical_text()
    banned = episode.propose(screen, 5, banned={first})
    assert first not in {p.action.canonical_text() for p in banned.proposals}
    sampled = LearnedProposer(policy_model, sample=True).start(_context()).propose(screen, 16)
    assert len({p.action.canonical_text() for p in sampled.proposals}) == len(sampled.proposals)


def test_the_learned_proposer_puts_the_policy_in_eval_mode_and_proposes_deterministically():
    from training.policy.learned import PolicyModel

    model = PolicyModel()  # as PolicyModel() and PolicyModel.load give it: train mode
    assert model.scorer.training
    proposer = LearnedProposer(model)
    assert not model.scorer.training
    screen = login_screen()
    runs = [proposer.start(_context()).propose(screen, 8).proposals for _ in range(3)]
    assert [[(p.action, p.prior) for p in r] for r in runs[1:]] == [[(p.action, p.prior) for p in runs[0]]] * 2


def test_the_guided_policy_logs_every_step_and_refuses_n_below_one(policy_model):
    with pytest.raises(GuidanceError, match="at least 1"):
        GuidedPolicy(LearnedProposer(policy_model), None, 0)
    policy = GuidedPolicy(LearnedProposer(policy_model), make_verifier("oracle"), 32)  # every candidate
    actor = policy.start(_context("guided"))
    screen = login_screen()
    action = actor.act(screen)
    assert action == Action(ActionType.CLICK, _el(screen, "username"))  # the plan's first step
    actor.observe(action, StepResult(screen=login_screen(focused="username")))
    (log,) = policy.logs["guided"]
    assert log.n_candidates > 8 and log.mode == "oracle" and log.chosen_score == 1.0


# -- the oracle ------------------------------------------------------------------------------------


def test_the_oracle_follows_the_specs_plan_and_treats_a_checkbox_and_its_label_alike():
    from envs.policies import expand_solution

    tracker = PlanTracker(expand_solution(LOGIN.spec, SLOTS))
    screen = login_screen()
    wanted, index = tracker.expected(screen)
    assert wanted == Action(ActionType.CLICK, _el(screen, "username")) and index == 0
    tracker.advance(Action(ActionType.CLICK, _el(screen, "password")), screen, ok=True)  # not the plan: stays
    assert tracker.pointer == 0
    tracker.advance(wanted, screen, ok=True)
    typed, _ = tracker.expected(screen)
    assert typed == Action(ActionType.INPUT, _el(screen, "username"), text="ada")
    from warehouse.model import UIElement

    label = UIElement(ref="10", role="label", text="Pc")
    box = UIElement(ref="11", role="checkbox", parent_ref="10")
    assert same_action(Action(ActionType.CLICK, box), Action(ActionType.CLICK, label))
    assert not same_action(Action(ActionType.INPUT, box, text="a"), Action(ActionType.INPUT, label, text="a"))


# -- the GUI-PRA judge's parts ---------------------------------------------------------------------


def _steps(n: int, failed: int = -1) -> list[MemoryStep]:
    return [MemoryStep(i, f"CLICK(button#b{i % 3})", failed=i == failed) for i in range(n)]


def test_dynamic_memory_keeps_the_last_m_steps_and_condenses_the_rest_beyond_the_threshold():
    early, recent = split_history(_steps(5), 3, 5)
    assert early == () and len(recent) == 5  # App. B: not active up to 5 steps
    early, recent = split_history(_steps(7), 3, 5)
    assert [s.index for s in early] == [0, 1, 2, 3] and [s.index for s in recent] == [4, 5, 6]  # Eqs. 2-3
    memory = build_memory(_steps(7, failed=1), 3, 5)
    assert memory.active and memory.history_texts()[0].startswith("[summary of steps 1-4]")  # Eq. 5
    assert memory.history_texts()[1:] == ("CLICK(button#b1)", "CLICK(button#b2)", "CLICK(button#b0)")
    summary = extractive_summary(_steps(7, failed=1)[:4])
    assert summary.count(".") >= 1 and "CLICK(button#b0) (2 times)" in summary and "could not be carried out" in summary
    assert "\n" not in summary and not build_memory(_steps(2), 3, 5).active


def test_perception_notices_a_changed_screen_and_routes_between_a_global_parse_and_a_local_lookup():
    before, after = login_screen(), login_screen(username="ada")
    assert screen_change(None, before) is None and screen_change(before, before) == 0.0
    assert 0 < screen_change(before, after) < 0.3
    assert route_rule(None, True, []) == GLOBAL_PARSE  # first screen
    assert route_rule(0.9, True, []) == GLOBAL_PARSE  # a major change
    assert route_rule(0.1, True, []) == LOCAL_LOOKUP  # a small one: look at the targets
    assert route_rule(0.9, True, [GLOBAL_PARSE]) == LOCAL_LOOKUP and route_rule(0.1, True, [LOCAL_LOOKUP]) == TERMINATE
    proposals = _proposals(after)
    perception = perceive(_view(after, ("CLICK(textbox#username)",), before), proposals, max_tools=2)
    assert perception.tools == (LOCAL_LOOKUP,) and perception.calls == 0
    assert any('value="ada"' in line for line in perception.evidence)
    first = perceive(_view(before), proposals, max_tools=2)
    assert first.tools == (GLOBAL_PARSE, LOCAL_LOOKUP)  # Eq. 6 loop, K = 2
    # an LLM router that terminates before any tool is overruled (F.2: at least one tool), then obeyed
    routed = perceive(_view(before), proposals, max_tools=2, router=lambda used, change: TERMINATE)
    assert routed.tools == (GLOBAL_PARSE,) and routed.calls == 2
    repeating = perceive(_view(before), proposals, max_tools=2, router=lambda used, change: GLOBAL_PARSE)
    assert repeating.tools == (GLOBAL_PARSE, LOCAL_LOOKUP)  # no tool twice
    assert any("[4] button#subbtn" in line for line in global_parse(before))
    assert local_lookup(before, ["99"]) == ("target 99: not on the screen",)


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ('<eval>{"score": 7, "original_step": "CLICK(button)"}</eval>', 7.0),
        ('Reasoning...\n<eval>\n{"score": 9.5}\n</eval>', 9.5),
        ('<eval>{"score": 14}</eval>', 10.0),
        ("score: 3", 3.0),
        ('<eval>{"original_step": "x"} "score": 2</eval>', 2.0),
        ("I think this is a good action.", None),
        ("<eval>{not json}</eval>", None),
        ("", None),
    ],
)
def test_judge_answers_parse_or_are_unparsable(answer, score):
    assert parse_judgement(answer) == score


def test_the_rubric_penalises_repeated_and_wrong_actions_in_tiers():
    executed = ["CLICK(a)", "CLICK(b)"]
    assert rubric_score(9.0, "CLICK(c)", executed, set(), last_changed=True, previous=None) == (9.0, ())
    assert rubric_score(9.0, "CLICK(x)", executed, {"CLICK(x)"}, last_changed=True, previous=None)[0] == 0.0
    assert rubric_score(9.0, "CLICK(b)", ["CLICK(b)", "CLICK(b)"], set(), last_changed=True, previous=None)[0] == 0.0
    ineffective, reasons = rubric_score(9.0, "CLICK(b)", executed, set(), last_changed=False, previous=None)
    assert ineffective == 2.0 and "did not change the screen" in reasons[0]
    assert rubric_score(9.0, "CLICK(b)", executed, set(), last_changed=None, previous=None)[0] == 6.0
    assert rubric_score(9.0, "CLICK(b)", executed, set(), last_changed=None, previous=("CLICK(b)", 4.0))[0] == 4.0
    assert rubric_score(9.0, "INPUT(x)", executed, set(), last_changed=True, previous=None, redundant=True)[0] == 2.0
    assert [tier_of(s) for s in (0, 2, 3.6, 6, 8.4, 10)] == ["0", "1-2", "3-4", "5-6", "7-8", "9-10"]
    assert parse_tool("I'd use Local_Lookup now") == LOCAL_LOOKUP and parse_tool("??") is None


# -- reflect and retry -------------------------------------------------------------------------------


def test_reflection_blames_the_step_that_went_wrong_and_bans_it_on_the_next_attempt():
    screen = login_screen()
    click_user = Action(ActionType.CLICK, _el(screen, "username"))
    click_login = Action(ActionType.CLICK, _el(screen, "subbtn"))
    looping = _record([click_user, click_login, click_login, click_login])
    assert blame_step(looping) == 2  # useless repetition: the first repeat
    wrong = _record([click_user, click_login], end="failure")
    assert blame_step(wrong) == 1  # wrong submission: the last step
    failed = _record([click_user, click_login, click_user], problem_at=1)
    assert blame_step(failed) == 1  # an action that could not be carried out
    assert blame_step(_record([click_user], success=True, end="success")) is None
    reflection = reflect(wrong)
    assert reflection.source == "template" and "step 2" in reflection.text and "CLICK(button#subbtn" in reflection.text
    guidance = next_guidance(AttemptGuidance(), wrong, reflection)
    assert guidance.bans == (Ban((click_user.canonical_text(),), click_login.canonical_text()),)
    assert guidance.banned_at((click_user.canonical_text(),)) == {click_login.canonical_text()}
    assert guidance.banned_at(()) == frozenset() and guidance.attempt == 1 and guidance.reflection
    again = next_guidance(guidance, looping, reflect(looping))
    assert len(again.bans) == 2  # bans accumulate over retries
    assert pass_at([[False, True], [True], [False, False]], 1) == pytest.approx(1 / 3)
    assert pass_at([[False, True], [True], [False, False]], 2) == pytest.approx(2 / 3)


def test_a_down_endpoint_gives_the_template_reflection_and_says_why():
    port = _free_port()
    client = ChatClient(ChatEndpoint(f"http://127.0.0.1:{port}/v1", "m", timeout_s=2))
    reflection = reflect(_record([Action(ActionType.NOTHING)] * 3), client)
    assert reflection.source == "template" and "endpoint failed" in reflection.note


# -- settings and refusals before any rollout ------------------------------------------------------


def test_bad_settings_are_refused_before_any_rollout(tiny_home):
    from warehouse.catalog import Warehouse

    with pytest.raises(GuidanceError, match="N must be at least 1"):
        GuidanceSettings(n_values=(0, 3))
    with pytest.raises(GuidanceError, match="unknown verifier 'best'"):
        GuidanceSettings(verifiers=("best",))
    with pytest.raises(GuidanceError, match="unknown policy_backend 'gpt'"):
        GuidanceSettings(policy_backend="gpt")
    with pytest.raises(GuidanceError, match="ORM judges whether a whole trajectory"):
        make_verifier("orm")
    with pytest.raises(GuidanceError, match="unknown verifier"):
        make_verifier("bogus")
    with pytest.raises(GuidanceError, match="no trained prm reward model"):
        make_verifier("prm", Warehouse(tiny_home))
    with pytest.raises(GuidanceError, match="no endpoint and no local reward model"):
        make_verifier("judge", Warehouse(tiny_home))
    with pytest.raises(GuidanceError, match="unknown method"):
        plan_settings("beam", GuidanceSettings())
    labels = [s.label for s in plan_settings("best_of_n", GuidanceSettings(verifiers=("prm",), with_prior=True))]
    assert labels == [f"prm:N={n}" for n in (3, 5, 8, 16)] + [f"prm+prior:N={n}" for n in (3, 5, 8, 16)]
    assert [s.label for s in plan_settings("retry", GuidanceSettings(retries=2))] == ["retry:R=2"]


def test_a_reward_model_of_the_wrong_kind_is_refused(trained_progrm):
    with pytest.raises(GuidanceError, match="needs a prm reward model, but .* is a progrm_env model"):
        make_verifier("prm", checkpoint=trained_progrm)


def test_paired_differences_and_report_rows():
    a = {("t", s): s % 2 == 0 for s in range(40)}
    b = {("t", s): s % 4 == 0 for s in range(40)}
    d = paired_delta(a, b)
    assert d["delta"] == pytest.approx(0.25) and d["low"] < 0.25 < d["high"] and d["only_a"] == 10 and d["only_b"] == 0
    episodes = [
        {"task_id": "t", "seed": s, "attempt": k, "success": k == 1 and s == 0, "episode_id": f"e{s}{k}",
         "n_steps": 2, "failure_mode": None}
        for s in range(2) for k in range(2)
    ]  # fmt: skip
    steps = [
        {"episode_id": e["episode_id"], "propose_ms": 10.0, "verify_ms": 5.0, "verifier_calls": 1, "policy_calls": 1,
         "chosen_rank": 0, "mode": "local"}
        for e in episodes
    ]  # fmt: skip
    (task, overall) = setting_rows({"setting": "retry:R=1"}, episodes, steps, None, max_attempts=2)
    assert overall["task_id"] == "all" and overall["episodes"] == 2 and overall["success_rate"] == 0.5
    assert json.loads(overall["pass_at"]) == {"1": 0.0, "2": 0.5}
    assert overall["seconds_per_step"] == pytest.approx(0.015)


def test_abstention_keeps_the_policys_choice_unless_the_verifier_wins_by_more_than_the_margin():
    assert select_with_margin([0.5, 0.9, 0.7], None) == 1  # no margin: the argmax (Alg. 2)
    assert select_with_margin([0.5, 0.9, 0.7], 0.3) == 1 and select_with_margin([0.5, 0.9, 0.7], 0.4) == 0
    assert select_with_margin([0.8, 0.6], 0.0) == 0 and select_with_margin([None, 0.6], 0.5) == 1
    assert select_with_margin([0.5, None], 0.0) == 0  # an unjudged candidate never wins


def test_the_margin_is_fitted_where_the_candidates_values_are_known():
    # (verifier scores, Monte-Carlo values); candidate 0 is the policy's
    states = [
        ([0.5, 0.9], [0.0, 1.0]),  # the verifier is right, by a gap of 0.4
        ([0.5, 0.6], [1.0, 0.0]),  # wrong, by a gap of 0.1
        ([0.8, 0.7], [1.0, 0.0]),  # agrees with the policy
    ]
    fit = fit_margin(states)
    # margins tried: 0 (2/3), the gap 0.1 (only the confident override is kept: 3/3), 0.4 (2/3)
    assert fit.margin == pytest.approx(0.1) and fit.value == 1.0 and fit.states == 3
    assert fit.policy_value == pytest.approx(2 / 3) and fit.verifier_value == pytest.approx(2 / 3)
    assert fit.overridden == pytest.approx(1 / 3)
    # where overriding never pays, the largest margin wins the tie: the policy is kept everywhere
    never = fit_margin([([0.5, 0.9], [1.0, 0.0]), ([0.2, 0.3], [1.0, 1.0])])
    assert never.margin == pytest.approx(0.4) and never.overridden == 0.0 and never.value == 1.0
    with pytest.raises(GuidanceError, match="no held-out state"):
        fit_margin([])


def test_a_margin_for_best_of_n_is_fitted_on_the_candidates_best_of_n_would_see():
    """The held-out states hold the proposer's top k and the recorded action when it is not among
    them; best-of-N scores the top N only. A state seen at N keeps the candidates ranked below N."""
    from training.reward_models.alternatives_metric import HeldOutState

    state = HeldOutState(
        "s", "e", 2, "f", ("a0", "a1", "a2", "rec"), (0.0, 1.0, 0.5, 1.0), (None,) * 4, policy_ranks=(0, 1, 2, None)
    )
    at_two = state.proposals(2)
    assert at_two is not None and at_two.descriptions == ("a0", "a1") and at_two.values == (0.0, 1.0)
    at_eight = state.proposals(8)
    assert at_eight is not None and at_eight.descriptions == ("a0", "a1", "a2")  # never the unproposed one
    assert state.proposals(1) is None  # nothing to choose between
    equal = HeldOutState("s", "e", 2, "f", ("a0", "a1", "rec"), (1.0, 1.0, 0.0), (None,) * 3, policy_ranks=(0, 1, None))
    assert equal.proposals(3) is None  # the candidates it would see are all of one value
    unknown = HeldOutState("s", "e", 2, "f", ("a0", "a1", "a2"), (0.0, 1.0, 0.5), (None,) * 3)  # ranks not read
    assert unknown.proposals(2) is not None and unknown.proposals(2).values == (0.0, 1.0)


def test_abstaining_settings_are_planned_for_reward_model_verifiers_and_need_held_out_states(tmp_path):
    settings = GuidanceSettings(n_values=(1, 3), verifiers=("prm", "oracle"), with_abstention=True)
    labels = [s.label for s in plan_settings("best_of_n", settings)]
    assert labels == ["prm:N=3", "oracle:N=3", "prm+abstain:N=3"]  # the oracle has no scores to trust
    with pytest.raises(GuidanceError, match="step_alternatives"):
        fit_verifier_margin(Warehouse(tmp_path / "empty"), "prm", None, set())


def test_sweeps_with_two_models_of_one_verifier_are_stored_and_reported_side_by_side():
    class _Verifier:
        def __init__(self, *versions):
            self.versions = versions

        def lineage(self):
            return [LineageInput(kind="asset", version=v) for v in self.versions]

    assert verifier_model_id(None) == "" and verifier_model_id(_Verifier(None)) == ""
    assert verifier_model_id(_Verifier("prm-b", "prm-a", "prm-b")) == "prm-a+prm-b"
    # the second model gets its own dataset and episode ids; a sweep with the same model shares one
    first, second = evaluation_dataset("p", "best_of_n", ["prm-a", ""]), evaluation_dataset("p", "best_of_n", ["prm-b"])
    assert first != second and first == evaluation_dataset("p", "best_of_n", ["", "prm-a"])
    assert evaluation_dataset("p", "base", [""]) == "guidance/p/base"  # no verifier: the old name
    assert episode_id_for("p", "prm:N=3", "t", 1, 0, "prm-a") != episode_id_for("p", "prm:N=3", "t", 1, 0, "prm-b")
    assert episode_id_for("p", "base", "t", 1, 0) == "guide:p:base:t:1:a0"

    def sweep(setting, model, wins, created, verifier="prm", method="best_of_n", n=3):
        meta = {"policy_id": "p", "setting": setting, "verifier_model_id": model, "method": method,
                "verifier": verifier, "n": n, "variant": None, "judge_mode": None, "created_at": created}  # fmt: skip
        episodes = [
            {**meta, "task_id": "t", "seed": s, "attempt": 0, "success": s < wins, "n_steps": 1, "failure_mode": None,
             "episode_id": episode_id_for("p", setting, "t", s, 0, model or "")}
            for s in range(4)
        ]  # fmt: skip
        return meta, episodes

    base = sweep("base", None, 2, datetime(2026, 1, 1, tzinfo=UTC), verifier=None, method="base", n=1)  # an old home
    a = sweep("prm:N=3", "prm-a", 1, datetime(2026, 1, 2, tzinfo=UTC))
    b = sweep("prm:N=3", "prm-b", 4, datetime(2026, 1, 3, tzinfo=UTC))
    report = guidance_report("p", [base[0], a[0], b[0]], base[1] + a[1] + b[1], [])
    rows = {(r["setting"], r["verifier_model_id"]): r for r in report["rows"]}
    assert set(rows) == {("base", ""), ("prm:N=3", "prm-a"), ("prm:N=3", "prm-b")}
    assert rows[("prm:N=3", "prm-a")]["success_rate"] == 0.25 and rows[("prm:N=3", "prm-b")]["success_rate"] == 1.0
    assert rows[("prm:N=3", "prm-b")]["delta_vs_base"] == 0.5  # each paired with the one base sweep
    assert {r["series"] for r in report["rows"] if r["method"] == "best_of_n"} == {"prm@prm-a", "prm@prm-b"}
    text = str(report_markdown(report))
    assert "| prm:N=3 | prm-a | 3 |" in text and "| prm@prm-b | 50.0 | 100.0 |" in text
    assert check_best_of_n(report).metadata["delta_vs_base"] == {"N=3": 0.5}  # the newest sweep
    # one model per verifier: the series keeps the verifier's plain name
    alone = guidance_report("p", [base[0], a[0]], base[1] + a[1], [])
    assert {r["series"] for r in alone["rows"] if r["method"] == "best_of_n"} == {"prm"}


# -- verifiers on trained reward models ------------------------------------------------------------


def train_tiny_prm(examples, out):
    """A PRM trained (briefly, for real) on the tiny warehouse's examples; its export folder."""
    from training.reward_models.train import parse_args, train_reward_model

    args = ["--kind", "prm", "--examples", str(examples), "--output_dir", str(out / "trainer"),
            "--embedding_cache_dir", str(out / "cache"), "--max_steps", "40", "--per_device_train_batch_size", "16",
            "--learning_rate", "3e-3", "--save_steps", "1000", "--logging_steps", "20", "--disable_tqdm", "true",
            "--eval_strategy", "no", "--warmup_steps", "0"]  # fmt: skip
    train_reward_model(*parse_args(args))
    return out / "trainer" / "final"


@pytest.fixture(scope="module")
def trained_prm(tiny_examples, tmp_path_factory):
    return train_tiny_prm(tiny_examples["prm"], tmp_path_factory.mktemp("trained-prm"))


def test_the_prm_scores_all_candidates_in_one_batch_as_it_scores_each(trained_prm):
    verifier = make_verifier("prm", checkpoint=trained_prm)
    screen = login_screen()
    proposals = _proposals(screen)
    view = _view(screen, ("CLICK(textbox#username)",))
    verdict = verifier.start(_context()).score(view, proposals)
    assert verdict.calls == 1 and verdict.mode == "local" and len(verdict.scores) == 3
    scorer = verifier.scorer.scorer  # type: ignore[attr-defined]
    one_by_one = [
        scorer.score_states([StepState(INSTRUCTION, view.history, view.screen_lines, p.description)])[0]
        for p in proposals
    ]
    assert np.allclose(verdict.scores, one_by_one, atol=1e-5)
    assert all(0.0 <= s <= 1.0 for s in verdict.scores)


def test_the_progress_gain_is_the_candidates_progress_minus_the_current(trained_progrm):
    verifier = make_verifier("progrm_env", checkpoint=trained_progrm)
    screen = login_screen()
    proposals = _proposals(screen)
    view = _view(screen, ("CLICK(textbox#username)",))
    verdict = verifier.start(_context()).score(view, proposals)
    scorer = verifier.scorer.scorer  # type: ignore[attr-defined]
    current = scorer.score_states([StepState(INSTRUCTION, view.history, view.screen_lines)])[0]
    after = scorer.score_states(
        [StepState(INSTRUCTION, (*view.history, p.description), view.screen_lines) for p in proposals]
    )
    assert np.allclose(verdict.scores, after - current, atol=1e-5) and verdict.calls == 1
    assert verdict.details["progress"] == pytest.approx(current, abs=1e-5)


def test_step_ranks_put_a_probability_and_a_progress_gain_on_one_scale():
    assert step_ranks([0.2, 0.9, None, 0.5]) == [0.0, 1.0, None, 0.5]
    assert step_ranks([0.3, 0.3, 0.1]) == [0.75, 0.75, 0.0]  # equal scores share their mean rank
    assert step_ranks([0.4]) == [1.0] and step_ranks([None, None]) == [None, None]
    agree = mean_rank([Verdict((0.9, 0.1, 0.5)), Verdict((0.3, -0.2, 0.1))])
    assert agree == (1.0, 0.0, 0.5) and select(list(agree)) == 0
    split = mean_rank([Verdict((0.1, 0.9, 0.8)), Verdict((0.0, -0.1, 0.2))])  # each prefers another
    assert split == (0.25, 0.5, 0.75) and select(list(split)) == 2
    assert mean_rank([Verdict((0.5, None)), Verdict((None, None))]) == (1.0, None)


def test_the_ensemble_scores_with_both_models_and_names_both_in_its_lineage(trained_prm, trained_progrm):
    members = (make_verifier("prm", checkpoint=trained_prm), make_verifier("progrm_env", checkpoint=trained_progrm))
    ensemble = EnsembleVerifier(members)  # type: ignore[arg-type]
    screen = login_screen()
    proposals, view = _proposals(screen), _view(screen, ("CLICK(textbox#username)",))
    verdict = ensemble.start(_context()).score(view, proposals)
    alone = [m.start(_context()).score(view, proposals) for m in members]
    assert verdict.scores == mean_rank(alone) and verdict.calls == 2
    assert verdict.details == {"prm": list(alone[0].scores), "progrm_env": list(alone[1].scores)}
    assert [i.path for i in ensemble.lineage()] == [str(trained_prm), str(trained_progrm)]  # both models


def test_the_judge_in_local_mode_says_so_and_applies_its_memory_and_rubric(trained_prm):
    judge = make_verifier("judge", checkpoint=trained_prm, judge=JudgeSettings())
    episode = judge.start(_context())
    screen = login_screen()
    login = Action(ActionType.CLICK, _el(screen, "subbtn"))
    for _ in range(7):  # a loop of ineffective clicks: memory activates beyond 5 steps
        proposals = _proposals(screen)
        verdict = episode.score(_view(screen, (), screen), proposals)
        episode.observe(Proposal(login, describe_action(login, screen), 0.0, 0), verdict.scores[0], StepResult(screen))
    assert verdict.mode == "local" and "local mode" in verdict.note and "extractive" in verdict.note
    assert verdict.details["memory_active"] and verdict.details["tools"] == [LOCAL_LOOKUP]
    assert verdict.scores[0] == 0.0  # clicking Login a seventh time: an explicit loop
    assert verdict.details["penalties"]["0"] == ["explicit loop: the same action a third time in a row"]
    assert all(s is not None and 0 <= s <= 10 for s in verdict.scores)


# -- the judge against endpoints that fail -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A tiny OpenAI-compatible chat server that answers ``text`` after ``delay`` seconds."""

    def __init__(self, text: str, delay: float = 0.0) -> None:
        outer = self
        self.calls = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                outer.calls += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(delay)
                body = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _judge_step(judge):
    screen = login_screen()
    return judge.start(_context()).score(_view(screen), _proposals(screen))


def test_a_down_endpoint_falls_back_to_the_local_model_and_is_left_alone_afterwards(trained_prm):
    judge = make_verifier(
        "judge", checkpoint=trained_prm, judge=JudgeSettings(endpoint=f"http://127.0.0.1:{_free_port()}/v1")
    )
    verdict = _judge_step(judge)
    assert verdict.mode == "fallback" and "not reachable" in verdict.note and "local scores" in verdict.note
    assert all(s is not None for s in verdict.scores)
    started = time.perf_counter()
    again = _judge_step(judge)  # the endpoint is known to be down: no call, no wait
    assert again.mode == "fallback" and "endpoint down" in again.note and time.perf_counter() - started < 5


def test_a_slow_or_nonsensical_endpoint_falls_back_and_without_a_local_model_the_step_is_unjudged(trained_prm):
    slow, babbling = _Server('<eval>{"score": 9}</eval>', delay=3.0), _Server("hello! nice screen.")
    try:
        judge = make_verifier(
            "judge", checkpoint=trained_prm, judge=JudgeSettings(endpoint=slow.url, timeout_s=0.5, perception=False)
        )
        verdict = _judge_step(judge)
        assert verdict.mode == "fallback" and "too slow" in verdict.note
        judge = make_verifier("judge", checkpoint=trained_prm, judge=JudgeSettings(endpoint=babbling.url))
        verdict = _judge_step(judge)
        assert verdict.mode == "fallback" and "unparsable" in verdict.note and verdict.details["sources"][0] == "local"
        assert babbling.calls == 3 + 1  # one per candidate, and the router's (unusable: the rule routes on)
        unjudged = make_verifier("judge", judge=JudgeSettings(endpoint=babbling.url, perception=False))
        verdict = _judge_step(unjudged)
        assert verdict.mode == "unjudged" and verdict.scores == (None, None, None) and select(verdict.scores) == 0
    finally:
        slow.close()
        babbling.close()


def test_an_endpoint_that_answers_well_scores_every_candidate(trained_prm):
    server = _Server('<think>fine</think><eval>{"score": 6, "original_step": "x"}</eval>')
    try:
        judge = make_verifier("judge", checkpoint=trained_prm, judge=JudgeSettings(endpoint=server.url))
        verdict = _judge_step(judge)
        assert verdict.mode == "endpoint" and verdict.scores == (6.0, 6.0, 6.0)
        assert verdict.calls == 3 + 1 and verdict.details["tools"] == [GLOBAL_PARSE, LOCAL_LOOKUP]
    finally:
        server.close()


def test_an_llm_in_the_step_gets_an_episode_clock_it_can_finish_in():
    """MiniWoB++'s timer runs while the agent thinks: with a judge or an LLM policy over an endpoint
    the clock is 10 minutes (a CPU judge took 110-180 s a step, and under the benchmark's 10 s every
    episode ended at its first action); the learned policy with local verifiers keeps the benchmark's."""
    assert GuidanceSettings().episode_clock_ms is None
    assert GuidanceSettings(endpoint="http://127.0.0.1:9/v1").episode_clock_ms == LLM_EPISODE_CLOCK_MS == 600_000
    llm_policy = GuidanceSettings(policy_backend="hf", policy_path="/models/x", tasks=("click-option",))
    assert llm_policy.episode_clock_ms == LLM_EPISODE_CLOCK_MS
    assert GuidanceSettings(endpoint="http://127.0.0.1:9/v1", episode_max_time_ms=30_000).episode_clock_ms == 30_000


def test_a_later_sweep_that_measures_a_setting_again_replaces_it_in_the_earlier_sweep(tmp_path):
    """Found on a real home (issue 42): a sweep of prm and the ensemble, then one of prm and
    progrm_env with the same models, stored prm:N=3's episodes twice (same ids, two datasets),
    and the report counted both. Now the later publish restages the earlier sweep without it; and
    a sweep of one more N with the same models adds to its dataset instead of replacing it."""
    import pyarrow as pa

    from envs.pool_jobs import ROLLOUT_ATTEMPTS
    from training.guidance.storage import sweep_outputs
    from warehouse.catalog import Materialization
    from warehouse.schema import EPISODES, STEPS
    from warehouse.tables_guidance import GUIDANCE_EPISODES, GUIDANCE_EVAL, GUIDANCE_STEPS

    wh = Warehouse(tmp_path / "home")

    def publish(settings, wins, lost=None):
        """One sweep; ``lost``: a (setting, model) whose seed-9 episode the pool lost (attempts only)."""
        m = Materialization(asset="guidance_evaluation")
        ids = {(s, model): [episode_id_for("p", s, "t", seed, 0, model) for seed in range(3)] for s, model in settings}
        lost_ids = [episode_id_for("p", lost[0], "t", 9, 0, lost[1])] if lost else []
        key = {"policy_id": "p", "task_id": "t", "method": "best_of_n"}
        tables = {
            "guidance_eval": pa.Table.from_pylist(
                [key | {"setting": s, "verifier_model_id": model, "successes": wins} for s, model in settings],
                schema=GUIDANCE_EVAL,
            ),
            "guidance_episodes": pa.Table.from_pylist(
                [
                    key
                    | {
                        "setting": s,
                        "verifier_model_id": model,
                        "seed": seed,
                        "attempt": 0,
                        "episode_id": e,
                        "success": seed < wins,
                    }
                    for (s, model), es in ids.items()
                    for seed, e in enumerate(es)
                ],
                schema=GUIDANCE_EPISODES,
            ),  # fmt: skip
            "guidance_steps": pa.Table.from_pylist(
                [{"episode_id": e, "step_idx": 0} for es in ids.values() for e in es], schema=GUIDANCE_STEPS
            ),
            "episodes": pa.Table.from_pylist(
                [
                    {"episode_id": e, "task_id": "t", "source": "rollout", "success": True, "n_steps": 1}
                    for es in ids.values()
                    for e in es
                ],
                schema=EPISODES,
            ),  # fmt: skip
            "steps": pa.Table.from_pylist(
                [
                    {"episode_id": e, "step_idx": 0, "action_type": "CLICK", "action_text": "CLICK(a)"}
                    for es in ids.values()
                    for e in es
                ],
                schema=STEPS,  # fmt: skip
            ),
            "rollout_attempts": pa.Table.from_pylist(
                [{"episode_id": e, "attempt": 0, "status": "completed"} for es in ids.values() for e in es]
                + [{"episode_id": e, "attempt": 0, "status": "aborted"} for e in lost_ids],
                schema=ROLLOUT_ATTEMPTS,
            ),
        }
        wh.publish(m, sweep_outputs(wh, m, "p", "best_of_n", tables, set(ids), [model for _, model in settings]))

    publish([("prm:N=3", "prm-a"), ("ensemble:N=3", "prm-a+penv-b")], wins=1, lost=("prm:N=3", "prm-a"))
    publish([("prm:N=3", "prm-a"), ("progrm_env:N=3", "penv-b")], wins=2, lost=("prm:N=3", "prm-a"))
    evals = wh.query("SELECT setting, verifier_model_id, successes FROM guidance_eval ORDER BY setting").to_pylist()
    assert [(r["setting"], r["successes"]) for r in evals] == [
        ("ensemble:N=3", 1),
        ("prm:N=3", 2),
        ("progrm_env:N=3", 2),
    ]
    for table, key in (("guidance_episodes", "setting, verifier_model_id, seed"), ("episodes", "episode_id"),
                       ("steps", "episode_id, step_idx"), ("guidance_steps", "episode_id, step_idx"),
                       ("rollout_attempts", "episode_id, attempt")):  # fmt: skip
        n, unique = wh.query(f"SELECT count(*), count(DISTINCT ({key})) FROM {table}").to_pylist()[0].values()
        expected = 10 if table == "rollout_attempts" else 9  # the lost episode's attempt, once
        assert n == unique == expected, table  # 3 settings x 3 seeds, each once
    # a sweep that measures nothing the earlier ones did leaves them as they are
    publish([("prm:N=3", "prm-c")], wins=3)
    assert wh.query("SELECT count(*) AS n FROM guidance_eval").to_pylist()[0]["n"] == 4
    # one more N with a model already swept: added to that sweep's dataset, N = 3 kept
    publish([("prm:N=16", "prm-c")], wins=0)
    assert wh.query("SELECT setting FROM guidance_eval WHERE verifier_model_id = 'prm-c' ORDER BY 1").column(
        0
    ).to_pylist() == ["prm:N=16", "prm:N=3"]
    counts = wh.query("SELECT count(*) AS n, count(DISTINCT episode_id) AS d FROM episodes").to_pylist()[0]
    assert counts["n"] == counts["d"] == 15  # 5 (setting, model) pairs x 3 seeds


def test_a_sweep_on_a_home_written_before_verifier_model_ids_keeps_the_old_rows(tmp_path):
    """Guidance files written before ``verifier_model_id`` existed lack the column (and their
    dataset is the method's plain name): a new sweep reads them in today's schema, '' as their
    model, and neither crashes nor drops them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.guidance.storage import sweep_outputs
    from warehouse.catalog import Materialization
    from warehouse.tables_guidance import GUIDANCE_EPISODES, GUIDANCE_EVAL

    wh = Warehouse(tmp_path / "home")
    key = {"policy_id": "p", "task_id": "t", "method": "best_of_n", "setting": "prm:N=3", "verifier_model_id": ""}
    old_id = episode_id_for("p", "prm:N=3", "t", 0, 0)
    m = Materialization(asset="guidance_evaluation")
    outs = [
        wh.stage_table("guidance_eval", "guidance/p/best_of_n", pa.Table.from_pylist([key], schema=GUIDANCE_EVAL), m),
        wh.stage_table(
            "guidance_episodes",
            "guidance/p/best_of_n",
            pa.Table.from_pylist([key | {"seed": 0, "attempt": 0, "episode_id": old_id}], schema=GUIDANCE_EPISODES),
            m,
        ),
    ]
    wh.publish(m, outs)
    for out in outs:  # what a version before the column wrote
        pq.write_table(pq.read_table(out.path).drop_columns(["verifier_model_id"]), out.path)
    new = {"policy_id": "p", "task_id": "t", "method": "best_of_n", "setting": "prm:N=3", "verifier_model_id": "prm-a"}
    m2 = Materialization(asset="guidance_evaluation")
    tables = {
        "guidance_eval": pa.Table.from_pylist([new], schema=GUIDANCE_EVAL),
        "guidance_episodes": pa.Table.from_pylist(
            [new | {"seed": 0, "attempt": 0, "episode_id": episode_id_for("p", "prm:N=3", "t", 0, 0, "prm-a")}],
            schema=GUIDANCE_EPISODES,
        ),
    }
    wh.publish(m2, sweep_outputs(wh, m2, "p", "best_of_n", tables, {("prm:N=3", "prm-a")}, ["prm-a"]))
    rows = wh.query(
        "SELECT setting, coalesce(verifier_model_id, '') AS v FROM guidance_episodes ORDER BY 2"
    ).to_pylist()
    assert rows == [{"setting": "prm:N=3", "v": ""}, {"setting": "prm:N=3", "v": "prm-a"}]
