"""The learned CPU policy: candidates, the scorer, acting behind the Policy interface, SFT."""

import dataclasses
import random
from datetime import UTC, datetime

import numpy as np
import pytest
import torch

from envs.protocol import EpisodeContext, EpisodeRecord, StepRecord
from envs.task_catalog import load_catalog
from tests.training import conftest
from training.policy.candidates import (
    FEATURE_NAMES,
    enumerate_candidates,
    history_text,
    instruction_values,
    range_values,
    relative_instruction,
    relative_text,
)
from training.policy.learned import LearnedPolicy, PolicyModel, sampling_key
from training.policy.network import grouped_entropy, grouped_log_softmax
from training.policy.sft import SFTSettings, demonstration_decisions, matching_candidate, train_sft
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.trajectories import Trajectory

LOGIN = load_catalog("miniwob")["login-user"]


def _placed(screen: Screen) -> Screen:
    """The training fixtures' screens with on-screen bounds (a policy only acts on visible elements)."""
    placed = [
        dataclasses.replace(e, bounds=(0.0, 20.0 * i, 100.0, 20.0 * i + 18)) for i, e in enumerate(screen.elements)
    ]
    placed[0] = dataclasses.replace(placed[0], bounds=(0.0, 0.0, 100.0, 1000.0))  # the root spans the page
    return Screen(tuple(placed))


def _login_screen(*args) -> Screen:
    return _placed(conftest._login_screen(*args))


def _button_screen(names) -> Screen:
    return _placed(conftest._button_screen(names))


def _login_episode(rng, outcome):
    task, instruction, screens, actions, success, lcs, env = conftest._login_episode(rng, outcome)
    placed = [_placed(s) for s in screens]
    by_ref = {e.ref: e for e in placed[0].elements}
    actions = [dataclasses.replace(a, target=by_ref[a.target.ref]) if a.target else a for a in actions]
    return task, instruction, placed, actions, success, lcs, env


INSTRUCTION = 'Enter the username "renda" and the password "vb" into the text fields and press login.'
SLOTS = {"username": "renda", "password": "vb"}


def _feature(candidate, name):
    return candidate.features[FEATURE_NAMES.index(name)]


def test_candidates_cover_the_screen_and_are_written_relative_to_the_instruction():
    screen = _login_screen(None, None, None)
    candidates = enumerate_candidates(screen, INSTRUCTION, SLOTS, [], step_index=0, max_steps=10)
    texts = [c.text for c in candidates]
    assert 'INPUT(textbox#username, "<username>")' in texts and 'INPUT(password#password, "<password>")' in texts
    assert 'CLICK(button#subbtn "Login")' in texts and texts[-4:] == [
        'PRESS_KEY("Enter")',
        "SCROLL(DOWN)",
        "SCROLL(UP)",
        "NOTHING()",
    ]
    by_text = {c.text: c for c in candidates}
    # the username value belongs in the username field, not in the password field
    assert _feature(by_text['INPUT(textbox#username, "<username>")'], "value_fits_field") == 1.0
    assert _feature(by_text['INPUT(password#password, "<username>")'], "value_fits_field") == 0.0
    assert relative_instruction(INSTRUCTION, SLOTS).startswith('Enter the username "<username>"')
    # quoted phrases the template does not capture are values too
    assert instruction_values('Type "hello world" now', {}) == {"quoted": "hello world"}
    assert relative_text("Hello World!", {"quoted": "hello world"}) == "<quoted>!"


def test_repetition_and_field_state_show_in_the_features():
    screen = _login_screen("renda", None, "username")
    typed = Action(ActionType.INPUT, screen.elements[3], text="renda")
    candidates = enumerate_candidates(screen, INSTRUCTION, SLOTS, [typed, typed], step_index=2, max_steps=10)
    again = next(c for c in candidates if c.text == 'INPUT(textbox#username, "<username>")')
    assert _feature(again, "field_already_holds_it") == 1.0
    assert _feature(again, "repeats_last_action") == 1.0 and _feature(again, "repeats_in_history") == pytest.approx(
        2 / 3
    )
    assert history_text([typed], INSTRUCTION, SLOTS) == 'INPUT(textbox#username, "<username>")'


