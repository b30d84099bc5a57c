"""Alternatives at one state: replays that check every screen, the states and candidates chosen,
the plan's step, the Monte-Carlo labels, and what is dropped (pure parts; the live replays are in
test_replay_live.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from envs.protocol import (
    END_FAILURE,
    END_MAX_STEPS,
    END_SUCCESS,
    EpisodeContext,
    EpisodeRecord,
    StartState,
    StateNotReproduced,
    StepRecord,
    restore,
    screen_signature,
)
from envs.task_catalog import load_catalog
from training.flywheel.alternative_labels import AlternativesSummary, alternative_rows, monte_carlo_value
from training.flywheel.alternatives import (
    AlternativesError,
    AlternativesRequest,
    CandidateAction,
    SourceEpisode,
    StateToLabel,
    planned_action,
    propose,
    replay_jobs,
    sample_states,
    state_id,
    states_to_label,
)
from training.flywheel.replay import (
    ReplayDiverged,
    ReplayOutcome,
    ReplayPlan,
    ReplayPolicy,
    replay_outcome,
)
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.schema import STEPS, append_step
from warehouse.tables_training import STEP_ALTERNATIVES
from warehouse.trajectories import Trajectory, screens_from_arrow

LOGIN = load_catalog("miniwob")["login-user"]
INSTRUCTION = 'Enter the username "ada" and the password "x1" into the text fields and press login'
SLOTS = {"username": "ada", "password": "x1"}


def login_screen(user: str | None = None, password: str | None = None, focused: str | None = None) -> Screen:
    return Screen(
        (
            UIElement(ref="1", role="body", depth=0),
            UIElement(ref="2", role="label", text="Username", depth=1, clickable=True),
            UIElement(
                ref="3",
                role="textbox",
                element_id="username",
                value=user,
                editable=True,
                clickable=True,
                focused=focused == "username",
                depth=1,
                bounds=(10.0, 20.0, 90.0, 30.0),
            ),
            UIElement(
                ref="4",
                role="password",
                element_id="password",
                value=password,
                editable=True,
                clickable=True,
                focused=focused == "password",
                depth=1,
            ),
            UIElement(ref="5", role="button", element_id="subbtn", text="Login", clickable=True, depth=1),
        )
    )


def el(screen: Screen, element_id: str) -> UIElement:
    return next(e for e in screen.elements if e.element_id == element_id)


def context(episode_id: str = "e1", max_steps: int = 8) -> EpisodeContext:
    return EpisodeContext(
        task=LOGIN.spec,
        instruction=INSTRUCTION,
        slots=SLOTS,
        seed=7,
        backend="miniwob",
        supported_actions=frozenset(ActionType),
        max_steps=max_steps,
        episode_id=episode_id,
    )


# -- replays ---------------------------------------------------------------------------------------


def test_a_screen_keeps_its_signature_through_the_warehouse_and_changes_with_refs_values_and_focus():
    screen = login_screen("ad", None, "username")
    columns: dict[str, list] = {name: [] for name in STEPS.names}
    append_step(columns, "e", 0, Action(ActionType.CLICK, el(screen, "subbtn")), screen)
    width = max(len(v) for v in columns.values())
    for column in columns.values():
        column.extend([None] * (width - len(column)))
    stored = screens_from_arrow(pa.Table.from_pydict(columns, schema=STEPS).column("screen"))[0]
    assert screen_signature(stored) == screen_signature(screen)  # float32 bounds do not matter
    assert screen_signature(login_screen("ada", None, "username")) != screen_signature(screen)  # a value
    assert screen_signature(login_screen("ad", None, None)) != screen_signature(screen)  # focus
    renumbered = Screen(tuple(UIElement(**{**e.to_dict(), "ref": str(int(e.ref) + 1)}) for e in screen.elements))
    assert screen_signature(renumbered) != screen_signature(screen)  # refs: actions name targets by them
    assert screen_signature(Screen(())) == screen_signature(Screen(()))


class _Continuation:
    """A stand-in for the learned policy's continuation: records the history it was handed."""

    policy_id = "c"

    def __init__(self) -> None:
        self.histories: list[tuple[Action, ...]] = []

    def start_after(self, ctx, history):
        self.histories.append(tuple(history))
        outer = self

        class Actor:
            def act(self, screen):
                return Action(ActionType.CLICK, el(screen, "subbtn"))

            def observe(self, action, result):
                outer.observed = True

        return Actor()


