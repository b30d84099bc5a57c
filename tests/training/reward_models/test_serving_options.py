"""The service's surface beyond scoring: the OpenAPI page, /v1/stats, the device/dtype options,
the command line (uvicorn, the start line), and the stdlib baseline kept for the benchmark."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.serving_legacy import legacy_serve_in_background
from training.reward_models.models import RewardScorer
from training.reward_models.serve import main
from training.reward_models.serving import Precision, ServingLimits, load_serving_scorer, resolve_precision
from training.reward_models.serving_app import ScoreRequestBody, serve_in_background

ROOT = Path(__file__).resolve().parents[3]
TRAJECTORY = {
    "id": "r1",
    "instruction": 'Click on the "ok" button.',
    "steps": [
        {
            "screen": [{"role": "button", "text": "ok", "clickable": True}],
            "action": 'CLICK(button "ok")',
            "target": 0,
        },
        {"screen": "text Done", "action": "CLICK(text)"},
    ],
    "final_screen": "text Bye",
}


@pytest.fixture(scope="module")
def scorer(trained_progrm):
    return RewardScorer.from_checkpoint(trained_progrm)


def _get(address, path) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(*address, timeout=30)
    conn.request("GET", path)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, response.getheader("Content-Type") or "", data


def _score(address, payload) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(*address, timeout=60)
    conn.request("POST", "/v1/score", json.dumps(payload), {"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    return response.status, answer


def test_openapi_page_model_and_stats(scorer):
    server, _ = serve_in_background(scorer, "127.0.0.1", 0, ServingLimits(max_states=50))
    try:
        status, content_type, page = _get(server.server_address, "/docs")
        assert status == 200 and content_type.startswith("text/html") and b"swagger" in page.lower()
        status, _, raw = _get(server.server_address, "/openapi.json")
        spec = json.loads(raw)
        assert status == 200 and set(spec["paths"]) >= {"/health", "/v1/model", "/v1/score", "/v1/stats"}
        score = spec["paths"]["/v1/score"]["post"]
        ref = score["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/ScoreRequestBody"
        schemas = spec["components"]["schemas"]
        assert {"ScoreRequestBody", "TrajectoryIn", "StepIn", "ElementIn", "ScoreResponse"} <= set(schemas)
        assert {"200", "413", "422", "503"} <= set(score["responses"])
        # the documented model describes what the service accepts
        ScoreRequestBody.model_validate({"k": 2, "trajectories": [TRAJECTORY]})

        status, _, raw = _get(server.server_address, "/v1/model")
        info = json.loads(raw)
        assert info["precision"] == {"device": "cpu", "dtype": "float32"}
        assert info["batching"]["max_queue_requests"] >= 1 and info["limits"]["max_states"] == 50
        status, answer = _score(server.server_address, {"trajectories": [TRAJECTORY]})
        assert status == 200 and len(answer["results"][0]["scores"]) == 2
        stats = json.loads(_get(server.server_address, "/v1/stats")[2])
        assert stats["batches"] >= 1 and stats["requests"] >= 1 and stats["states"] >= 2
        assert stats["queued_requests"] == 0 and stats["rejected"] == 0
    finally:
        server.shutdown()


def test_the_stdlib_baseline_answers_as_the_new_server_does(scorer):
    new, _ = serve_in_background(scorer)
    old, _ = legacy_serve_in_background(scorer)
    try:
        a = _score(new.server_address, {"trajectories": [TRAJECTORY], "k": 1})
        b = _score(old.server_address, {"trajectories": [TRAJECTORY], "k": 1})
        assert a[0] == b[0] == 200
        assert a[1]["results"][0]["scores"] == pytest.approx(b[1]["results"][0]["scores"], abs=1e-6)
        assert a[1]["results"][0]["id"] == b[1]["results"][0]["id"] == "r1"
        bad = {"trajectories": [dict(TRAJECTORY, instruction="")]}
        assert _score(new.server_address, bad) == _score(old.server_address, bad)
    finally:
        new.shutdown()
        old.shutdown()
        old.server_close()


@pytest.mark.parametrize(
    ("mode", "device", "dtype", "expected"),
    [
        ("frozen_segments", "cpu", "float32", Precision("cpu", "float32")),
        ("full", "cpu", "float32", Precision("cpu", "float32")),
        ("full", "cpu", "bfloat16", Precision("cpu", "bfloat16", weights_dtype="bfloat16")),
        ("full", "cuda", "bfloat16", Precision("cuda", "bfloat16", weights_dtype="bfloat16")),
        ("full", "cuda:1", "float16", Precision("cuda:1", "float16", weights_dtype="float16")),
        ("frozen_segments", "cuda", "float32", Precision("cuda", "float32")),
        ("frozen_segments", "cuda:0", "bfloat16", Precision("cuda:0", "bfloat16", autocast_dtype="bfloat16")),
        ("frozen_segments", "cuda", "float16", Precision("cuda", "float16", autocast_dtype="float16")),
        ("frozen_segments", "cpu", "bfloat16", "frozen_segments model on CPU scores in float32"),
        ("full", "cpu", "float16", "float16 needs a CUDA device"),
        ("full", "gpu", "float32", "device must be cpu, cuda or cuda:N"),
        ("full", "cuda:x", "float32", "device must be cpu, cuda or cuda:N"),
        ("full", "cpu", "fp8", "dtype must be one of"),
    ],
)
def test_device_and_dtype_resolve_to_what_can_run(mode, device, dtype, expected):
    if isinstance(expected, Precision):
        assert resolve_precision(mode, device, dtype) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            resolve_precision(mode, device, dtype)


def test_cpu_precision_runs_without_autocast_and_cuda_is_refused_without_a_gpu(trained_progrm, capsys):
    import warnings
    from contextlib import nullcontext

    import torch

    scorer, precision = load_serving_scorer(trained_progrm, device="cpu", dtype="float32")
    assert precision == Precision() and scorer.device == torch.device("cpu")
    assert isinstance(precision.scoring_context(), nullcontext)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available, disabling autocast" on this machine
        autocast = Precision("cuda", "bfloat16", autocast_dtype="bfloat16").scoring_context()
    assert isinstance(autocast, torch.autocast) and autocast.fast_dtype == torch.bfloat16
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            load_serving_scorer(trained_progrm, device="cuda", dtype="bfloat16")
        with pytest.raises(SystemExit) as info:
            main(["--checkpoint", str(trained_progrm), "--device", "cuda", "--dtype", "bfloat16"])
        assert info.value.code == 2 and "no CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(trained_progrm), "--dtype", "bfloat16"])  # frozen mode on CPU: float32 only
    assert "scores in float32" in capsys.readouterr().err


def test_the_command_line_serves_with_uvicorn_and_prints_its_start_line(trained_progrm, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE", PYTHONPATH=str(ROOT))
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "training.reward_models.serve", "--checkpoint", str(trained_progrm), "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = json.loads(process.stdout.readline())
        assert set(line) == {"serving", "url", "checkpoint"} and line["serving"] == "progrm_env"
        host, port = line["url"].removeprefix("http://").split(":")
        assert port != "0"
        status, _, raw = _get((host, int(port)), "/health")
        assert status == 200 and json.loads(raw) == {"status": "ok", "kind": "progrm_env"}
        assert _score((host, int(port)), {"trajectories": [TRAJECTORY]})[0] == 200
        process.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown
        assert process.wait(timeout=60) == 0, (tmp_path / "server.log").read_text()[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