def test_a_click_on_another_element_of_the_same_text_is_not_a_repeat():
    """click-shades: every square of the asked colour reads ``span "<color>"``; a click on a second
    square repeats nothing, a click on the same one again does, and so does a click on an element of
    that text when the one clicked before has left the screen (re-rendered: it cannot be told apart)."""
    squares = [
        UIElement(ref=str(i), role="span", description=colour, bounds=(20.0 * i, 0.0, 20.0 * i + 12, 12.0), depth=1)
        for i, colour in enumerate(["green", "red", "green", "green"], start=1)
    ]
    submit = UIElement(ref="9", role="button", text="Submit", element_id="submit", bounds=(0.0, 40.0, 60.0, 60.0))
    screen = Screen((UIElement(ref="0", role="body", bounds=(0.0, 0.0, 200.0, 200.0)), *squares, submit))
    instruction, slots = "Select all the shades of green and press Submit.", {"color": "green"}
    first = Action(ActionType.CLICK, squares[0])

    def features(history, on=screen):
        candidates = enumerate_candidates(on, instruction, slots, history, step_index=len(history), max_steps=14)
        by_ref = {c.action.target.ref: c for c in candidates if c.action.target is not None}
        return {
            ref: (_feature(c, "repeats_in_history"), _feature(c, "repeats_last_action"), c.text)
            for ref, c in by_ref.items()
        }

    after_one = features([first])
    assert after_one["1"] == (pytest.approx(1 / 3), 1.0, 'CLICK(span "<color>")')  # the same square again
    assert after_one["3"] == (0.0, 0.0, 'CLICK(span "<color>")') == after_one["4"]  # another green square
    assert after_one["2"][:2] == (0.0, 0.0)
    gone = Screen(tuple(e for e in screen.elements if e.ref != "1"))  # the clicked square re-rendered away
    assert features([first], gone)["3"][:2] == (pytest.approx(1 / 3), 1.0)


def test_a_number_the_instruction_names_by_its_range_can_be_typed():
    """guess-number names its answer only by a range ("between 0-9"): the policy can type every
    number of it into the number field, and the texts keep the numbers (they are not slots). Before,
    it could type nothing there."""
    instruction = "Guess the number between 0-9 and press Submit. Use the feedback below to find the right number."
    assert range_values(instruction) == tuple(str(n) for n in range(10))
    assert range_values("Pick one from 3 to 5, or between 7 and 8") == ("3", "4", "5", "7", "8")
    assert range_values("Enter a number between 1 and 1000") == ()  # too many to choose from
    assert range_values(INSTRUCTION) == ()
    field = UIElement(ref="2", role="number", element_id="tt", editable=True, bounds=(0.0, 20.0, 80.0, 38.0), depth=1)
    submit = UIElement(ref="3", role="button", text="Submit", element_id="subbtn", bounds=(0.0, 40.0, 60.0, 58.0))
    feedback = UIElement(ref="4", role="div", text="The number is higher than 4.", bounds=(0.0, 60.0, 200.0, 78.0))
    screen = Screen((UIElement(ref="1", role="body", bounds=(0.0, 0.0, 200.0, 200.0)), field, submit, feedback))
    guessed = Action(ActionType.INPUT, field, text="4")
    candidates = enumerate_candidates(screen, instruction, {}, [guessed], step_index=2, max_steps=44)
    typed = {c.action.text: c for c in candidates if c.action.type is ActionType.INPUT}
    assert list(typed) == [str(n) for n in range(10)]
    assert typed["7"].text.endswith('"7")') and "<" not in typed["7"].text
    assert _feature(typed["4"], "repeats_in_history") > 0 and _feature(typed["7"], "repeats_in_history") == 0
    assert matching_candidate(guessed, candidates) is not None


def test_a_long_screen_keeps_the_fixed_tail_of_candidates():
    screen = _button_screen([f"b{i}" for i in range(200)])
    candidates = enumerate_candidates(screen, "Click b3", {}, [], step_index=0, max_steps=5, max_candidates=20)
    assert len(candidates) == 20 and candidates[-1].text == "NOTHING()"