def _plan(screens: list[Screen], prefix: list[Action], candidate: Action, steps: int = 0) -> ReplayPlan:
    return ReplayPlan(tuple(prefix), tuple(screens), candidate, steps, INSTRUCTION)


def test_a_replay_starts_at_the_recorded_state_carries_the_candidate_out_then_the_policy_goes_on():
    s0, s1 = login_screen(), login_screen(focused="username")
    click_user = Action(ActionType.CLICK, el(s0, "username"))
    typed = Action(ActionType.INPUT, el(s1, "username"), text="ada")
    plan = _plan([s0, s1], [click_user], typed, steps=2)
    assert (plan.step, plan.max_steps) == (1, 3)
    job = plan.job("job", LOGIN.spec, 7, "miniwob-forms")
    assert job.start == StartState((click_user,), (s0, s1), 0) and job.max_steps == 3 and job.seed == 7
    continuation = _Continuation()
    actor = ReplayPolicy({"job": plan}, continuation).start(context("job"))  # type: ignore[arg-type]
    assert actor.act(s1) == typed
    after = login_screen("ada", None, "username")
    assert actor.act(after).type is ActionType.CLICK  # the continuation's first action
    assert continuation.histories == [(click_user, typed)]  # it reads the prefix and the candidate as its past
    # without a continuation policy, a budget left over is waited out
    lone = ReplayPolicy({"job": plan}).start(context("job"))
    lone.act(s1)
    assert lone.act(after).type is ActionType.NOTHING


def test_a_replay_that_starts_elsewhere_or_on_another_instance_diverges():
    s0, s1 = login_screen(), login_screen(focused="username")
    plan = _plan([s0, s1], [Action(ActionType.CLICK, el(s0, "username"))], Action(ActionType.NOTHING))
    actor = ReplayPolicy({"job": plan}).start(context("job"))
    with pytest.raises(ReplayDiverged, match="replay diverged: the replay does not start at the recorded state"):
        actor.act(s0)
    other = replace(context("job"), instruction="Enter the username other")
    with pytest.raises(ReplayDiverged, match="instruction is not the recorded one"):
        ReplayPolicy({"job": plan}).start(other)
    with pytest.raises(Exception, match="no replay plan"):
        ReplayPolicy({}).start(context("job"))
    with pytest.raises(ValueError, match="checks 2 screens"):
        ReplayPlan((Action(ActionType.NOTHING),), (s0,), Action(ActionType.NOTHING))


class _Screens:
    """An environment that walks through fixed screens, one per step, whatever the action."""

    backend = "test"
    supported_actions = frozenset(ActionType)

    def __init__(self, screens: list[Screen], end_at: int | None = None) -> None:
        self.screens, self.end_at, self.at = screens, end_at, 0

    def reset(self, task, seed):
        from envs.protocol import Observation

        self.at = 0
        return Observation(self.screens[0], INSTRUCTION, task.task_id)

    def step(self, action):
        from envs.protocol import StepResult

        self.at += 1
        return StepResult(self.screens[self.at], done=self.at == self.end_at)

    def close(self):
        pass

    def healthy(self):
        return True


