"""One fixed answer carried out on other instances (envs.fixed_answer): elements found by their
description, the answer stopping where its element is missing, and the rate over sources; live on
MiniWoB++ for a task a constant solves and one it cannot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.fixed_answer import (
    CONSTANT_ANSWERS_FILE,
    FixedAnswerPolicy,
    constant_answer_rate,
    fixed_answer_batch,
    fixed_answer_jobs,
    load_constant_answer_rates,
    transplant,
    write_constant_answer_rates,
)
from envs.miniwob.live import MiniWoBConfig
from envs.policies import make_policy
from envs.pool import EnvPool
from envs.pool_jobs import PoolConfig, plan_jobs
from envs.protocol import EpisodeContext
from envs.task_catalog import load_catalog
from warehouse.model import Action, ActionType, Screen, UIElement


def _element(ref: str, text: str, role: str = "button", element_id: str = "") -> UIElement:
    return UIElement(ref=ref, role=role, text=text, element_id=element_id)


def test_an_action_lands_on_the_element_with_the_same_description():
    recorded = Action(ActionType.CLICK, _element("7", "Submit", element_id="subbtn"))
    screen = Screen((_element("3", "Cancel"), _element("12", "Submit", element_id="subbtn")))
    moved = transplant(recorded, screen)
    assert moved is not None and moved.target is not None and moved.target.ref == "12"
    typed = Action(ActionType.INPUT, _element("4", "", role="input_text", element_id="tt"), text="-5")
    moved = transplant(typed, Screen((_element("9", "", role="input_text", element_id="tt"),)))
    assert moved is not None and moved.text == "-5" and moved.target is not None and moved.target.ref == "9"
    assert transplant(recorded, Screen((_element("12", "Submit now", element_id="subbtn"),))) is None
    assert transplant(Action(ActionType.NOTHING), Screen(())) == Action(ActionType.NOTHING)


def test_an_answer_that_does_not_fit_stops_and_then_does_nothing():
    answer = (Action(ActionType.CLICK, _element("1", "ONE")), Action(ActionType.CLICK, _element("2", "TWO")))
    policy = FixedAnswerPolicy({"e": answer})
    task = load_catalog()["click-button-sequence"].spec
    context = EpisodeContext(task, "", {}, 0, "miniwob", frozenset(ActionType), 3, episode_id="e")
    actor = policy.start(context)
    first = actor.act(Screen((_element("5", "ONE"), _element("6", "THREE"))))
    assert first.target is not None and first.target.ref == "5"
    assert actor.act(Screen((_element("6", "THREE"),))).type is ActionType.NOTHING  # TWO is not there
    assert actor.act(Screen((_element("8", "TWO"),))).type is ActionType.NOTHING  # stopped for good


def test_the_rate_is_the_best_source_and_the_mean_over_sources():
    rate = constant_answer_rate({10: [True, False, False, False], 11: [False] * 4, 12: [True, True, False, False]})
    assert rate == {"best": 0.5, "mean": 0.25, "best_source": 12, "sources": 3, "targets": 4}
    assert constant_answer_rate({})["best"] is None


def test_jobs_leave_out_the_source_and_budget_one_step_past_the_answer():
    catalog = load_catalog()
    source, *targets = plan_jobs([catalog["use-spinner"]], batch="b", seeds=[5, 5, 6, 7])
    jobs = fixed_answer_jobs(source, 3, [source, *targets])
    assert [j.seed for j in jobs] == [6, 7] and {j.max_steps for j in jobs} == {4}
    assert len({j.episode_id for j in jobs}) == 2 and all(":5:" in j.episode_id for j in jobs)


def test_the_rates_file_merges_atomically_and_a_bad_entry_names_the_file_and_task(tmp_path):
    path = tmp_path / "constant_answers.json"
    assert load_constant_answer_rates(path) == {}
    write_constant_answer_rates({"a": {"best": 0.1, "mean": 0.05}, "b": {"best": None, "why": "no source"}}, path)
    write_constant_answer_rates({"c": {"best": 0.0, "mean": 0.0}}, path)  # a, b kept
    assert load_constant_answer_rates(path) == {"a": 0.1, "c": 0.0}  # b could not be rated
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
    path.write_text('{"tasks": {"a": {"best": 1.5}}}')
    with pytest.raises(
        ValueError, match=r"constant_answers.json: task 'a': 'best' must be a share in \[0, 1\], got 1.5"
    ):
        load_constant_answer_rates(path)
    path.write_text('{"tasks": {"a": {"Best": 0.2}}}')  # a misspelt key is not "could not be measured"
    with pytest.raises(ValueError, match="task 'a': no 'best'"):
        load_constant_answer_rates(path)
    path.write_text('{"tasks": []}')
    with pytest.raises(ValueError, match="'tasks' must map task ids"):
        load_constant_answer_rates(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="constant_answers.json: not a constant-answer file"):
        load_constant_answer_rates(path)


def test_the_catalog_s_measured_rates_leave_the_farmable_long_tasks_out():
    """The recorded measurement (stop 70: 10 sources x 40 targets per long task) read by the rule."""
    from training.policy.task_blocks import farmable_tasks

    rates = load_constant_answer_rates(CONSTANT_ANSWERS_FILE)
    assert set(farmable_tasks(rates)) == {"click-shades", "guess-number", "use-spinner"}
    assert rates["click-checkboxes-large"] == 0.0 and "book-flight-nodelay" not in rates  # not measurable


def _script():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "constant_answers.py"
    spec = importlib.util.spec_from_file_location("constant_answers", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_task_without_a_scripted_solution_is_said_to_be_unmeasurable_not_solved_by_nobody(
    tmp_path, capsys, monkeypatch
):
    """book-flight-nodelay's and search-engine's specs have no solution: the script says so, and starts
    no browser for them (the old script ran the expert anyway and reported "solved none of 10")."""
    script = _script()

    def no_pool(*_: object) -> None:
        raise AssertionError("a pool was started for tasks without a source")

    monkeypatch.setattr(script, "_run_answers", no_pool)
    out = tmp_path / "attempts.jsonl"
    assert script.main(["--tasks", "book-flight-nodelay,search-engine", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for task in ("book-flight-nodelay", "search-engine"):
        assert f"| {task} | - | - | - | - | not measurable: {script.NO_SOLUTION} |" in printed
    assert out.read_text() == ""
    entries = json.loads(CONSTANT_ANSWERS_FILE.read_text())["tasks"]
    assert entries["book-flight-nodelay"]["why"] == entries["search-engine"]["why"] == script.NO_SOLUTION


@pytest.mark.e2e
def test_live_a_constant_solves_click_button_sequence_and_not_click_checkboxes_large():
    """The expert's answer on one instance, carried out on five others: click-button-sequence asks
    the same thing every time (every target solved); click-checkboxes-large asks for other boxes."""
    catalog = load_catalog()
    tasks = [catalog["click-button-sequence"], catalog["click-checkboxes-large"]]
    sources = plan_jobs(tasks, batch="sources", seeds=[7_000_000])
    targets = plan_jobs(tasks, batch="targets", seeds=range(7_000_001, 7_000_006))
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=0)) as pool:
        solved = pool.run(sources, make_policy("expert")).episodes
        assert [r.success for r in solved] == [True, True]
        jobs, answers, _ = fixed_answer_batch(list(zip(sources, solved, strict=True)), targets)
        tried = pool.run(jobs, FixedAnswerPolicy(answers)).episodes
    by_task = {t.task_id: [r.success for r in tried if r.task_id == t.task_id] for t in tasks}
    assert by_task == {"click-button-sequence": [True] * 5, "click-checkboxes-large": [False] * 5}
