"""When the pool calls a Ray cluster's head gone (envs.ray_pool.head_lost): only after every one of
several connects went unanswered, so one slow answer from a loaded head does not fail a batch."""

from __future__ import annotations

import socket

from envs.ray_pool import HEAD_LOST_ATTEMPTS, head_lost


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket is closed


def test_a_head_that_answers_is_not_lost_and_is_asked_once():
    pauses: list[float] = []
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        assert head_lost(f"127.0.0.1:{head.getsockname()[1]}", sleep=pauses.append) is None
    assert pauses == []


def test_a_head_that_never_answers_is_lost_after_every_attempt():
    pauses: list[float] = []
    why = head_lost(f"127.0.0.1:{_free_port()}", pause_s=0.5, sleep=pauses.append)
    assert why and "refused" in why.lower() and "\n" not in why
    assert pauses == [0.5] * (HEAD_LOST_ATTEMPTS - 1)


def test_a_head_that_answers_on_a_later_attempt_is_not_lost():
    port = _free_port()
    head = socket.socket()
    try:
        # the first connect is refused; the head is listening by the second
        def start_listening(_: float) -> None:
            if head.fileno() != -1 and not head.getsockname()[1]:
                head.bind(("127.0.0.1", port))
                head.listen()

        assert head_lost(f"127.0.0.1:{port}", sleep=start_listening) is None
        assert head.getsockname()[1] == port  # it was asked again after the pause, not given up on
    finally:
        head.close()