def test_an_environment_without_its_own_restore_is_replayed_step_by_step_and_checked():
    s0, s1, s2 = login_screen(), login_screen(focused="username"), login_screen("ada", None, "username")
    nothing = Action(ActionType.NOTHING)
    start = StartState((nothing, nothing), (s0, s1, s2))
    reached = restore(_Screens([s0, s1, s2]), LOGIN.spec, 7, start)
    assert reached.screen == s2 and reached.instruction == INSTRUCTION
    with pytest.raises(StateNotReproduced, match="screen 1 is not the recorded one"):
        restore(_Screens([s0, s2, s2]), LOGIN.spec, 7, start)
    with pytest.raises(StateNotReproduced, match="screen 2 is not the recorded one"):
        restore(_Screens([s0, s1, s1]), LOGIN.spec, 7, start)
    with pytest.raises(StateNotReproduced, match="ended at step 0"):
        restore(_Screens([s0, s1, s2], end_at=1), LOGIN.spec, 7, start)

    class OwnRestore(_Screens):
        def restore(self, task, seed, start):
            return "its own"

    assert restore(OwnRestore([s0]), LOGIN.spec, 7, start) == "its own"


def _record(n_steps: int, end: str, success: bool, hits: dict[int, tuple[str, ...]] | None = None) -> EpisodeRecord:
    screen = login_screen()
    steps = tuple(
        StepRecord(
            step_idx=i,
            screen=screen,
            action=Action(ActionType.NOTHING),
            env_reward=0.0,
            milestones_hit=(hits or {}).get(i, ()),
            done=i == n_steps - 1,
            time_ms=100 * i,
            latency_ms=20.0,
        )
        for i in range(n_steps)
    )
    return EpisodeRecord(
        episode_id="job",
        task_id="login-user",
        family="miniwob-forms",
        instruction=INSTRUCTION,
        seed=7,
        policy_id="replay",
        backend="miniwob",
        steps=steps,
        final_screen=screen,
        fields={},
        slots=SLOTS,
        success=success,
        outcome_reward=1.0 if success else 0.0,
        decayed_reward=None,
        end_reason=end,
        milestones_reached=0,
        n_milestones=3,
        reset_ms=50.0,
        duration_ms=100 * n_steps,
        created_at=datetime.now(UTC),
    )


def test_an_outcome_reads_the_candidate_step_the_episode_and_what_the_replay_cost():
    out = replay_outcome(_record(3, END_SUCCESS, True, {0: ("username typed",)}))
    assert out.milestones_hit == ("username typed",) and not out.ended and out.continued and out.success
    assert out.replay_ms == 50.0 + 0 + 20.0  # reaching the state, then the candidate carried out
    assert out.live_step_ms == (100.0,)  # from issuing step 1 to issuing step 2
    ended = replay_outcome(_record(1, END_FAILURE, False))
    assert ended.ended and not ended.ended_success and not ended.continued
    budget = replay_outcome(_record(1, END_MAX_STEPS, False))
    assert not budget.ended  # our step budget, not the environment, stopped it
    with pytest.raises(ReplayDiverged, match="took no step"):
        replay_outcome(_record(0, END_FAILURE, False))


# -- states, candidates, the plan's step ------------------------------------------------------------


def _episodes() -> list[SourceEpisode]:
    return [
        SourceEpisode("policy:p:login-user:r01:4000001", "login-user", 4000001, "policy_rollout", "p", 5),
        SourceEpisode("policy:p:login-user:r01:4000002", "login-user", 4000002, "policy_rollout", "p", 3),
        SourceEpisode("rollout:login-user:b00:3", "login-user", 3, "exploration", "expert", 5),
        SourceEpisode("eval:p:held_out:login-user:3000001", "login-user", 3000001, "evaluation", "eval:p", 4),
        SourceEpisode("eval:p:held_out:enter-text:3000001", "enter-text", 3000001, "evaluation", "eval:p", 2),
    ]


