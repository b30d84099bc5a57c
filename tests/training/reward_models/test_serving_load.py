"""The HTTP service under concurrent load (issue 14): a real server on a free port with a real
(tiny, trained) model. Behaviour is asserted, not timings: every request is answered 200 or 503
(with Retry-After), none with a connection reset; a half-sent body blocks nobody; concurrent
requests share forward passes and each gets its own scores."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from training.reward_models.models import RewardScorer
from training.reward_models.serving import ServingLimits, parse_trajectory, score_trajectories
from training.reward_models.serving_app import BatchingSettings, serve_in_background

LOGIN = 'Enter the username "{user}" and the password "abc" into the text fields and press login.'
FORM = 'label "Username"\ntextbox#username{value} [clickable, editable]\nlabel "Password"\npassword#password'


def _trajectory(i: int, n_steps: int = 4) -> dict:
    """A small login trajectory with text screens (as ``HTTPScorer`` sends them); ``i`` varies the
    username, ``n_steps`` the length (so that a result routed to the wrong request would show)."""
    user = f"user{i}"
    screens = [FORM.format(value=""), FORM.format(value=""), FORM.format(value=f' value="{user}"')]
    actions = ["CLICK(textbox#username)", f'INPUT(textbox#username, "{user}")', 'INPUT(password#password, "abc")']
    steps = [{"screen": screens[t % 3] + '\nbutton#subbtn "Login"', "action": actions[t % 3]} for t in range(n_steps)]
    return {"id": f"req-{i}", "instruction": LOGIN.format(user=user), "steps": steps}


def _body(i: int, n_steps: int = 4) -> bytes:
    return json.dumps({"k": 1, "trajectories": [_trajectory(i, n_steps)]}).encode()


@pytest.fixture(scope="module")
def scorer(trained_progrm):
    return RewardScorer.from_checkpoint(trained_progrm)


def _start(scorer, batching: BatchingSettings | None = None, limits: ServingLimits | None = None):
    server, thread = serve_in_background(scorer, "127.0.0.1", 0, limits or ServingLimits(), batching)
    return server


def _stop(server) -> None:
    server.shutdown()
    server.server_close()


def _post(server, body: bytes, timeout: float = 120) -> tuple[object, dict | None, str | None]:
    """(status or the exception's name, the JSON answer, Retry-After); connection errors are
    returned, not raised, so that a burst can count them."""
    host, port = server.server_address
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.request("POST", "/v1/score", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        conn.close()
    except (OSError, http.client.HTTPException) as exc:  # ConnectionResetError, RemoteDisconnected, ...
        return type(exc).__name__, None, None
    return response.status, json.loads(data), response.getheader("Retry-After")


def _burst(server, bodies: list[bytes]) -> list[tuple[object, dict | None, str | None]]:
    """Every body POSTed at once, one thread and one connection each (released together)."""
    barrier = threading.Barrier(len(bodies))

    def one(body: bytes):
        barrier.wait()
        return _post(server, body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def _half_sent(server, body: bytes, sent: int) -> socket.socket:
    """A connection whose request declares the whole body but sends only its first ``sent`` bytes."""
    sock = socket.create_connection(server.server_address)
    head = b"POST /v1/score HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
    sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:sent])
    return sock


def _read_response(sock: socket.socket, timeout: float = 60) -> tuple[int, dict]:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed without a response: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split(b" ")[1]), json.loads(rest[:length])


def test_256_concurrent_requests_and_a_half_sent_body_all_get_an_answer_none_a_reset(scorer):
    server = _start(scorer)
    try:
        idle_body = _body(10_000)
        idle = _half_sent(server, idle_body, sent=len(idle_body) // 2)  # held through the whole burst
        answers = _burst(server, [_body(i) for i in range(256)])
        statuses = Counter(status for status, _, _ in answers)
        assert set(statuses) <= {200, 503}, statuses  # no ConnectionResetError, RemoteDisconnected, timeout
        for status, answer, retry_after in answers:
            if status == 503:
                assert retry_after is not None and int(retry_after) >= 1 and answer["error"]["status"] == 503
        # with the default bounds (1,024 requests, 16,384 states) 256 requests can never fill the queue
        assert statuses == {200: 256}
        ids = sorted(answer["results"][0]["id"] for _, answer, _ in answers)
        assert ids == sorted(f"req-{i}" for i in range(256))
        # the held connection was not dropped: the rest of its body arrives and it is scored
        idle.sendall(idle_body[len(idle_body) // 2 :])
        status, answer = _read_response(idle)
        idle.close()
        assert status == 200 and answer["results"][0]["id"] == "req-10000"
        assert server.batcher.stats()["batches"] < 257  # shared forward passes
    finally:
        _stop(server)


def test_a_full_queue_answers_503_with_retry_after_never_a_reset(scorer):
    class SlowScorer:  # the real model, slower, so that the tiny queue fills for sure
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def score_states(self, states, batch_size=256):
            time.sleep(0.02)
            return self._inner.score_states(states, batch_size)

    batching = BatchingSettings(max_queue_requests=2, max_batch_states=8)
    server = _start(SlowScorer(scorer), batching)
    try:
        idle = _half_sent(server, _body(1), sent=10)
        answers = _burst(server, [_body(i) for i in range(256)])
        statuses = Counter(status for status, _, _ in answers)
        assert set(statuses) <= {200, 503}, statuses
        assert statuses[503] > 0 and statuses[200] > 0, statuses
        for status, answer, retry_after in answers:
            if status == 503:
                assert retry_after is not None and 1 <= int(retry_after) <= batching.retry_after_max_s
                assert answer["error"]["reason"] == "Service Unavailable"
                assert "queue is full" in answer["error"]["message"]
        assert server.batcher.stats()["rejected"] == statuses[503]
        idle.close()
        assert _post(server, _body(0))[0] == 200  # and it serves normally afterwards
    finally:
        _stop(server)


def test_a_concurrent_burst_shares_forward_passes_and_each_request_gets_its_own_scores(scorer):
    # a long wait makes the batching deterministic here; the default is a few ms
    server = _start(scorer, BatchingSettings(max_wait_ms=200))
    try:
        before = server.batcher.stats()
        lengths = [1 + i % 5 for i in range(32)]
        answers = _burst(server, [_body(i, n) for i, n in enumerate(lengths)])
        after = server.batcher.stats()
        assert all(status == 200 for status, _, _ in answers), answers
        passes = after["batches"] - before["batches"]
        assert after["requests"] - before["requests"] == 32
        assert passes < 32, f"32 concurrent requests took {passes} forward passes"
        assert after["largest_batch_requests"] > 1
        for i, (n, (_, answer, _)) in enumerate(zip(lengths, answers, strict=True)):
            [result] = answer["results"]
            expected = score_trajectories(scorer, [parse_trajectory(_trajectory(i, n), "t", ServingLimits())])[0]
            assert result["id"] == f"req-{i}" and len(result["scores"]) == n
            # batch-invariant scoring: the same bits as the request scored on its own
            np.testing.assert_array_equal(result["scores"], expected.scores)
            np.testing.assert_array_equal(result["rewards"], expected.rewards)
    finally:
        _stop(server)


def test_a_request_gets_the_same_scores_alone_on_a_cold_server_and_queued_with_others(trained_progrm):
    """Issue 21: with micro-batching, one client's scores must not depend on other clients'
    requests, nor on what the server's cache met before."""
    probe = _body(7, 5)
    alone_server = _start(RewardScorer.from_checkpoint(trained_progrm))  # a cold cache
    try:
        status, alone, _ = _post(alone_server, probe)
    finally:
        _stop(alone_server)
    assert status == 200
    busy_server = _start(RewardScorer.from_checkpoint(trained_progrm), BatchingSettings(max_wait_ms=200))
    try:
        others = [_body(100 + i, 1 + i % 6) for i in range(23)]
        answers = _burst(busy_server, others[:11] + [probe] + others[11:])
        assert busy_server.batcher.stats()["largest_batch_requests"] > 1
    finally:
        _stop(busy_server)
    assert all(status == 200 for status, _, _ in answers)
    queued = answers[11][1]["results"][0]
    assert queued["id"] == "req-7"
    assert queued["scores"] == alone["results"][0]["scores"]
    assert queued["rewards"] == alone["results"][0]["rewards"]


def test_a_body_that_never_arrives_is_answered_408_and_blocks_nobody(scorer):
    server = _start(scorer, BatchingSettings(body_timeout_s=1.5))
    try:
        idle = _half_sent(server, _body(1), sent=10)
        started = time.perf_counter()
        assert _post(server, _body(2))[0] == 200  # served while the other body is still missing
        status, answer = _read_response(idle, timeout=30)
        assert status == 408 and "did not arrive within 1.5 s" in answer["error"]["message"]
        assert time.perf_counter() - started >= 1.0
        assert idle.recv(1) == b""  # and that connection is closed
        idle.close()
    finally:
        _stop(server)


def test_a_request_that_breaks_the_model_gets_its_500_and_the_others_their_scores(scorer):
    class FragileScorer:  # the real model, raising on one request's states
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def score_states(self, states, batch_size=256):
            if any("user666" in s.instruction for s in states):
                raise RuntimeError("boom")
            return self._inner.score_states(states, batch_size)

    server = _start(FragileScorer(scorer), BatchingSettings(max_wait_ms=200))
    try:
        answers = _burst(server, [_body(i) for i in (1, 2, 666, 3)])
        statuses = [status for status, _, _ in answers]
        assert statuses == [200, 200, 500, 200]
        assert answers[2][1]["error"]["message"] == "scoring failed: boom"
        assert server.batcher.stats()["failed"] == 1
    finally:
        _stop(server)


def test_shutdown_stops_listening(scorer):
    server = _start(scorer)
    address = server.server_address
    assert _post(server, _body(0))[0] == 200
    _stop(server)
    assert not server.thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5)
