"""Benchmark of the reward-model HTTP service under concurrent clients: the FastAPI/uvicorn server
with micro-batching (``training.reward_models.serving_app``) next to the stdlib server it replaced
(``benchmarks.serving_legacy``, the baseline of issue 14).

    python benchmarks/bench_serving.py [--checkpoint <model folder>] [--clients 1 16 64 256] [--seconds 10]
    python benchmarks/bench_serving.py --smoke   # both servers, a burst of 16, 1 and 4 clients for 1.5 s

First issue 14's scene on each server: a burst of ``--burst`` requests (200, 256) released at
once, each on its own connection, while one more connection holds a half-sent body; counted:
answers, 503s and connection errors (resets, or no answer within ``--timeout``).

Then, for each number of concurrent clients (both servers back to back, alternating which goes
first), every client sends ``POST /v1/score`` requests back to back for ``--seconds`` (after a
short warm-up), one small trajectory per request (a 4-step login with text screens, as
``HTTPScorer`` sends them), each on a new connection as ``HTTPScorer`` (urllib) opens one.
Reported: requests answered 200 per second, scored steps per second, p50/p99 latency of the 200s
at the client and as the server measured it (``elapsed_ms``: queue + scoring; for the baseline,
waiting for the model's lock + scoring), and the requests answered 503 (queue full) or lost to a
connection error. For the new server, ``GET /v1/stats`` gives the mean number of requests per
forward pass and the share of the time the model was busy.

Every request carries a new username (in the instruction, on the typed screen and in an action),
so a request brings 3 segments the encoder has not seen, as new rollouts do; ``--cached`` repeats
one trajectory (every segment cached: the server and the fusion alone).

The server runs in its own process (torch on ``--threads`` threads); the clients are asyncio
coroutines in this one. The machine is shared: the load average is printed with the figures.
Without ``--checkpoint``: the latest ``progrm_env`` model in ``--home``'s warehouse if there is
one, else a model of the default architecture (frozen int8 MiniLM segments + fusion/head) with
untrained fusion/head weights: the same computation per request as a trained one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

STEPS_PER_REQUEST = 4
NAMES = ["vanda", "kiri", "omar", "tess", "ugo", "wen", "zola", "ines", "renda", "lyda"]


def _payload(i: int, cached: bool) -> bytes:
    user = "vanda" if cached else f"{NAMES[i % len(NAMES)]}{i}"
    form = 'label "Username"\ntextbox#username [clickable, editable]\nlabel "Password"\npassword#password'
    typed = form.replace("textbox#username", f'textbox#username value="{user}"')
    trajectory = {
        "id": f"bench-{i}",
        "instruction": f'Enter the username "{user}" and the password "abc" into the text fields and press login.',
        "steps": [
            {"screen": form + '\nbutton#subbtn "Login"', "action": "CLICK(textbox#username)"},
            {"screen": form + '\nbutton#subbtn "Login"', "action": f'INPUT(textbox#username, "{user}")'},
            {"screen": typed + '\nbutton#subbtn "Login"', "action": 'INPUT(password#password, "abc")'},
            {"screen": typed + ' value="abc"\nbutton#subbtn "Login"', "action": 'CLICK(button#subbtn "Login")'},
        ],
    }
    return json.dumps({"k": 1, "trajectories": [trajectory]}).encode()


# -- the server process -------------------------------------------------------------------------


def _serve(which: str, checkpoint: str, threads: int, max_wait_ms: float | None, conn) -> None:
    import torch

    from training.reward_models.models import RewardScorer

    torch.set_num_threads(threads)
    scorer = RewardScorer.from_checkpoint(checkpoint)
    if which == "legacy":
        from benchmarks.serving_legacy import legacy_serve_in_background

        server, _ = legacy_serve_in_background(scorer)
    else:
        from training.reward_models.serving_app import BatchingSettings, serve_in_background

        batching = BatchingSettings() if max_wait_ms is None else BatchingSettings(max_wait_ms=max_wait_ms)
        server, _ = serve_in_background(scorer, batching=batching)
    conn.send(server.server_address[1])
    conn.recv()  # until the benchmark says stop
    server.shutdown()


# -- the clients --------------------------------------------------------------------------------


async def _post(port: int, body: bytes, timeout_s: float) -> tuple[int, float | None]:
    """One request on a new connection: (HTTP status, the server's ``elapsed_ms``); connection
    errors raise."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s)
    try:
        writer.write(
            b"POST /v1/score HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        status = int(head.split(b" ", 2)[1])
        lines = head.split(b"\r\n")
        length = next(
            (int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length")), None
        )
        data = await asyncio.wait_for(reader.readexactly(length) if length is not None else reader.read(), timeout_s)
        return status, (json.loads(data).get("elapsed_ms") if status == 200 else None)
    finally:
        writer.close()


async def _level(port: int, clients: int, seconds: float, cached: bool, timeout_s: float, base: int) -> dict:
    latencies: list[float] = []
    server_ms: list[float] = []
    outcomes: Counter[str] = Counter()
    counter = iter(range(base, base + 10**9))  # the same requests for both servers (same new segments)
    stop_at = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < stop_at:
            body = _payload(next(counter), cached)
            started = time.perf_counter()
            try:
                status, elapsed_ms = await _post(port, body, timeout_s)
            except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError) as exc:
                outcomes[f"error:{type(exc).__name__}"] += 1
                continue
            outcomes[str(status)] += 1
            if status == 200:
                latencies.append(time.perf_counter() - started)
                if elapsed_ms is not None:
                    server_ms.append(elapsed_ms)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    ms = np.asarray(latencies) * 1000
    ok = outcomes.get("200", 0)

    def pct(values, q: float) -> float | None:
        return round(float(np.percentile(values, q)), 1) if len(values) else None

    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "ok": ok,
        "busy_503": outcomes.get("503", 0),
        "errors": sum(v for k, v in outcomes.items() if k.startswith("error:")),
        "error_kinds": {k[6:]: v for k, v in outcomes.items() if k.startswith("error:")},
        "other": {k: v for k, v in outcomes.items() if k not in ("200", "503") and not k.startswith("error:")},
        "requests_per_s": round(ok / elapsed, 1),
        "steps_per_s": round(ok * STEPS_PER_REQUEST / elapsed, 1),
        "p50_ms": pct(ms, 50),
        "p99_ms": pct(ms, 99),
        "server_p50_ms": pct(server_ms, 50),  # elapsed_ms: queue + scoring (new), lock + scoring (baseline)
        "server_p99_ms": pct(server_ms, 99),
    }


async def _burst(port: int, n: int, timeout_s: float, base: int) -> dict:
    """Issue 14's scene: ``n`` requests released at once, each on its own connection, while one
    more connection holds a half-sent body. Counts the answers and the connection errors."""
    body = _payload(base - 1, cached=False)
    _, idle = await asyncio.open_connection("127.0.0.1", port)
    idle.write(
        b"POST /v1/score HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body[: len(body) // 2])
    )
    await idle.drain()
    outcomes: Counter[str] = Counter()

    async def one(i: int) -> None:
        try:
            status, _ = await _post(port, _payload(base + i, cached=False), timeout_s)
            outcomes[str(status)] += 1
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError) as exc:
            outcomes[type(exc).__name__] += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    seconds = time.perf_counter() - started
    idle.close()
    return {"requests": n, "seconds": round(seconds, 2), "outcomes": dict(outcomes)}