def test_states_are_sampled_per_task_and_source_seeded_and_the_held_out_set_is_fixed():
    one = sample_states(_episodes(), 3, proposer_id="p", round_=1)
    assert one == sample_states(_episodes(), 3, proposer_id="p", round_=1)  # seeded
    counts: dict[tuple[str, str], int] = {}
    for e, t in one:
        counts[(e.task_id, e.purpose)] = counts.get((e.task_id, e.purpose), 0) + 1
        assert 0 <= t < e.n_steps
    assert counts == {
        ("login-user", "policy_rollout"): 3,
        ("login-user", "exploration"): 3,
        ("login-user", "evaluation"): 3,
        ("enter-text", "evaluation"): 2,  # all it has
    }
    two = sample_states(_episodes(), 3, proposer_id="p", round_=2)
    held = [(e.episode_id, t) for e, t in one if e.purpose == "evaluation"]
    assert held == [(e.episode_id, t) for e, t in two if e.purpose == "evaluation"]  # not by round
    taken = {state_id("p", e.episode_id, t) for e, t in one}
    rest = sample_states(_episodes(), 10, proposer_id="p", round_=2, taken=taken)
    assert not {state_id("p", e.episode_id, t) for e, t in rest} & taken
    assert len(rest) == sum(e.n_steps for e in _episodes()) - len(one)


def test_the_selection_source_is_sampled_on_its_own_and_a_state_both_held_out_sources_drew_is_kept_once():
    selection = SourceEpisode("eval:p:selection:login-user:2000001", "login-user", 2000001, "evaluation", "eval:p", 4)
    as_evaluation, as_selection = selection, SourceEpisode(**{**selection.__dict__, "source": "selection"})
    drawn = sample_states([as_evaluation, as_selection], 4, proposer_id="p", round_=1)
    assert [(e.sample_source, t) for e, t in drawn] == [("evaluation", t) for t in range(4)]  # kept once
    alone = sample_states([as_selection], 2, proposer_id="p", round_=1)
    assert alone == sample_states([as_selection], 2, proposer_id="p", round_=7)  # one fixed set, not by round
    assert len(alone) == 2 and all(e.purpose == "evaluation" and e.sample_source == "selection" for e, _ in alone)


@pytest.fixture(scope="module")
def policy_model():
    from training.policy.learned import PolicyModel

    return PolicyModel()


def test_candidates_are_the_policys_top_k_and_the_recorded_action_when_it_is_not_among_them(policy_model):
    screen = login_screen()
    login = Action(ActionType.CLICK, el(screen, "subbtn"))
    ranked = propose(policy_model, context(), screen, [], login, 3)
    assert [c.index for c in ranked] == list(range(len(ranked)))
    top = [c for c in ranked if c.policy_rank is not None and c.policy_rank < 3]
    assert [c.policy_rank for c in top] == [0, 1, 2]
    assert [c.policy_logp for c in top] == sorted((c.policy_logp for c in top), reverse=True)  # type: ignore[type-var]
    assert sum(c.is_recorded for c in ranked) == 1 and [c for c in ranked if c.is_recorded][0].action == login
    assert len(ranked) == 3 + (not any(c.is_recorded for c in top))
    everything = propose(policy_model, context(), screen, [], login, 500)
    assert sum(c.is_recorded for c in everything) == 1 and len(everything) == len({c.action for c in everything})
    unknown = Action(ActionType.INPUT, el(screen, "password"), text="typo!")  # no candidate types it
    extra = propose(policy_model, context(), screen, [], unknown, 2)
    assert extra[-1].action == unknown and extra[-1].policy_rank is None and extra[-1].policy_logp is None


def test_a_sampled_states_milestones_are_replayed_where_the_episode_recorded_them_under_another_spec(
    policy_model,
):
    """The milestones reached before a sampled state (what the label's progress starts from) are
    the spec's replay when the rollout stored another spec version, and its record when it stored
    this one (the record here is deliberately empty, so the test sees which was used)."""
    s0, s1 = login_screen(), login_screen(focused="username")
    s2 = login_screen("ada", None, "username")
    actions = (
        Action(ActionType.CLICK, el(s0, "username")),
        Action(ActionType.INPUT, el(s1, "username"), text="ada"),
        Action(ActionType.CLICK, el(s2, "password")),
    )
    recorded = Trajectory(
        episode_id="ep",
        task_id="login-user",
        instruction=INSTRUCTION,
        source="rollout",
        success=False,
        actions=actions,
        screens=(s0, s1, s2),
        milestones_hit=((), (), ()),
        fields=SLOTS,
        spec_digest=LOGIN.spec.milestone_digest,
    )
    stale = replace(recorded, spec_digest="0" * 16)
    sampled = [(SourceEpisode("ep", "login-user", 7, "policy_rollout", "p", 3), 2)]

    def reached(trajectory: Trajectory) -> int:
        (state,) = states_to_label(
            policy_model, sampled, {"ep": trajectory}, {}, {"login-user": LOGIN}, proposer_id="p", top_k=2
        )
        return state.milestones_reached

    assert reached(recorded) == 0
    assert reached(stale) == 1  # "username typed" after the second action


