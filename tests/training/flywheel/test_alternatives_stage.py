"""The alternatives stage over a warehouse, with a scripted environment standing in for the browser
(the live one runs in tests/assets/test_rl.py and test_replay_live.py): which episodes give states,
what is published where, what a rerun replaces, what a divergence costs, and what fails first."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from envs.pool_jobs import BatchResult, EpisodeError
from envs.protocol import Observation, StateNotReproduced, StepResult, episode_tables, run_episode
from envs.task_catalog import load_catalog
from tests.training.flywheel.test_alternatives import INSTRUCTION, SLOTS, el, login_screen
from tests.training.flywheel.test_collection import _policies, _row
from training.flywheel.alternatives import (
    AlternativesError,
    AlternativesRequest,
    check_alternatives_run,
    held_out_dataset,
    round_dataset,
    run_alternatives,
)
from training.flywheel.collection import CollectionError
from training.policy.learned import PolicyModel
from warehouse.catalog import Materialization, Warehouse
from warehouse.model import Action, ActionType, Screen
from warehouse.purposes import EpisodePurpose

LOGIN = load_catalog("miniwob")["login-user"]


def _world() -> tuple[list[Screen], list[Action]]:
    """login-user solved: the screens before each action, and the actions."""
    s0 = login_screen()
    s1 = login_screen(focused="username")
    s2 = login_screen("ada", None, "username")
    s3 = login_screen("ada", None, "password")
    s4 = login_screen("ada", "x1", "password")
    actions = [
        Action(ActionType.CLICK, el(s0, "username")),
        Action(ActionType.INPUT, el(s1, "username"), text="ada"),
        Action(ActionType.CLICK, el(s2, "password")),
        Action(ActionType.INPUT, el(s3, "password"), text="x1"),
        Action(ActionType.CLICK, el(s4, "subbtn")),
    ]
    return [s0, s1, s2, s3, s4], actions


class ScriptedLogin:
    """login-user as a deterministic state machine: the plan's next action moves on, anything else
    changes nothing; the seed 13 instance differs from the start (a replay of it diverges)."""

    backend = "miniwob"
    supported_actions = frozenset(ActionType)

    def __init__(self) -> None:
        self.screens, self.actions = _world()
        self.at = 0
        self.seed = 0

    def reset(self, task, seed: int) -> Observation:
        self.at, self.seed = 0, seed
        return Observation(self._screen(), INSTRUCTION, task.task_id)

    def _screen(self) -> Screen:
        screen = self.screens[self.at]
        if self.seed == 13:  # another instance: a focus the recording never had
            return login_screen(focused="password")
        return screen

    def step(self, action: Action) -> StepResult:
        if self.at < len(self.actions) and action == self.actions[self.at]:
            self.at += 1
            if self.at == len(self.actions):
                return StepResult(self.screens[-1], 1.0, ("login clicked",), True, True)
            return StepResult(self._screen())
        return StepResult(self._screen())

    def close(self) -> None:
        pass

    def healthy(self) -> bool:
        return True


@dataclass
class ScriptedPool:
    """The pool's ``run`` over :class:`ScriptedLogin` (an EpisodeError loses its job, as the pool does)."""

    runs: list[int] = field(default_factory=list)

    def run(self, jobs, policy, *, on_episode=None, before_step=None) -> BatchResult:
        self.runs.append(len(jobs))
        episodes, lost = [], []
        for job in jobs:
            env = ScriptedLogin()
            try:
                record = run_episode(
                    env, policy, job.task, job.seed, episode_id=job.episode_id, max_steps=job.max_steps, start=job.start
                )
                episodes.append(record)
            except (EpisodeError, StateNotReproduced) as exc:
                lost.append((job, str(exc)))
        return BatchResult(episodes, [], lost, 0.1, 0, 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def _record(policy_id: str, episode_id: str, seed: int, n: int, purpose: EpisodePurpose):
    """The first n steps of the solution as a recorded episode (solved when n = 5)."""
    from envs.protocol import EpisodeRecord, StepRecord

    screens, actions = _world()
    steps = tuple(
        StepRecord(
            i,
            screens[i],
            actions[i],
            1.0 if i == 4 else 0.0,
            ("login clicked",) if i == 4 else (),
            i == n - 1,
            10 * i,
            5.0,
        )
        for i in range(n)
    )
    record = EpisodeRecord(
        episode_id,
        "login-user",
        "miniwob-forms",
        INSTRUCTION,
        seed,
        policy_id,
        "miniwob",
        steps,
        screens[min(n, 4)],
        {},
        SLOTS,
        n == 5,
        1.0 if n == 5 else 0.0,
        None,
        "success" if n == 5 else "max_steps",
        0,
        3,
        10.0,
        50 * n,
        datetime.now(UTC),
    )
    return record, purpose


@pytest.fixture()
def home(tmp_path):
    wh = Warehouse(tmp_path / "home")
    _policies(wh, [_row("sft-a", "sft", 1)])
    PolicyModel().save(wh.resolve("policies/sft-a"))
    recorded = [
        _record("sft-a", "policy:sft-a:login-user:r01:4010000", 4010000, 5, EpisodePurpose.POLICY_ROLLOUT),
        _record("sft-a", "policy:sft-a:login-user:r01:13", 13, 3, EpisodePurpose.POLICY_ROLLOUT),  # diverges
        _record("sft-a", "policy:sft-a:login-user:r02:4020000", 4020000, 5, EpisodePurpose.POLICY_ROLLOUT),  # r2
        _record("eval:sft-a", "eval:sft-a:held_out:login-user:3000000", 3000000, 5, EpisodePurpose.EVALUATION),
        _record("eval:sft-b", "eval:sft-b:held_out:login-user:3000001", 3000001, 5, EpisodePurpose.EVALUATION),
    ]
    outputs = []
    m = Materialization(asset="policy_rollouts")
    for purpose in {p for _, p in recorded}:
        episodes, steps = episode_tables([r for r, p in recorded if p == purpose], purpose=purpose)
        outputs += [wh.stage_table("episodes", purpose, episodes, m), wh.stage_table("steps", purpose, steps, m)]
    wh.publish(m, outputs)
    return wh


def _run(home: Warehouse, request: AlternativesRequest, pool: ScriptedPool | None, run_id: str | None) -> dict:
    def factory(workers: int) -> ScriptedPool:
        if pool is None:
            raise AssertionError("no environment may start")
        return pool

    return run_alternatives(home, request, factory, run_id=run_id, partition_key=None, log=lambda m: None)


def _rows(wh: Warehouse) -> list[dict]:
    return wh.query("SELECT * FROM step_alternatives ORDER BY alternative_id").to_pylist()


def test_states_come_from_the_rounds_rollouts_and_the_policys_evaluations_and_land_in_two_datasets(home):
    pool = ScriptedPool()
    request = AlternativesRequest("sft", "miniwob-forms", round=1, states_per_task=20, top_k=2, continuations=2)
    summary = run_alternatives(
        home, request, lambda workers: pool, run_id="run-1", partition_key=None, log=lambda m: None
    )
    rows = _rows(home)
    replayed = [r for r in rows if r["labelled_by"] == "replay"]
    # the round's own rollouts and the proposer's own evaluation; not round 2's, not another policy's
    assert {r["episode_id"] for r in replayed} == {
        "policy:sft-a:login-user:r01:4010000",
        "eval:sft-a:held_out:login-user:3000000",
    }
    # the seed-13 episode's 3 states, which no replay reproduced, are labelled from the recording
    assert summary["replays_diverged"] > 0 and summary["states_dropped"] == 0
    assert summary["states_from_recording"] == 3 and summary["from_recording_by_task"] == {"login-user": 3}
    from_recording = [r for r in rows if r["labelled_by"] == "recording"]
    assert {(r["episode_id"], r["step_idx"]) for r in from_recording} == {
        ("policy:sft-a:login-user:r01:13", t) for t in range(3)
    }
    for r in from_recording:  # that episode failed: its own actions' one continuation did not succeed
        assert (r["continuations"], r["continuation_successes"], r["mc_value"]) == (
            (1, 0, 0.0) if r["is_recorded"] else (0, 0, None)
        )
        assert r["replay_ms"] is None and r["repeatable"] is None
    assert home.current_version("step_alternatives", held_out_dataset("sft-a", "miniwob-forms"))
    assert home.current_version("step_alternatives", round_dataset("sft-a", "miniwob-forms", 1))
    held = [r for r in rows if r["purpose"] == "evaluation"]
    assert {r["step_idx"] for r in held} == set(range(5)) and all(r["round"] == 1 for r in held)
    # the recorded action reproduces the recorded outcome; the plan's step is known at every state
    for r in rows:
        assert r["planned_action"] is not None
        if r["is_recorded"]:
            assert r["matches_plan"]  # the recorded episodes followed the plan
        if r["is_recorded"] and r["labelled_by"] == "replay":
            assert r["continuations"] == (2 if r["step_idx"] < 4 else 0)  # the last step ends the episode
    last = next(r for r in rows if r["is_recorded"] and r["step_idx"] == 4)
    assert last["ended"] and last["ended_success"] and last["continuations"] == 0
    checks = check_alternatives_run(home, "run-1")
    assert checks["labels_in_range"].passed
    assert not checks["replays_reproduce_states"].passed  # 3 of 5 states' replays diverged: flagged

    # the round again: the same states, the round's dataset replaced, held-out states not sampled again
    again = run_alternatives(
        home, request, lambda workers: pool, run_id="run-2", partition_key=None, log=lambda m: None
    )
    rerun = _rows(home)
    assert [(r["alternative_id"], r["mc_value"]) for r in rerun] == [(r["alternative_id"], r["mc_value"]) for r in rows]
    assert {(r["purpose"], r["run_id"]) for r in rerun} == {("evaluation", "run-1"), ("policy_rollout", "run-2")}
    assert again["states_by_purpose"] == {"policy_rollout": 8}  # the seed-13 states from the recording again
    assert home.query("SELECT count(*) - count(DISTINCT alternative_id) FROM step_alternatives")[0][0].as_py() == 0
    # the next round: its own rollouts, nothing already labelled
    run_alternatives(
        home,
        AlternativesRequest("sft", "miniwob-forms", round=2, states_per_task=20, top_k=2, continuations=2),
        lambda workers: pool,
        run_id="run-3",
        partition_key=None,
        log=lambda m: None,
    )
    assert {r["episode_id"] for r in _rows(home) if r["round"] == 2} == {"policy:sft-a:login-user:r02:4020000"}
    # only the held-out source asked for, once they exist: one line, before any environment
    with pytest.raises(AlternativesError, match="held-out states of sft-a in miniwob-forms exist already"):
        run_alternatives(
            home,
            AlternativesRequest("sft", "miniwob-forms", sources=("evaluation",)),
            lambda w: pytest.fail("no pool"),
            run_id=None,
            partition_key=None,
        )


def test_a_checkpoint_that_does_not_load_fails_before_any_environment(home):
    (home.resolve("policies/sft-a") / "policy.pt").write_bytes(b"truncated")
    with pytest.raises(CollectionError, match="sft-a: its checkpoint .* cannot be loaded"):
        run_alternatives(
            home,
            AlternativesRequest("sft", "miniwob-forms"),
            lambda w: pytest.fail("no pool"),
            run_id=None,
            partition_key=None,
        )


class NothingRepeatsPool(ScriptedPool):
    """Every instance differs from its recording, as choose-date-easy's animated date picker does."""

    def run(self, jobs, policy, *, on_episode=None, before_step=None) -> BatchResult:
        from dataclasses import replace

        return super().run([replace(job, seed=13) for job in jobs], policy)


def test_a_task_whose_states_never_replay_is_labelled_from_the_recording_and_flagged_not_failed(home):
    """Where every replay diverges the page does not repeat: a property of the task, which the
    warn-level check names, not an error that fails the run (it failed `make demo` when SFT chose
    choose-date-easy). Its candidates are labelled from the recording (issue 42 item 2), so a
    verifier trained on the round has seen candidates of that task."""
    request = AlternativesRequest("sft", "miniwob-forms", round=1, states_per_task=20, top_k=2, continuations=2)
    summary = _run(home, request, NothingRepeatsPool(), "run-1")
    assert summary["replays"] > 0 and summary["replays_diverged"] == summary["replays"]
    rows = _rows(home)
    assert rows and {r["labelled_by"] for r in rows} == {"recording"}
    assert summary["states_from_recording"] == summary["states_labelled"] == len({r["state_id"] for r in rows})
    checks = check_alternatives_run(home, "run-1")
    assert checks["labels_in_range"].passed and checks["labels_in_range"].metadata["alternatives"] == len(rows)
    assert not checks["replays_reproduce_states"].passed  # still flagged (warn): the page does not repeat
    assert checks["replays_reproduce_states"].metadata["states_from_recording"] == summary["states_from_recording"]


def test_recording_labels_never_publishes_no_rows_where_no_replay_reproduced_a_state(home):
    """The behaviour before issue 42 item 2, on request: such states are dropped and counted."""
    request = AlternativesRequest(
        "sft", "miniwob-forms", round=1, states_per_task=20, top_k=2, continuations=2, recording_labels="never"
    )
    summary = run_alternatives(
        home, request, lambda workers: NothingRepeatsPool(), run_id="run-1", partition_key=None, log=lambda m: None
    )
    assert summary["replays"] > 0 and summary["replays_diverged"] == summary["replays"]
    assert summary["diverged_by_task"] == {"login-user": summary["replays"]}
    assert summary["states_from_recording"] == 0 and summary["states_dropped"] == summary["states_sampled"]
    checks = check_alternatives_run(home, "run-1")
    assert checks["labels_in_range"].passed and checks["labels_in_range"].metadata["alternatives"] == 0
    assert not checks["replays_reproduce_states"].passed  # flagged (warn), with the task named
    assert checks["replays_reproduce_states"].metadata["diverged_by_task"] == {"login-user": summary["replays"]}


def test_recording_labels_always_starts_no_browser_and_the_reward_models_read_what_it_labelled(home):
    """``always``: every state labelled from its recording, no environment started. The labels are
    what the recording shows: the plan's step is right, the password typed into the username box
    is wrong (its field), the recorded action is judged by how its episode ended."""
    from training.reward_models.readers import read_alternatives

    request = AlternativesRequest(
        "sft", "miniwob-forms", round=1, states_per_task=20, top_k=8, recording_labels="always"
    )
    summary = _run(home, request, None, "run-a")
    assert summary["replays"] == 0 and summary["states_from_recording"] == summary["states_sampled"] == 13
    rows = _rows(home)
    assert {r["labelled_by"] for r in rows} == {"recording"}
    wrong_box = [r for r in rows if r["action_type"] == "INPUT" and r["field_match"] is False]
    assert wrong_box, "the top 8 at the username box include the password typed into it"
    for r in wrong_box:
        assert r["action_text"] == 'INPUT(textbox#username, "x1")'
    right_box = [r for r in rows if r["field_match"] is True]
    assert right_box and all('"ada"' in r["action_text"] for r in right_box if "#username" in r["action_text"])
    verdicts = {a.alternative_id: a.verdict() for a in read_alternatives(home)}  # training rows only
    assert verdicts and set(verdicts) == {r["alternative_id"] for r in rows if r["purpose"] != "evaluation"}
    by_id = {r["alternative_id"]: r for r in rows}
    for alternative_id, verdict in verdicts.items():
        r = by_id[alternative_id]
        if r["field_match"] is False or (r["matches_plan"] is False and not r["is_recorded"]):
            assert verdict == "negative", r
        elif r["matches_plan"]:
            assert verdict == "positive", r


def test_selection_seed_states_are_a_held_out_set_of_their_own_sampled_once_and_never_twice(home):
    """Issue 42: guidance fits its abstention margin on held-out states away from the seeds it
    evaluates; the ``selection`` source draws them from the proposer's selection-seed evaluations
    into their own dataset, and no state lands in both held-out sets."""
    episodes, steps = episode_tables(
        [_record("eval:sft-a", "eval:sft-a:selection:login-user:2000000", 2000000, 5, EpisodePurpose.EVALUATION)[0]],
        purpose=EpisodePurpose.EVALUATION,
    )
    m = Materialization(asset="policy_sft")
    home.publish(
        m, [home.stage_table("episodes", "selection", episodes, m), home.stage_table("steps", "sel", steps, m)]
    )
    pool = ScriptedPool()
    selection = AlternativesRequest(
        "sft", "miniwob-forms", states_per_task=20, top_k=2, continuations=2, sources=("selection",)
    )
    summary = _run(home, selection, pool, "run-s")
    rows = _rows(home)
    assert {r["episode_id"] for r in rows} == {"eval:sft-a:selection:login-user:2000000"}
    assert {r["purpose"] for r in rows} == {"evaluation"} and summary["states_labelled"] == 5
    assert home.current_version("step_alternatives", held_out_dataset("sft-a", "miniwob-forms", "selection"))
    assert home.current_version("step_alternatives", held_out_dataset("sft-a", "miniwob-forms")) is None
    with pytest.raises(AlternativesError, match=r"exist already \(selection: they are sampled once"):
        _run(home, selection, None, None)
    # the held-out source then takes every evaluation episode's states but the ones already labelled
    _run(
        home,
        AlternativesRequest(
            "sft", "miniwob-forms", states_per_task=20, top_k=2, continuations=2, sources=("evaluation",)
        ),
        pool,
        "run-e",
    )
    held = home.query("SELECT DISTINCT episode_id FROM step_alternatives WHERE run_id = 'run-e'").column(0).to_pylist()
    assert held == ["eval:sft-a:held_out:login-user:3000000"]
    assert home.query("SELECT count(*) - count(DISTINCT alternative_id) FROM step_alternatives")[0][0].as_py() == 0
