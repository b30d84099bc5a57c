"""The local OpenAI-compatible endpoint (``transformers serve`` as a subprocess) serving the real
SmolLM2-135M-Instruct: a completion through :class:`ChatClient`, one line for what can be known
before the start, :class:`ChatEndpointError` from an endpoint that is gone."""

from __future__ import annotations

import json
import os
import time

import pytest

from training.llm.chat_client import ChatClient, ChatEndpoint, ChatEndpointError
from training.llm.endpoint import EndpointStartError, free_port, serve_local_model


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.e2e
def test_smollm2_served_answers_a_chat_completion_and_stops_on_exit(smollm2_model_folder, tmp_path):
    log = tmp_path / "serve.log"
    with serve_local_model(smollm2_model_folder, log_path=log) as endpoint:
        assert endpoint.base_url == f"http://127.0.0.1:{endpoint.port}/v1"
        assert endpoint.model == str(smollm2_model_folder)
        client = ChatClient(endpoint.chat_endpoint(timeout_s=120))
        text = client.complete([{"role": "user", "content": "What is the capital of France?"}], max_tokens=12)
        assert isinstance(text, str) and text.strip() and client.calls == 1
        pid = endpoint.pid
    deadline = time.time() + 10
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(pid), "the server outlived its context"
    assert log.is_file() and "POST /v1/chat/completions" in log.read_text()
    with pytest.raises(ChatEndpointError, match="not reachable"):
        gone = ChatClient(ChatEndpoint(endpoint.base_url, endpoint.model, timeout_s=5))
        gone.complete([{"role": "user", "content": "hi"}])


def test_a_missing_folder_is_one_line_before_any_start(tmp_path):
    missing = tmp_path / "no-model"
    log = tmp_path / "serve.log"
    with pytest.raises(EndpointStartError) as refused, serve_local_model(missing, log_path=log):
        pytest.fail("entered the context")
    message = str(refused.value)
    assert message == f"{missing}: no such model folder" and not log.exists()


def test_a_folder_without_config_is_one_line(tmp_path):
    with pytest.raises(EndpointStartError, match="no config.json") as refused, serve_local_model(tmp_path):
        pytest.fail("entered the context")
    assert "\n" not in str(refused.value)


@pytest.mark.e2e
def test_a_server_that_dies_at_start_names_the_folder_and_the_log(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    log = tmp_path / "serve.log"
    with pytest.raises(EndpointStartError) as refused, serve_local_model(folder, log_path=log, startup_timeout_s=90):
        pytest.fail("entered the context")
    message = str(refused.value)
    assert message.startswith(str(folder)) and str(log) in message and "\n" not in message


def test_a_dead_endpoint_is_a_chat_endpoint_error():
    port = free_port()  # closed again: nothing listens there
    client = ChatClient(ChatEndpoint(f"http://127.0.0.1:{port}/v1", "smollm2", timeout_s=2))
    with pytest.raises(ChatEndpointError) as failed:
        client.complete([{"role": "user", "content": "hello"}])
    assert f"127.0.0.1:{port}" in str(failed.value) and "not reachable" in str(failed.value) and client.calls == 1


def test_a_configured_endpoint_is_used_as_it_is_and_needs_a_model(tmp_path):
    from training.llm.endpoint import chat_endpoint_or_local

    with chat_endpoint_or_local("https://api.example.com/v1", "gpt-x", api_key_env="MY_KEY", timeout_s=9) as e:
        assert e == ChatEndpoint("https://api.example.com/v1", "gpt-x", api_key_env="MY_KEY", timeout_s=9)
    with pytest.raises(EndpointStartError, match="needs a model name"), chat_endpoint_or_local("http://h/v1"):
        pytest.fail("entered the context")
    with (
        pytest.raises(EndpointStartError, match="no such model folder"),
        chat_endpoint_or_local(None, str(tmp_path / "absent")),
    ):
        pytest.fail("entered the context")