def _stats(port: int) -> dict | None:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/stats", timeout=10) as response:
            return json.loads(response.read())
    except Exception:  # noqa: BLE001 - the baseline has no /v1/stats
        return None


def _start(which: str, args, checkpoint: str):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_serve, args=(which, checkpoint, args.threads, args.max_wait_ms, child), daemon=True)
    process.start()
    if not parent.poll(300):
        raise RuntimeError(f"the {which} server did not start")
    port = parent.recv()
    asyncio.run(_level(port, 4, args.warmup, args.cached, args.timeout, base=10**8))  # model, allocator warm
    return process, parent, port


def _measure(which: str, port: int, clients: int, args, base: int) -> dict:
    before = _stats(port)
    row = asyncio.run(_level(port, clients, args.seconds, args.cached, args.timeout, base))
    after = _stats(port)
    if before and after and after["batches"] > before["batches"]:
        row["requests_per_batch"] = round(
            (after["requests"] - before["requests"]) / (after["batches"] - before["batches"]), 1
        )
        row["model_busy"] = round((after["busy_s"] - before["busy_s"]) / row["seconds"], 2)
    row["server"] = which
    row["load_avg"] = round(os.getloadavg()[0], 2)
    print(json.dumps(row), flush=True)
    return row


def _bench(args, checkpoint: str) -> list[dict]:
    """Both servers up at once (an idle one costs nothing); for each number of clients, one run on
    each, back to back, in alternating order: both see about the same load from the rest of the
    machine."""
    servers = {which: _start(which, args, checkpoint) for which in args.servers}
    rows = []
    try:
        for i, n in enumerate(args.burst):
            for which in args.servers:
                burst = asyncio.run(_burst(servers[which][2], n, args.timeout, base=(90 + i) * 10**6))
                burst["server"] = which
                burst["load_avg"] = round(os.getloadavg()[0], 2)
                print(json.dumps(burst), flush=True)
                rows.append(burst)
                time.sleep(args.settle_s)
        for level, clients in enumerate(args.clients):
            order = list(args.servers) if level % 2 == 0 else list(reversed(args.servers))
            for which in order:
                rows.append(_measure(which, servers[which][2], clients, args, base=level * 10**6))
                time.sleep(args.settle_s)  # let the baseline's backlog drain before the next run
    finally:
        for process, parent, _ in servers.values():
            parent.send("stop")
            process.join(30)
            if process.is_alive():
                process.kill()
    order = {which: i for i, which in enumerate(args.servers)}
    return sorted(rows, key=lambda r: (order[r["server"]], r.get("clients", 0), r.get("requests", 0)))


