"""The stepwise command: the pipeline's main job, imports and SQL for users outside Dagster.

One module per command group, each adding its subcommands: ``demo`` (the whole graph on embedded
defaults), ``data`` (import, labels, SQL, lineage, specs, figures), ``annotate`` (Label Studio),
``training`` (reward models, RL, the flywheel, the RL export) and ``common`` (what they share, and
``ui``). Heavy imports (Dagster, torch) happen inside the commands, so ``stepwise label`` and
``stepwise sql`` start without them.
"""

from __future__ import annotations

import argparse

from pipelines.cli import annotate, common, data, demo, training


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepwise", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (demo, data, annotate, training, common):
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