def test_grouped_log_softmax_is_a_log_softmax_per_state():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0])
    index = torch.tensor([0, 0, 1, 1, 1])
    out = grouped_log_softmax(logits, index, 2)
    expected = torch.cat([torch.log_softmax(logits[:2], 0), torch.log_softmax(logits[2:], 0)])
    assert torch.allclose(out, expected, atol=1e-6)
    entropy = grouped_entropy(out, index, 2)
    p = torch.softmax(logits[:2], 0)
    assert torch.isclose(entropy[0], -(p * p.log()).sum(), atol=1e-6)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return PolicyModel()


def _context(episode_id: str = "e1") -> EpisodeContext:
    return EpisodeContext(
        task=LOGIN.spec,
        instruction=INSTRUCTION,
        slots=SLOTS,
        seed=0,
        backend="miniwob",
        supported_actions=frozenset(ActionType),
        max_steps=10,
        episode_id=episode_id,
    )


def test_the_policy_acts_greedily_or_by_sampling_and_records_its_decisions(model):
    screen = _login_screen(None, None, None)
    greedy = LearnedPolicy(model, greedy=True, record=True)
    actor = greedy.start(_context())
    action = actor.act(screen)
    decision = greedy.decisions["e1"][0]
    with torch.inference_mode():
        logp = model.log_probs(model.batch([decision])).numpy()
    assert decision.chosen == int(np.argmax(logp)) and decision.logp == pytest.approx(float(logp.max()), abs=1e-5)
    assert (
        action
        == enumerate_candidates(screen, INSTRUCTION, SLOTS, [], step_index=0, max_steps=10)[decision.chosen].action
    )
    # sampling is reproducible per (policy, episode) and differs between episodes
    picks = []
    for episode in ("a", "a", "b", "c", "d"):
        policy = LearnedPolicy(model, policy_id="sampler", record=True)
        policy.start(_context(episode)).act(screen)
        picks.append(policy.decisions[episode][0].chosen)
    assert picks[0] == picks[1]


def test_a_state_scores_to_the_same_bits_whatever_the_process_thread_count(model):
    """The driver acts with 2 threads, a Ray actor with 1: the CPU's matrix kernels split their
    sums by thread (on this AVX-512 machine 2 threads differ from 1 by ~5e-8), so acting scores a
    state on one thread, and restores the process's thread count afterwards."""
    policy = LearnedPolicy(model, record=True)
    policy.start(_context()).act(_login_screen(None, None, None))
    decision = policy.decisions["e1"][0]
    before = torch.get_num_threads()
    scores = {}
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            scores[threads] = model.state_log_probs(decision)
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert scores[1].tobytes() == scores[2].tobytes() == scores[4].tobytes()
    assert decision.logp == float(scores[1][decision.chosen])


def test_save_and_load_give_the_same_scores(model, tmp_path):
    screen = _login_screen(None, None, None)
    policy = LearnedPolicy(model, record=True)
    policy.start(_context()).act(screen)
    decision = policy.decisions["e1"][0]
    model.save(tmp_path / "p")
    loaded = PolicyModel.load(tmp_path / "p", encoder=model.encoder)
    loaded.cache = model.cache
    with torch.inference_mode():
        assert torch.allclose(model.log_probs(model.batch([decision])), loaded.log_probs(loaded.batch([decision])))
    with pytest.raises(FileNotFoundError, match="no policy checkpoint"):
        PolicyModel.load(tmp_path / "nothing-here", encoder=model.encoder)


def _login_trajectories(n: int, seed: int = 0) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task, instruction, screens, actions, success, _, _ = _login_episode(rng, "success")
        out.append(
            Trajectory(
                f"demo{i}", task, instruction, "human_demo", success, tuple(actions), tuple(screens[: len(actions)])
            )
        )
    return out


