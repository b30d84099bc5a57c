"""``python -m training.reward_models.serve --checkpoint <model folder> --port 8765``: the HTTP
scoring service of one exported reward model, until interrupted (the app: ``serving_app``; what
it validates and computes: ``serving``). It prints one JSON line, ``{"serving", "url",
"checkpoint"}``, once it listens."""

from __future__ import annotations

import argparse
import json
import logging

from training.reward_models.serving import DTYPES, ServingLimits, load_serving_scorer
from training.reward_models.serving_app import BatchingSettings, run_server

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """``python -m training.reward_models.serve``: serve one exported model until interrupted."""
    defaults = BatchingSettings()
    parser = argparse.ArgumentParser(description="Serve a trained reward model over HTTP (JSON).")
    parser.add_argument("--checkpoint", required=True, help="an exported model folder (models.checkpoint_path)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port (the start line says which)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="see training.reward_models.serving.resolve_precision"
    )
    parser.add_argument("--warm-cache", default=None, help="a saved segment-embedding cache folder to start from")
    parser.add_argument(
        "--home", default=None, help="start from the segment cache training saved under this STEPWISE_HOME"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--max-body-bytes", type=int, default=ServingLimits.max_body_bytes)
    parser.add_argument("--max-states", type=int, default=ServingLimits.max_states)
    parser.add_argument(
        "--max-batch-states", type=int, default=defaults.max_batch_states, help="states per forward pass"
    )
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=defaults.max_wait_ms,
        help="how long a batch waits for requests already being received",
    )
    parser.add_argument(
        "--max-queue-requests", type=int, default=defaults.max_queue_requests, help="beyond it: 503 + Retry-After"
    )
    parser.add_argument("--max-queue-states", type=int, default=defaults.max_queue_states)
    parser.add_argument(
        "--body-timeout", type=float, default=defaults.body_timeout_s, help="seconds to receive a body (then 408)"
    )
    parser.add_argument("--backlog", type=int, default=defaults.backlog, help="listen backlog")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        batching = BatchingSettings(
            max_batch_states=args.max_batch_states,
            max_wait_ms=args.max_wait_ms,
            max_queue_requests=args.max_queue_requests,
            max_queue_states=args.max_queue_states,
            body_timeout_s=args.body_timeout,
            backlog=args.backlog,
        )
        scorer, precision = load_serving_scorer(
            args.checkpoint, device=args.device, dtype=args.dtype, warm_cache=args.warm_cache
        )
    except ValueError as exc:
        parser.error(str(exc))
    import torch

    torch.set_num_threads(args.threads)
    if args.home:
        log.info("segment cache: %d entries from %s", scorer.load_home_cache(args.home), args.home)
    limits = ServingLimits(max_body_bytes=args.max_body_bytes, max_states=args.max_states)

    def announce(host: str, port: int) -> None:
        print(
            json.dumps({"serving": scorer.kind, "url": f"http://{host}:{port}", "checkpoint": str(args.checkpoint)}),
            flush=True,
        )

    try:
        run_server(scorer, args.host, args.port, limits, batching, precision, on_listening=announce)
    except KeyboardInterrupt:  # uvicorn shut down gracefully on SIGINT, then re-raised it
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
