"""Serving: the Python batch API and the HTTP service on 127.0.0.1 (real server, real model)."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

from training.base.states import TextStep, TextTrajectory, progress_state
from training.reward_models.models import RewardScorer
from training.reward_models.serving import ServingLimits, score_trajectories
from training.reward_models.serving_app import serve_in_background

LOGIN = 'Enter the username "vanda" and the password "abc" into the text fields and press login.'


def _element(role, **kw):
    return {"role": role, **kw}


def _login_screen(user=None, password=None):
    return [
        _element("body", depth=0),
        _element("label", text="Username", classes="bold", clickable=True, depth=2),
        _element("textbox", element_id="username", value=user, editable=True, clickable=True, depth=2),
        _element("label", text="Password", classes="bold", clickable=True, depth=2),
        _element("password", element_id="password", value=password, editable=True, clickable=True, depth=2),
        _element("button", element_id="subbtn", text="Login", clickable=True, depth=2),
    ]


TRAJECTORY = {
    "id": "rollout-7",
    "instruction": LOGIN,
    "steps": [
        {"screen": _login_screen(), "action": "CLICK(textbox#username)"},
        {"screen": _login_screen(), "action": 'INPUT(textbox#username, "vanda")'},
        {"screen": _login_screen("vanda"), "action": 'INPUT(password#password, "abc")'},
        {"screen": _login_screen("vanda", "abc"), "action": 'CLICK(button#subbtn "Login")'},
    ],
}


@pytest.fixture(scope="module")
def scorer(trained_progrm):
    return RewardScorer.from_checkpoint(trained_progrm)


@pytest.fixture(scope="module")
def server(scorer):
    server, thread = serve_in_background(scorer, "127.0.0.1", 0, ServingLimits(max_body_bytes=200_000, max_states=50))
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _request(server, method, path, body=None, headers=None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    payload = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=payload, headers={"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data) if data else None


def test_http_scores_a_trajectory_with_progress_gains(server, scorer):
    assert server.server_address[0] == "127.0.0.1"
    status, health = _request(server, "GET", "/health")
    assert status == 200 and health == {"status": "ok", "kind": "progrm_env"}
    status, body = _request(server, "POST", "/v1/score", {"trajectories": [TRAJECTORY], "k": 1})
    assert status == 200, body
    result = body["results"][0]
    assert result["id"] == "rollout-7" and len(result["scores"]) == 4
    scores = np.array(result["scores"])
    assert np.all((scores >= 0) & (scores <= 1))
    # Eq. 2: r_t = p_t - p_{t-1}, p_{-1} = 0; the rewards of a progress model are the gains
    np.testing.assert_allclose(result["progress_gains"], np.diff(np.concatenate([[0.0], scores])), atol=1e-9)
    assert result["rewards"] == result["progress_gains"]
    assert scores[-1] > scores[0]  # a completed login ends with more progress than it starts
    # the same numbers through the Python batch API
    from training.reward_models.serving import parse_trajectory

    traj = parse_trajectory(TRAJECTORY, "t", ServingLimits())
    api = score_trajectories(scorer, [traj], k=1)[0]
    np.testing.assert_allclose(api.scores, result["scores"], atol=1e-9)
    status, body = _request(server, "POST", "/v1/score", {"trajectories": [TRAJECTORY], "k": 2})
    s = np.array(body["results"][0]["scores"])
    np.testing.assert_allclose(body["results"][0]["progress_gains"], s - np.concatenate([[0, 0], s[:-2]]), atol=1e-9)


def test_http_scores_single_states_and_text_screens(server, scorer):
    state = {
        "instruction": LOGIN,
        "history": ["CLICK(textbox#username)", 'INPUT(textbox#username, "vanda")'],
        "screen": 'textbox#username value="vanda" [clickable, editable]\nbutton#subbtn "Login" [clickable]',
    }
    status, body = _request(server, "POST", "/v1/score", {"steps": [state, state]})
    assert status == 200 and len(body["results"][0]["scores"]) == 2
    assert body["results"][0]["scores"][0] == pytest.approx(body["results"][0]["scores"][1])
    status, info = _request(server, "GET", "/v1/model")
    assert status == 200 and info["kind"] == "progrm_env" and info["limits"]["max_states"] == 50


def test_trajectory_states_match_the_training_indexing(scorer):
    traj = TextTrajectory("x", "login-user", LOGIN, tuple(TextStep(("body",), f"A{t}") for t in range(2)))
    ours = score_trajectories(scorer, [traj])[0].scores
    direct = scorer.score_states([progress_state(traj, 0), progress_state(traj, 1)])
    np.testing.assert_allclose(ours, direct)


@pytest.mark.parametrize(
    ("body", "headers", "status", "message"),
    [
        (b"{not json", None, 400, "malformed JSON"),
        ({"trajectories": [TRAJECTORY]}, {"Content-Type": "text/plain"}, 415, "application/json"),
        ([1, 2], None, 422, "JSON object"),
        ({}, None, 422, "exactly one of"),
        (
            {"trajectories": [{"instruction": LOGIN, "steps": []}]},
            None,
            422,
            "trajectories[0].steps must be a non-empty list",
        ),
        (
            {"trajectories": [{"instruction": LOGIN, "steps": [{"screen": [], "action": 5}]}]},
            None,
            422,
            "trajectories[0].steps[0].action must be a string",
        ),
        (
            {"trajectories": [{"instruction": LOGIN, "steps": [{"screen": [{"bogus": 1}], "action": "CLICK(x)"}]}]},
            None,
            422,
            "unknown fields ['bogus']",
        ),
        (
            {"trajectories": [{"instruction": "", "steps": [{"screen": "x", "action": "CLICK(x)"}]}]},
            None,
            422,
            "instruction must not be empty",
        ),
        ({"trajectories": [TRAJECTORY], "k": 0}, None, 422, "'k'"),
        ({"trajectories": [TRAJECTORY] * 13}, None, 413, "52 steps; at most 50"),
        ({"steps": [{"instruction": LOGIN, "screen": "x" * 30_000}]}, None, 413, "longer than"),
        ({"trajectories": [TRAJECTORY], "extra": 1}, None, 422, "unknown fields ['extra']"),
    ],
)
def test_http_refuses_bad_input_with_a_clear_4xx(server, body, headers, status, message):
    code, answer = _request(server, "POST", "/v1/score", body, headers)
    assert code == status, answer
    assert answer["error"]["status"] == status and message in answer["error"]["message"]


def test_http_refuses_oversized_bodies_unknown_paths_and_methods(server):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.putrequest("POST", "/v1/score")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", "300000")  # declared too large: refused before reading it
    conn.endheaders()
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    assert response.status == 413 and "at most 200000" in answer["error"]["message"]
    assert _request(server, "GET", "/nope")[0] == 404
    assert _request(server, "GET", "/v1/score")[0] == 405
    assert _request(server, "POST", "/health", {})[0] == 405
    # the server still answers after all that
    assert _request(server, "POST", "/v1/score", {"trajectories": [TRAJECTORY]})[0] == 200


def test_action_target_adds_its_context_as_in_training():
    from training.reward_models.serving import parse_trajectory

    screen = [
        _element("body", depth=0),
        _element("div", element_id="area", depth=1),
        _element("div", classes="media", depth=2),
        _element("span", classes="username", text="@lacus", depth=3),
        _element("span", classes="retweet", clickable=True, depth=3),
        _element("div", classes="media", depth=2),
        _element("span", classes="username", text="@kanesha", depth=3),
        _element("span", classes="retweet", clickable=True, depth=3),
    ]
    raw = {
        "instruction": 'For the user @kanesha, click on the "Retweet" button.',
        "steps": [{"screen": screen, "action": "CLICK(span.retweet)", "target": 7}],
    }
    traj = parse_trajectory(raw, "t", ServingLimits())
    assert traj.steps[0].action == 'CLICK(span.retweet) within "@kanesha"'
    raw["steps"][0]["target"] = 99
    with pytest.raises(Exception, match="not an index"):
        parse_trajectory(raw, "t", ServingLimits())
