"""Fuzz (c): request bodies of the scoring service are answered 2xx or 4xx in JSON, never 500.

``parse_score_request`` over generated payloads (valid ones mutated, and arbitrary JSON): a
ScoreRequest whose every text a tokenizer can read, or a RequestError with a 4xx status. A few
examples go through the real HTTP handler with a real (tiny, trained) model. Regression: a lone
surrogate ("\\ud800") in a text field gave a 500; it is a 422 naming the field.
"""

from __future__ import annotations

import copy
import http.client
import json
from dataclasses import astuple, is_dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.envs.fuzzing import fuzz_settings
from training.reward_models.kinds import REWARD_MODEL_KINDS, state_for
from training.reward_models.models import RewardScorer
from training.reward_models.serving import RequestError, ServingLimits, parse_score_request
from training.reward_models.serving_app import serve_in_background

LOGIN = 'Enter the username "vanda" and the password "abc" into the text fields and press login.'


def _login_screen(user: str | None = None) -> list[dict]:
    return [
        {"role": "body", "depth": 0},
        {"role": "label", "text": "Username", "classes": "bold", "clickable": True, "depth": 2},
        {"role": "textbox", "element_id": "username", "value": user, "editable": True, "depth": 2},
        {"role": "button", "element_id": "subbtn", "text": "Login", "clickable": True, "depth": 2},
    ]


TRAJECTORY = {
    "id": "rollout-7",
    "instruction": LOGIN,
    "steps": [
        {"screen": _login_screen(), "action": "CLICK(textbox#username)", "target": 2},
        {"screen": _login_screen(), "action": 'INPUT(textbox#username, "vanda")'},
        {"screen": _login_screen("vanda"), "action": 'CLICK(button#subbtn "Login")'},
    ],
    "final_screen": "text Welcome",
}
LIMITS = ServingLimits(max_body_bytes=200_000, max_states=50, max_text_chars=2_000, max_elements_per_screen=50)
SINGLE = {"steps": [{"instruction": "Click Login", "history": ["CLICK(x)"], "screen": "button Login", "action": "A"}]}

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "", " ", "CLICK(x)", "0", "ref-1", "x" * 2_100]),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)
_FIELDS = ["k", "trajectories", "steps", "id", "instruction", "screen", "action", "target", "final_screen"]
_FIELDS += ["history", "role", "text", "element_id", "bounds", "depth", "checked", "clickable", "task_id", "value"]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (of keys and indices) into a JSON value."""
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


@st.composite
def _payloads(draw) -> Any:
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "arbitrary"]))
    if kind == "arbitrary":
        return draw(_JSON)
    payload = copy.deepcopy(draw(st.sampled_from([{"trajectories": [TRAJECTORY], "k": 1}, SINGLE])))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(payload)))
        if not path:
            continue
        parent = payload
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "add", "corrupt-text"]))
        if action == "corrupt-text":  # a text field, still a string, with something a tokenizer cannot read
            texts = [q for q in _paths(payload) if q and isinstance(_at(payload, q), str)]
            if texts:
                where = draw(st.sampled_from(texts))
                text = _at(payload, where)
                cut = draw(st.integers(0, len(text)))
                insert = draw(st.sampled_from(["\ud800", "\udfff", "\x00", "\u2028", "\U0001f600"]))
                _at(payload, where[:-1])[where[-1]] = text[:cut] + insert + text[cut:]
        elif action == "replace":
            parent[path[-1]] = draw(_JSON)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(_FIELDS))] = draw(_JSON)
        else:
            parent.append(draw(_JSON))
    return payload


def _at(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if is_dataclass(value) and not isinstance(value, type):
        value = astuple(value)
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _texts(v)]
    return []


@pytest.mark.fuzz
@fuzz_settings(300)
@given(payload=_payloads(), kind=st.sampled_from(sorted(REWARD_MODEL_KINDS)))
def test_fuzz_parse_score_request_accepts_or_refuses_with_a_4xx(payload, kind):
    try:
        request = parse_score_request(payload, LIMITS, kind)
    except RequestError as exc:
        assert 400 <= exc.status < 500 and exc.message
        return
    states = list(request.states)
    for trajectory in request.trajectories:
        states += [state_for(kind, trajectory, t) for t in range(len(trajectory))]
    for text in _texts(states):
        text.encode("utf-8")  # what a tokenizer needs: no lone surrogate got through


@pytest.mark.parametrize("where", ["instruction", "steps.0.action", "steps.0.screen.1.text", "id"])
def test_a_lone_surrogate_is_a_422_naming_the_field(where):
    payload = {"trajectories": [copy.deepcopy(TRAJECTORY)]}
    target: Any = payload["trajectories"][0]
    *parents, last = where.split(".")
    for key in parents:
        target = target[int(key) if key.isdigit() else key]
    target[int(last) if last.isdigit() else last] = "a\ud800b"
    with pytest.raises(RequestError) as info:
        parse_score_request(payload, LIMITS, "progrm_env")
    named = "trajectories[0]." + ".".join(f"[{k}]" if k.isdigit() else k for k in where.split(".")).replace(".[", "[")
    assert info.value.status == 422 and named in info.value.message and "surrogate" in info.value.message


# -- through the HTTP handler, with a real model --------------------------------------------------


@pytest.fixture(scope="module")
def server(trained_progrm):
    server, thread = serve_in_background(RewardScorer.from_checkpoint(trained_progrm), "127.0.0.1", 0, LIMITS)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _post(server, body: bytes) -> tuple[int, Any]:
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/v1/score", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data)


def test_http_a_lone_surrogate_is_a_422_not_a_500(server):
    body = {"trajectories": [dict(copy.deepcopy(TRAJECTORY), instruction="Enter \ud800 the username")]}
    status, answer = _post(server, json.dumps(body).encode())  # json.dumps writes it as \ud800
    assert status == 422 and "trajectories[0].instruction" in answer["error"]["message"]
    status, answer = _post(server, b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nested" in answer["error"]["message"]
    status, _ = _post(server, b'{"k": ' + b"9" * 5_000 + b"}")
    assert status == 400


@pytest.mark.fuzz
@fuzz_settings(8)
@given(payload=_payloads() | st.just({"trajectories": [TRAJECTORY]}))
def test_fuzz_http_answers_2xx_or_4xx_in_json(server, payload):
    status, answer = _post(server, json.dumps(payload).encode())
    assert 200 <= status < 300 or 400 <= status < 500, answer
    if status >= 400:
        assert answer["error"]["status"] == status and answer["error"]["message"]
    else:
        assert answer["results"]


def test_the_valid_payloads_used_for_mutation_are_valid():
    assert parse_score_request({"trajectories": [TRAJECTORY]}, LIMITS, "progrm_env").trajectories
    assert parse_score_request(SINGLE, LIMITS, "prm").states
    assert _login_screen()[0]["role"] == "body"
