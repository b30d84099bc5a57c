"""Fixtures of the LLM tests: SmolLM2-135M-Instruct served by ``transformers serve`` through
:func:`training.llm.endpoint.serve_local_model` (a temporary home per session, holding links to the
machine's dequantised copy in ``~/.cache/stepwise/llm``, made by the first test that needs it on this
machine; one server per test module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from training.llm.endpoint import LocalEndpoint, serve_local_model, smollm2_folder


@pytest.fixture(scope="session")
def smollm2_model_folder(tmp_path_factory) -> Path:
    return smollm2_folder(tmp_path_factory.mktemp("smollm2-home"))


@pytest.fixture(scope="module")
def smollm2_endpoint(smollm2_model_folder, tmp_path_factory) -> Iterator[LocalEndpoint]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve_local_model(smollm2_model_folder, log_path=log) as endpoint:
        yield endpoint