def test_sft_learns_the_demonstrated_actions(tmp_path):
    torch.manual_seed(0)
    model = PolicyModel()
    said: list[str] = []
    data = demonstration_decisions(
        model,
        _login_trajectories(40),
        {"login-user": LOGIN.spec},
        {"login-user": 10},
        validation_share=0.25,
        log=said.append,
        log_every_s=0.0,
    )
    assert data.matched_share == 1.0 and data.train and data.validation
    # how far it is reaches a log that is no terminal (Dagster's), not only tqdm's bar
    assert len(said) == 39 and said[0].startswith("SFT decisions: 1/40 episodes, ") and "39/40" in said[-1]
    before = model.log_probs(model.batch(data.validation))[model.batch(data.validation).chosen].mean().item()
    result = train_sft(model, data, SFTSettings(epochs=15, patience=15, batch_size=16, learning_rate=3e-3))
    after = model.log_probs(model.batch(data.validation))[model.batch(data.validation).chosen].mean().item()
    assert after > before and result.validation_accuracy[result.best_epoch] > 0.9


def test_an_action_outside_the_candidates_is_counted_not_guessed():
    screen = _login_screen(None, None, None)
    candidates = enumerate_candidates(screen, INSTRUCTION, SLOTS, [], step_index=0, max_steps=10)
    typed_other = Action(ActionType.INPUT, screen.elements[3], text="someone-else")
    assert matching_candidate(typed_other, candidates) is None
    click = Action(ActionType.CLICK, screen.elements[6])
    assert candidates[matching_candidate(click, candidates)].text == 'CLICK(button#subbtn "Login")'


def record_of(trajectory: Trajectory, *, success: bool | None = None, slots=None) -> EpisodeRecord:
    """An EpisodeRecord of a recorded trajectory, as the worker pool would return it."""
    steps = tuple(
        StepRecord(t, screen, action, 0.0, (), t == trajectory.n_steps - 1, 0, 0.0)
        for t, (screen, action) in enumerate(zip(trajectory.screens, trajectory.actions, strict=True))
    )
    ok = trajectory.success if success is None else success
    return EpisodeRecord(
        episode_id=trajectory.episode_id,
        task_id=trajectory.task_id,
        family="miniwob-forms",
        instruction=trajectory.instruction,
        seed=0,
        policy_id="test",
        backend="miniwob",
        steps=steps,
        final_screen=trajectory.screens[-1],
        fields={},
        slots=slots if slots is not None else (LOGIN.spec.slots(trajectory.instruction, {}) or {}),
        success=ok,
        outcome_reward=1.0 if ok else -1.0,
        decayed_reward=None,
        end_reason="success" if ok else "failure",
        milestones_reached=0,
        n_milestones=3,
        reset_ms=0.0,
        duration_ms=0,
        created_at=datetime.now(UTC),
    )


def test_a_new_policy_is_a_function_of_its_seed_not_of_the_process_history():
    """SFT from the same data gave another policy in each run: the scorer's first weights were drawn
    from torch's global generator after whatever the process had drawn before."""
    first = PolicyModel(seed=0)
    torch.rand(1000)  # the process draws something else in between (loading, another model)
    again, other = PolicyModel(seed=0), PolicyModel(seed=1)
    state = first.scorer.state_dict()
    assert all(torch.equal(state[k], v) for k, v in again.scorer.state_dict().items())
    assert not all(torch.equal(state[k], v) for k, v in other.scorer.state_dict().items())


def test_sft_from_the_same_data_gives_the_same_policy_twice():
    def train() -> tuple[list[float], dict]:
        torch.rand(int(torch.randint(1, 100, (1,))))  # unseeded draws before, as in a long-lived process
        model = PolicyModel(seed=0)
        data = demonstration_decisions(
            model, _login_trajectories(12), {"login-user": LOGIN.spec}, {"login-user": 10}, validation_share=0.25
        )
        result = train_sft(model, data, SFTSettings(epochs=2, patience=2, batch_size=8))
        return result.train_loss, model.scorer.state_dict()

    (loss_a, state_a), (loss_b, state_b) = train(), train()
    assert loss_a == loss_b
    assert all(torch.equal(state_a[k], v) for k, v in state_b.items())