def test_the_plans_step_follows_the_recorded_prefix():
    s0, s1 = login_screen(), login_screen(focused="username")
    s2 = login_screen("ada", None, "username")
    click_user = Action(ActionType.CLICK, el(s0, "username"))
    typed = Action(ActionType.INPUT, el(s1, "username"), text="ada")
    wander = Action(ActionType.CLICK, el(s2, "subbtn"))
    ctx = context()
    assert planned_action(ctx, [s0], [click_user], [None], 0) == click_user
    assert planned_action(ctx, [s0, s1], [click_user, typed], [None, None], 1) == typed
    # a wrong click does not advance the plan; a failed step does not either
    assert planned_action(ctx, [s0, s1, s2], [click_user, typed, wander], [None] * 3, 2).target.element_id == "password"
    assert planned_action(ctx, [s0, s1], [click_user, typed], ["not on screen", None], 1) == Action(
        ActionType.CLICK, el(s1, "username")
    )
    no_plan = replace(ctx, task=replace(ctx.task, solution=()))
    assert planned_action(no_plan, [s0], [click_user], [None], 0) is None


# -- jobs and labels --------------------------------------------------------------------------------


def _state(t: int, n_candidates: int = 2, max_steps: int = 6) -> StateToLabel:
    screens = [login_screen()] * (t + 1)
    nothing = Action(ActionType.NOTHING)
    candidates = tuple(
        CandidateAction(i, Action(ActionType.SCROLL, direction=("UP", "DOWN")[i % 2]), i, -float(i), i == 0)
        for i in range(n_candidates)
    )
    episode = SourceEpisode(f"ep{t}", "login-user", 9, "policy_rollout", "p", t + 2)
    return StateToLabel(
        state_id=state_id("p", episode.episode_id, t),
        episode=episode,
        step_idx=t,
        family="miniwob-forms",
        instruction=INSTRUCTION,
        prefix=(nothing,) * t,
        screens=tuple(screens),
        milestones_reached=0,
        candidates=candidates,
        descriptions=tuple(c.action.canonical_text() for c in candidates),
        planned=candidates[1].action,
        max_steps=max_steps,
    )


def test_each_candidate_gets_m_continuations_within_the_tasks_step_budget():
    tasks = {"login-user": LOGIN}
    jobs, plans, serves = replay_jobs([_state(1), _state(5)], tasks, continuations=3, horizon=0)
    by_state: dict[str, list[str]] = {}
    for job in jobs:
        by_state.setdefault(serves[job.episode_id][0], []).append(job.episode_id)
    early, last = state_id("p", "ep1", 1), state_id("p", "ep5", 5)
    assert len(by_state[early]) == 2 * 3  # two candidates, three continuations each
    assert {plans[j].continuation_steps for j in by_state[early]} == {6 - 2}  # the rest of the budget
    assert len(by_state[last]) == 2 and {plans[j].continuation_steps for j in by_state[last]} == {0}  # none left
    assert all(job.max_steps == plans[job.episode_id].max_steps <= 6 for job in jobs)
    assert len({job.episode_id for job in jobs}) == len(jobs)
    short, short_plans, _ = replay_jobs([_state(1)], tasks, continuations=2, horizon=2)
    assert {short_plans[j.episode_id].continuation_steps for j in short} == {2}
    none, none_plans, _ = replay_jobs([_state(1)], tasks, continuations=0, horizon=0)
    assert len(none) == 2 and {none_plans[j.episode_id].continuation_steps for j in none} == {0}


