"""stepwise annotate: human labels in Label Studio, and the rationales an LLM writes for them (no Dagster needed)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def cmd_annotate_push(args: argparse.Namespace) -> int:
    """Select the steps whose labels matter and push them to Label Studio (no Dagster needed)."""
    from dataclasses import replace

    from annotation.labelstudio.client import LabelStudioError
    from annotation.labelstudio.human_labels import (
        AnnotatePushOptions,
        PushOptions,
        SelectionOptions,
        parse_source_shares,
        push_from_cli,
    )
    from annotation.labelstudio.server import LabelStudioServerError
    from warehouse.catalog import Warehouse

    try:
        selection = SelectionOptions(budget=args.budget, source_shares=parse_source_shares(args.share))
        push = PushOptions()
        if args.interfaces:
            push = replace(push, interfaces=tuple(i.strip() for i in args.interfaces.split(",") if i.strip()))
        push_from_cli(Warehouse(), options=AnnotatePushOptions(selection, push, select=not args.no_select), log=print)
    except (ValueError, LabelStudioError, LabelStudioServerError) as exc:
        print(f"stepwise annotate push: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_annotate_rationales(args: argparse.Namespace) -> int:
    """GUI-Shepherd §3: an LLM writes the rationale of each human positive / negative step label
    that has none yet (``label_rationales``); with no ``--base-url``, SmolLM2 is served locally."""
    from training.base.pretrained import PretrainedModelError
    from training.llm.chat_client import ChatClient
    from training.llm.endpoint import EndpointStartError, chat_endpoint_or_local
    from training.llm.rationales import RationaleEndpointError, RationaleOptions, generate_label_rationales
    from warehouse.catalog import Warehouse

    warehouse = Warehouse()
    options = RationaleOptions(max_tokens=args.max_tokens, max_labels=args.max_labels)
    try:
        with chat_endpoint_or_local(
            args.base_url,
            args.model,
            api_key_env=args.api_key_env,
            timeout_s=args.timeout,
            home=warehouse.home,
            log_path=warehouse.home / "logs" / "label_rationales-cli.log",
        ) as endpoint:
            summary = generate_label_rationales(warehouse, ChatClient(endpoint), options, log=print)
    except (RationaleEndpointError, EndpointStartError, PretrainedModelError) as exc:
        print(f"stepwise annotate rationales: {exc}", file=sys.stderr)
        return 2
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


def add_commands(sub: Any) -> None:
    """stepwise annotate push | rationales."""
    p = sub.add_parser("annotate", help="human labels in Label Studio")
    annotate = p.add_subparsers(dest="annotate_command", required=True)
    p = annotate.add_parser("push", help="select the steps whose labels matter and push them to Label Studio")
    p.add_argument("--budget", type=int, default=500, help="steps to put in front of people this round")
    p.add_argument(
        "--share",
        action="append",
        default=[],
        metavar="SOURCE=WEIGHT",
        help="the budget's share of an episode source (human_demo, rollout, synthetic, synthetic:<kind>, *); "
        "repeatable; =0 leaves a source out",
    )
    p.add_argument("--interfaces", default="", help="comma-separated interfaces to push (default: all)")
    p.add_argument("--no-select", action="store_true", help="push the current selection without selecting again")
    p.set_defaults(func=cmd_annotate_push)
    p = annotate.add_parser(
        "rationales", help="an LLM writes the rationale of each positive / negative step label (GUI-Shepherd §3)"
    )
    p.add_argument("--base-url", default=None, help="OpenAI-compatible base URL (…/v1); default: serve SmolLM2 here")
    p.add_argument("--model", default=None, help="the model name the endpoint expects (or a folder to serve)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one answer may take")
    p.add_argument("--max-labels", type=int, default=None, help="at most this many labels this run")
    p.add_argument("--max-tokens", type=int, default=160, help="answer budget in tokens")
    p.set_defaults(func=cmd_annotate_rationales)
