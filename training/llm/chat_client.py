"""A client for any OpenAI-compatible chat endpoint (vLLM, ``transformers serve``, a hosted model).

Only what the project uses: ``POST {base_url}/chat/completions`` with messages, a token budget and
a temperature, returning the first choice's text. The API key, when the endpoint needs one, comes
from an environment variable named in the configuration (never from code, logs or the warehouse).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass


class ChatEndpointError(RuntimeError):
    """The endpoint is down, slow, refuses the request, or answers something that is not a chat
    completion. The message names the endpoint and the cause (never the key)."""


@dataclass(frozen=True)
class ChatEndpoint:
    """Where the model is: ``base_url`` ends before ``/chat/completions`` (e.g. ``http://host:8000/v1``)."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0


class ChatClient:
    """Calls one endpoint; counts calls and the seconds they took."""

    def __init__(self, endpoint: ChatEndpoint) -> None:
        self.endpoint = endpoint
        self.calls = 0
        self.seconds = 0.0

    def complete(
        self,
        messages: Sequence[dict[str, str]],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
    ) -> str:
        """The text of the first choice. Raises :class:`ChatEndpointError` on any failure."""
        payload: dict = {
            "model": self.endpoint.model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if stop:
            payload["stop"] = list(stop)
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.endpoint.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = self.endpoint.base_url.rstrip("/") + "/chat/completions"
        request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=self.endpoint.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise ChatEndpointError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ChatEndpointError(f"{url}: not reachable or too slow ({exc})") from None
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - started
        try:
            answer = json.loads(body)
            text = answer["choices"][0]["message"]["content"]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise ChatEndpointError(f"{url}: the answer is not a chat completion: {body[:200]!r}") from None
        if not isinstance(text, str):
            raise ChatEndpointError(f"{url}: the completion has no text")
        return text