def _outcome(*, ended=False, ended_success=False, success=False, continued=True, hits=()) -> ReplayOutcome:
    return ReplayOutcome(hits, ended, ended_success, None, success, continued, 120.0, (40.0,))


def test_monte_carlo_values_follow_math_shepherd_and_the_known_outcome():
    assert monte_carlo_value([]) is None
    assert monte_carlo_value([_outcome(success=True), _outcome(), _outcome(success=True), _outcome()]) == 0.5
    assert monte_carlo_value([_outcome(ended=True, ended_success=True, success=True, continued=False)]) == 1.0
    assert monte_carlo_value([_outcome(ended=True, continued=False)]) == 0.0
    assert monte_carlo_value([_outcome(continued=False)]) is None  # m = 0: nothing continued
    # the candidate took the task's last step and did not end the episode: it failed, out of steps
    assert monte_carlo_value([_outcome(continued=False)], last_step=True) == 0.0
    assert monte_carlo_value([_outcome(ended=True, ended_success=True, success=True)], last_step=True) == 1.0


def test_rows_keep_what_a_replay_labelled_and_count_what_none_did():
    states = [_state(1), _state(2, n_candidates=3)]
    outcomes = {
        (states[0].state_id, 0): [_outcome(success=True, hits=("username typed",)), _outcome()],
        (states[0].state_id, 1): [_outcome(), _outcome(hits=("other",))],  # not repeatable
        (states[1].state_id, 2): [],  # every replay diverged
    }
    summary = AlternativesSummary(states_sampled=2)
    rows = alternative_rows(states, outcomes, proposer_id="p", round_=1, run_id="r", summary=summary)
    assert [r["alternative_id"] for r in rows] == [f"{states[0].state_id}:0", f"{states[0].state_id}:1"]
    first, second = rows
    assert first["mc_value"] == 0.5 and first["continuations"] == 2 and first["continuation_successes"] == 1
    assert first["milestones_hit"] == ["username typed"] and first["repeatable"] is False
    assert first["matches_plan"] is False and second["matches_plan"] is True
    assert first["is_recorded"] and first["policy_rank"] == 0 and first["purpose"] == "policy_rollout"
    assert (summary.states_labelled, summary.states_dropped) == (1, 1)
    assert (summary.candidates_labelled, summary.candidates_dropped, summary.not_repeatable) == (2, 3, 2)
    pa.Table.from_pylist(rows, schema=STEP_ALTERNATIVES)  # the rows fit the table
    # a state at the task's last step: a candidate that does not end the episode there is worth 0
    last = _state(5, max_steps=6)
    at_budget = {(last.state_id, i): [_outcome(continued=False)] for i in range(2)}
    rows = alternative_rows([last], at_budget, proposer_id="p", round_=1, run_id="r", summary=AlternativesSummary())
    assert [r["mc_value"] for r in rows] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": 1}, "top_k must be at least 2"),
        ({"states_per_task": 0}, "states_per_task"),
        ({"continuations": -1}, "continuations and horizon"),
        ({"temperature": 0}, "temperature must be positive"),
        ({"sources": ("demonstration",)}, "sources must be among"),
        ({"round": -1}, "round must be"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(AlternativesError, match=message):
        AlternativesRequest("sft", "miniwob-forms", **kwargs)


def test_no_replayable_episode_fails_before_any_environment(tmp_path):
    from tests.training.flywheel.test_collection import _policies, _row
    from training.flywheel.alternatives import run_alternatives
    from training.policy.learned import PolicyModel
    from warehouse.catalog import Warehouse

    wh = Warehouse(tmp_path / "home")
    _policies(wh, [_row("sft-a", "sft", 1)])
    PolicyModel().save(wh.resolve("policies/sft-a"))

    def no_pool(workers):
        raise AssertionError("no environment may start")

    with pytest.raises(AlternativesError, match="no replayable episode of sft-a on login-user"):
        run_alternatives(wh, AlternativesRequest("sft", "miniwob-forms"), no_pool, run_id=None, partition_key=None)