def test_a_policy_cache_kept_between_runs_gives_the_same_decisions(tmp_path):
    from training.policy.store import keep_policy_cache, policy_cache_dir, warm_policy_cache

    trajectories = _login_trajectories(6)
    specs, steps = {"login-user": LOGIN.spec}, {"login-user": 10}
    first = PolicyModel(seed=0)
    data = demonstration_decisions(first, trajectories, specs, steps, validation_share=0.0)
    kept = keep_policy_cache(first, tmp_path)
    assert kept == policy_cache_dir(tmp_path, first.encoder.fingerprint)
    second = PolicyModel(seed=0)
    assert warm_policy_cache(second, tmp_path) == len(first.cache) > 0
    again = demonstration_decisions(second, trajectories, specs, steps, validation_share=0.0)
    assert second.cache.misses == 0  # nothing encoded twice
    stored = (kept / "embeddings.npy").stat().st_mtime_ns
    keep_policy_cache(second, tmp_path)  # nothing new: the stored cache is not rewritten
    assert (kept / "embeddings.npy").stat().st_mtime_ns == stored
    torch.testing.assert_close(
        first.log_probs(first.batch(data.train)), second.log_probs(second.batch(again.train)), rtol=0, atol=0
    )
    assert warm_policy_cache(PolicyModel(seed=0), tmp_path / "elsewhere") == 0  # none kept: a cold start


def test_policies_in_one_sampling_stream_draw_the_same_numbers_on_an_instance(model):
    """Issue 41 item 4: RL's acting policies of two reward sources have different ids but share
    the iteration's sampling stream, so on one instance they make the same draws; another stream
    or instance draws others, and without a stream the policy id keys the draws as before."""
    assert sampling_key("rl:a:i000", "rl:a:i000:login-user:7") == "rl:a:i000|rl:a:i000:login-user:7"
    assert sampling_key("rl:a:i000", "rl:a:i000:login-user:7", "s0|i000") == "s0|i000|login-user:7"
    assert sampling_key("rl:b:i000", "rl:b:i000:login-user:7", "s0|i000") == "s0|i000|login-user:7"

    def draws(policy_id: str, instance: str, stream: str) -> list[float]:
        policy = LearnedPolicy(model, policy_id=policy_id, sampling_stream=stream)
        actor = policy.start(_context(f"{policy_id}:{instance}"))
        return [actor.rng.random() for _ in range(4)]  # type: ignore[attr-defined]

    shared = draws("rl:outcome:i000", "login-user:7", "s0|i000")
    assert draws("rl:orm:i000", "login-user:7", "s0|i000") == shared
    assert draws("rl:orm:i000", "login-user:8", "s0|i000") != shared
    assert draws("rl:orm:i000", "login-user:7", "s1|i000") != shared
    assert draws("rl:orm:i000", "login-user:7", "") != draws("rl:outcome:i000", "login-user:7", "")
    # the stream travels to the nodes with the policy
    snapshot = LearnedPolicy(model, policy_id="rl:orm:i000", sampling_stream="s0|i000").portable()
    assert snapshot.sampling_stream == "s0|i000"


def test_the_policy_sft_assets_config_names_every_setting_and_the_sft_seed_reaches_sft():
    """Every field of the asset's config is a :class:`PolicySettings` field of its name, except SFT's own
    (``epochs``, ``sft_seed``): a renamed field fails here instead of in a run (issue 41: another SFT seed
    is another SFT policy to replicate a finding on)."""
    from assets.rl import PolicySFTConfig
    from training.policy.sft_stage import PolicySettings

    default = PolicySettings.from_config(PolicySFTConfig().model_dump())
    assert default == PolicySettings()  # the config's defaults are the stage's
    chosen = PolicySettings.from_config(
        PolicySFTConfig(sft_seed=3, epochs=2, tasks=["use-spinner"], selection_seeds=7).model_dump()
    )
    assert chosen.sft == SFTSettings(epochs=2, seed=3)
    assert chosen.tasks == ("use-spinner",) and chosen.selection_seeds == 7
    with pytest.raises(TypeError, match="no_such_setting"):
        PolicySettings.from_config({"no_such_setting": 1})
