"""GUI-Shepherd's rationales for human step labels: the prompt and parser (pure), and the stage
against the real SmolLM2-135M-Instruct behind ``transformers serve``: rows keyed by the label's
identity, every failure counted (an endpoint killed mid-run included), one line when the endpoint
is down before the start."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from tests.annotation.labelstudio.conftest import build_small_warehouse
from training.llm.chat_client import ChatClient, ChatEndpoint
from training.llm.endpoint import free_port, serve_local_model
from training.llm.rationales import (
    DATASET,
    PROMPT_VERSION,
    TABLE,
    RationaleEndpointError,
    RationaleOptions,
    RationaleRequest,
    generate_label_rationales,
    merge_rows,
    parse_rationale,
    pending_labels,
    public_url,
    rationale_messages,
)
from warehouse.catalog import Materialization, Warehouse
from warehouse.model import Screen, UIElement
from warehouse.tables_annotation import HUMAN_LABELS

SCREEN = Screen(
    (
        UIElement(ref="1", role="body"),
        UIElement(ref="2", role="div", text='Enter the username "ada" and press login.'),
        UIElement(ref="3", role="textbox", element_id="username", clickable=True, editable=True),
        UIElement(ref="4", role="button", text="Login", clickable=True),
    )
)
REQUEST = RationaleRequest(
    'Enter the username "ada" and press login.', SCREEN, 'INPUT(textbox#username, "ada")', "positive", ("CLICK(3)",)
)


# -- pure -------------------------------------------------------------------------------------


def test_the_prompt_carries_instruction_screen_action_and_the_human_verdict():
    system, user = rationale_messages(REQUEST)
    assert system["role"] == "system" and "verdict is final" in system["content"]
    text = user["content"]
    assert 'Instruction: Enter the username "ada"' in text and "1. CLICK(3)" in text
    assert "[1] textbox#username [clickable, editable]" in text and '[2] button "Login"' in text
    assert 'Action: INPUT(textbox#username, "ada")' in text
    assert "Human verdict: the action is correct." in text and text.endswith("Explain why the action is correct.")
    negative = rationale_messages(RationaleRequest("i", SCREEN, "CLICK(4)", "negative"))
    assert negative[1]["content"].endswith("Explain why the action is incorrect.")
    with pytest.raises(ValueError, match="unsure"):
        rationale_messages(RationaleRequest("i", SCREEN, "CLICK(4)", "unsure"))


def test_a_long_prompt_cuts_the_screen_first_and_gives_up_when_nothing_fits():
    many = Screen(tuple(UIElement(ref=str(i), role="button", text=f"option {i}", clickable=True) for i in range(300)))
    request = RationaleRequest("pick option 7", many, "CLICK(7)", "positive")
    full = rationale_messages(request, max_prompt_chars=100_000, max_elements=300)
    assert full is not None and "[299] button" in full[1]["content"]
    cut = rationale_messages(request, max_prompt_chars=2500, max_elements=300)
    assert cut is not None and sum(len(m["content"]) for m in cut) <= 2500
    assert "more elements not shown" in cut[1]["content"] and "[299] button" not in cut[1]["content"]
    assert rationale_messages(RationaleRequest("x" * 5000, many, "CLICK(7)", "positive"), max_prompt_chars=2500) is None


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Rationale: The username field is empty, so typing it moves the task on.", ("The username field", None)),
        ("```\nThe login button submits the form, which the task needs.\n```", ("The login button submits", None)),
        ("   \n ", (None, "empty")),
        ("Yes.", (None, "unparsed")),
        ("Instruction: Enter the username and press login.", (None, "unparsed")),
    ],
)
def test_answers_are_cleaned_or_counted_as_failures(answer, expected):
    text, failure = parse_rationale(answer)
    assert failure == expected[1]
    assert (text is None) if expected[0] is None else text.startswith(expected[0])


def test_repeats_are_kept_once_and_a_cut_answer_ends_at_its_last_sentence():
    text, failure = parse_rationale("Typing 3.5 is right. The field needs it. The field needs it. Then the user")
    assert failure is None and text == "Typing 3.5 is right. The field needs it."


def test_a_rambling_answer_is_cut_at_a_sentence():
    text, failure = parse_rationale(" ".join(f"Field {i} is empty." for i in range(200)))
    assert failure is None and len(text) <= 1200 and text.endswith(".")


def test_stored_urls_have_no_credentials():
    assert public_url("https://user:s3cret@api.example.com:8443/v1?key=abc#x") == "https://api.example.com:8443/v1"
    assert public_url("http://127.0.0.1:8791/v1") == "http://127.0.0.1:8791/v1"


def _label(annotation_id: int, label: str, *, revision: int = 1, **extra) -> dict:
    return {
        "ls_server": "local",
        "annotation_id": annotation_id,
        "revision": revision,
        "interface": "step_correctness",
        "status": "active",
        "was_cancelled": False,
        "label": label,
        "episode_id": "e",
        "step_idx": 0,
    } | extra


def test_pending_labels_are_the_active_verdicts_without_a_rationale_of_their_revision():
    labels = [
        _label(1, "positive"),
        _label(2, "negative", revision=2),  # explained at revision 1 only: asked again
        _label(3, "unsure"),
        _label(4, "positive", status="retracted"),
        _label(5, "negative", was_cancelled=True),
        _label(6, None, interface="step_progress"),
        _label(7, "positive"),  # its earlier try failed: asked again
        _label(8, "negative"),  # explained: not asked
    ]
    done = [
        {"ls_server": "local", "annotation_id": 2, "revision": 1, "ok": True},
        {"ls_server": "local", "annotation_id": 7, "revision": 1, "ok": False},
        {"ls_server": "local", "annotation_id": 8, "revision": 1, "ok": True},
    ]
    assert [(r["annotation_id"], r["revision"]) for r in pending_labels(labels, done)] == [(1, 1), (2, 2), (7, 1)]
    merged = merge_rows(done, [{"ls_server": "local", "annotation_id": 7, "revision": 1, "ok": True}])
    assert [(r["annotation_id"], r["ok"]) for r in merged] == [(2, True), (7, True), (8, True)]


# -- the stage against the real SmolLM2 -----------------------------------------------------------


def _with_labels(warehouse: Warehouse, verdicts: list[str]) -> list[dict]:
    """``human_labels`` rows for the first steps of the small warehouse, one verdict each."""
    steps = warehouse.query("SELECT episode_id, step_idx FROM steps ORDER BY episode_id, step_idx").to_pylist()
    now = datetime.now(UTC)
    rows = [
        {name: None for name in HUMAN_LABELS.names}
        | {
            "ls_server": "local",
            "annotation_id": 100 + i,
            "ls_project_id": 1,
            "ls_task_id": 10 + i,
            "interface": "step_correctness",
            "episode_id": step["episode_id"],
            "step_idx": step["step_idx"],
            "label": verdict,
            "status": "active",
            "was_cancelled": False,
            "ground_truth": False,
            "usable_for_training": verdict != "unsure",
            "revision": 1,
            "created_at": now,
        }
        for i, (step, verdict) in enumerate(zip(steps, verdicts, strict=False))
    ]
    m = Materialization(asset="test_labels")
    warehouse.publish(
        m, [warehouse.stage_table("human_labels", "local-1", pa.Table.from_pylist(rows, HUMAN_LABELS), m)]
    )
    return rows


def _stored(warehouse: Warehouse) -> list[dict]:
    return warehouse.query(f"SELECT * FROM {TABLE} ORDER BY annotation_id, revision").to_pylist()


@pytest.mark.e2e
def test_rationales_from_smollm2_are_stored_with_their_labels(smollm2_endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("RATIONALE_TEST_KEY", "sk-never-stored-123")
    warehouse = build_small_warehouse(tmp_path / "home")
    _with_labels(warehouse, ["positive", "negative", "unsure", "positive"])
    client = ChatClient(ChatEndpoint(smollm2_endpoint.base_url, smollm2_endpoint.model, "RATIONALE_TEST_KEY", 120))
    summary = generate_label_rationales(warehouse, client, RationaleOptions(max_tokens=80))
    rows = _stored(warehouse)
    assert [(r["annotation_id"], r["label"]) for r in rows] == [(100, "positive"), (101, "negative"), (103, "positive")]
    assert summary["pending"] == 3 and summary["asked"] == 3 and summary["skipped"] == 0
    failures = sum(summary[f"failures_{f}"] for f in ("endpoint_error", "empty", "unparsed", "prompt_too_long"))
    assert summary["rationales"] + failures == 3 and summary["failures_endpoint_error"] == 0
    for row in rows:
        assert row["ok"] == (row["rationale"] is not None) and row["ok"] == (row["failure"] is None)
        assert row["model"] == smollm2_endpoint.model and row["prompt_version"] == PROMPT_VERSION
        assert row["endpoint"] == smollm2_endpoint.base_url and row["seconds"] > 0 and row["prompt_chars"] > 200
        assert row["revision"] == 1 and row["episode_id"] and row["created_at"] is not None
    assert summary["rationales"] == sum(r["ok"] for r in rows) and summary["seconds_per_call"] > 0
    assert all(len(r["rationale"].split()) >= 4 for r in rows if r["ok"])
    print("SmolLM2 rationales:", [(r["label"], r["rationale"] or r["failure"]) for r in rows])
    # asked again: only what failed; the explained labels keep their rows
    again = generate_label_rationales(warehouse, client, RationaleOptions(max_tokens=80))
    assert again["pending"] == 3 - summary["rationales"] and len(_stored(warehouse)) == 3
    # the key is never in the table or the catalog
    for path in warehouse.home.rglob("*"):
        if path.is_file():
            assert b"sk-never-stored-123" not in path.read_bytes(), path
    joined = warehouse.query("SELECT * FROM human_labels_with_rationales ORDER BY annotation_id").to_pylist()
    assert [(j["annotation_id"], j["llm_rationale_ok"] is not None) for j in joined] == [
        (100, True),
        (101, True),
        (102, False),  # the unsure label: nothing to explain
        (103, True),
    ]
    by_id = {r["annotation_id"]: r for r in rows}
    for j in (j for j in joined if j["annotation_id"] != 102):
        assert j["llm_rationale"] == by_id[j["annotation_id"]]["rationale"]
        assert j["llm_rationale_prompt_version"] == PROMPT_VERSION


def test_an_endpoint_down_before_the_start_is_one_line_and_writes_nothing(tmp_path):
    warehouse = build_small_warehouse(tmp_path / "home")
    _with_labels(warehouse, ["positive", "negative"])
    client = ChatClient(ChatEndpoint(f"http://user:pw@127.0.0.1:{free_port()}/v1", "smollm2", timeout_s=2))
    with pytest.raises(RationaleEndpointError) as refused:
        generate_label_rationales(warehouse, client)
    message = str(refused.value)
    assert "\n" not in message and "not reachable" in message and "pw@" not in message
    assert warehouse.current_version(TABLE, DATASET) is None


def test_nothing_pending_asks_nothing(tmp_path):
    warehouse = build_small_warehouse(tmp_path / "home")
    _with_labels(warehouse, ["unsure"])
    client = ChatClient(ChatEndpoint(f"http://127.0.0.1:{free_port()}/v1", "smollm2", timeout_s=2))
    summary = generate_label_rationales(warehouse, client)
    assert summary["pending"] == 0 and summary["asked"] == 0 and client.calls == 0


@pytest.mark.e2e
def test_an_endpoint_that_dies_mid_run_is_counted_and_the_rest_left_for_later(smollm2_model_folder, tmp_path):
    warehouse = build_small_warehouse(tmp_path / "home")
    _with_labels(warehouse, ["positive", "negative"] * 4)
    with serve_local_model(smollm2_model_folder, log_path=tmp_path / "serve.log") as endpoint:
        client = ChatClient(endpoint.chat_endpoint(timeout_s=60))

        def kill_after_the_first(message: str) -> None:
            if message.startswith("rationales: 1 of"):
                os.killpg(endpoint.pid, signal.SIGKILL)

        options = RationaleOptions(max_tokens=40, publish_every=1, stop_after_endpoint_errors=3)
        summary = generate_label_rationales(warehouse, client, options, log=kill_after_the_first)
    assert summary["asked"] == 4 and summary["failures_endpoint_error"] == 3 and summary["skipped"] == 4
    rows = _stored(warehouse)
    assert len(rows) == 4 and [r["failure"] for r in rows[1:]] == ["endpoint_error"] * 3
    assert all("not reachable" in r["error"] and "\n" not in r["error"] for r in rows[1:])
    # the next run asks the three failures and the four left over
    assert len(pending_labels(warehouse.query("SELECT * FROM human_labels").to_pylist(), rows)) == 8 - rows[0]["ok"]


def test_the_cli_says_in_one_line_that_the_endpoint_is_down(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    home = tmp_path / "home"
    _with_labels(build_small_warehouse(home), ["positive"])
    stepwise = Path(sys.executable).parent / "stepwise"
    env = os.environ | {"STEPWISE_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = subprocess.run(
        [str(stepwise), "annotate", "rationales", "--base-url", url, "--model", "m", "--timeout", "2"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("stepwise annotate rationales: rationale endpoint:")
    assert "not reachable" in done.stderr
