"""What ``make annotate`` (``scripts/annotate.sh``) prints once everything is up: where annotators log
in and with what, the one command that queues work, and how to look at the labels.

Every command in it names the ``STEPWISE_HOME`` the script runs with, so it works as printed in
another terminal (a custom home included). The password itself is never printed: the banner says
which file holds it and the command that prints it.

Run ``python -m annotation.labelstudio.banner --home H --url U --dagster-port P [--bin .venv/bin]``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from annotation.labelstudio.interfaces import INTERFACES
from annotation.labelstudio.secrets import CREDENTIALS_FILE, credentials_from_environment, read_local_secrets
from annotation.labelstudio.selection import DEFAULT_SOURCE_SHARES
from annotation.labelstudio.server import ADMIN_EMAIL, labelstudio_dir

PUSH_COMMAND = "annotate push"
LABELS_QUERY = "SELECT interface, label, count(*) FROM human_labels GROUP BY ALL"
RULE = "=" * 100


def shares_text(shares: Mapping[str, float] = DEFAULT_SOURCE_SHARES) -> str:
    """The budget's shares per episode source, as one line: 'human_demo 0.6, rollout 0.3, ..., none of ...'."""
    given = ", ".join(f"{key} {value:g}" for key, value in shares.items() if value > 0)
    none = ", ".join(key for key, value in shares.items() if value <= 0)
    return given + (f", none of {none}" if none else "")


def annotate_banner(
    *,
    home: Path,
    ls_url: str,
    dagster_port: int,
    bin_dir: str = ".venv/bin",
    own_server: bool | None = None,
    namespace: str = "Stepwise",
) -> str:
    """The banner of ``make annotate`` for the home ``home`` and the Label Studio at ``ls_url``.

    ``own_server`` None: the project's own server unless ``LABEL_STUDIO_URL`` and
    ``LABEL_STUDIO_API_KEY`` are set.
    """
    home = Path(home).resolve()
    if own_server is None:
        own_server = credentials_from_environment() is None
    quoted_home = shlex.quote(str(home))
    titles = ",\n                         ".join(f'"{i.project_title(namespace)}"' for i in INTERFACES.values())
    env = f"STEPWISE_HOME={quoted_home}"
    stepwise = shlex.quote(f"{bin_dir}/stepwise")
    python = shlex.quote(f"{bin_dir}/python")
    lines = [
        "",
        "== Stepwise annotation " + RULE[23:],
        f"  Annotators log in at   {ls_url}/user/login/",
    ]
    if own_server:
        data_dir = labelstudio_dir(home)
        local = read_local_secrets(data_dir)
        lines += [
            f"  Username               {local.username if local else ADMIN_EMAIL}",
            f"  Password               {python} -m annotation.labelstudio password --home {quoted_home}   prints it",
            f'                         (kept in {data_dir / CREDENTIALS_FILE}, field "password", readable by you only)',
        ]
    else:
        lines.append("  Account                your own Label Studio account (LABEL_STUDIO_URL, LABEL_STUDIO_API_KEY)")
    lines += [
        f"  Queue work             {env} {stepwise} {PUSH_COMMAND}",
        "                         picks the steps whose labels matter (label sources disagree), the budget shared by",
        f"                         episode source: {shares_text()}",
        f"                         (options: {stepwise} {PUSH_COMMAND} --help)",
        f"  Projects               {titles} (created by the first push)",
        "  Labels come back       sensor label_studio_sync (every 30 s) -> table human_labels:",
        f'                         {env} {stepwise} sql "{LABELS_QUERY}"',
        f"  Dagster UI             http://127.0.0.1:{dagster_port}   (logs: {home / 'logs'}/)",
        "  Ctrl-C stops what this started.",
        RULE,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m annotation.labelstudio.banner", description=__doc__)
    parser.add_argument("--home", required=True, help="STEPWISE_HOME")
    parser.add_argument("--url", required=True, help="the Label Studio URL annotators use")
    parser.add_argument("--dagster-port", type=int, default=3000)
    parser.add_argument("--bin", default=".venv/bin", help="where the stepwise and python commands are")
    args = parser.parse_args(argv)
    print(annotate_banner(home=Path(args.home), ls_url=args.url, dagster_port=args.dagster_port, bin_dir=args.bin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