def _checkpoint(args) -> tuple[str, str]:
    if args.checkpoint:
        return args.checkpoint, "given"
    home = args.home or os.environ.get("STEPWISE_HOME")
    if home:
        try:
            from training.base.registry import latest_models
            from warehouse.catalog import Warehouse

            found = latest_models(Warehouse(home), ["progrm_env"])
            if found:
                return found[0].checkpoint_path, f"latest progrm_env of {home}"
        except Exception as exc:  # noqa: BLE001 - no warehouse or no models table: the untrained model
            print(f"(no trained model from {home}: {exc})")
    import torch

    from training.reward_models.models import RewardModelConfig, build_reward_model, save_reward_model

    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix="bench-serving-")) / "model"
    save_reward_model(build_reward_model(RewardModelConfig(kind="progrm_env")), folder, metadata={"model_id": "bench"})
    return str(folder), "default architecture, untrained fusion/head weights"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--home", default=None, help="STEPWISE_HOME to take the latest progrm_env model from")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--seconds", type=float, default=10.0, help="per server and number of clients")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    parser.add_argument("--timeout", type=float, default=60.0, help="client timeout per request (s)")
    parser.add_argument("--cached", action="store_true", help="repeat one trajectory (every segment cached)")
    parser.add_argument("--max-wait-ms", type=float, default=None, help="the new server's batching wait")
    parser.add_argument("--burst", type=int, nargs="*", default=[200, 256], help="burst sizes (issue 14's scene)")
    parser.add_argument("--servers", nargs="+", default=["new", "legacy"], choices=["new", "legacy"])
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the test suite's size: both servers, a burst of 16, 1 and 4 clients for 1.5 s each, the untrained "
        "model of a temporary home unless --checkpoint",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _smoke import smoke_root

        args.home = args.home or str(smoke_root("serving") / "home")
        args.clients, args.burst = [1, 4], [16]
        args.seconds, args.warmup = min(args.seconds, 1.5), min(args.warmup, 0.5)
    # a pause between runs so a backlog drains; the smoke's runs are too small to leave one
    args.settle_s = 0.2 if args.smoke else 2.0

    checkpoint, origin = _checkpoint(args)
    print(f"model: {checkpoint} ({origin}); {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    rows = _bench(args, checkpoint)
    names = {"new": "FastAPI/uvicorn + micro-batching", "legacy": "baseline: stdlib ThreadingHTTPServer"}
    bursts, rows = [r for r in rows if "outcomes" in r], [r for r in rows if "outcomes" not in r]
    if bursts:
        print("\nA burst of simultaneous requests plus one connection holding a half-sent body (issue 14):\n")
        print("| server | requests | answered 200 | 503 | connection errors | seconds | load avg |")
        print("|---|---:|---:|---:|---|---:|---:|")
        for r in bursts:
            failed = {k: v for k, v in r["outcomes"].items() if not k.isdigit()}
            errors = ", ".join(f"{k} {v}" for k, v in failed.items()) or "0"
            print(
                f"| {names[r['server']]} | {r['requests']} | {r['outcomes'].get('200', 0)} | "
                f"{r['outcomes'].get('503', 0)} | {errors} | {r['seconds']} | {r['load_avg']} |"
            )
    print(
        f"\nPOST /v1/score, one {STEPS_PER_REQUEST}-step trajectory per request, a new connection each, "
        f"{args.seconds:g} s per row{' (every segment cached)' if args.cached else ''}:\n"
    )
    columns = ["server", "clients", "req/s", "steps/s", "p50 ms", "p99 ms", "server p50 / p99 ms", "200", "503"]
    columns += ["conn. errors", "req/batch", "model busy", "load avg"]
    print("| " + " | ".join(columns) + " |")
    print("|---" + "|---:" * (len(columns) - 1) + "|")
    for r in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in r["error_kinds"].items())
        errors = f"{r['errors']} ({kinds})" if r["errors"] else "0"
        print(
            f"| {names[r['server']]} | {r['clients']} | {r['requests_per_s']} | {r['steps_per_s']} | {r['p50_ms']} | "
            f"{r['p99_ms']} | {r['server_p50_ms']} / {r['server_p99_ms']} | {r['ok']} | {r['busy_503']} | {errors} | "
            f"{r.get('requests_per_batch', '')} | "
            f"{r.get('model_busy', '')} | {r['load_avg']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
