"""Benchmark: SmolLM2-135M-Instruct as ADMIRE's milestone writer and GUI-Shepherd's rationale writer.

Both go through the same OpenAI-compatible endpoint: ``transformers serve`` on the dequantised
SmolLM2 (``training.llm.endpoint.serve_local_model``). For each task, its first successful human
demonstration (``../shared/data/miniwob-demos``, files in name order):

* **milestones** (ADMIRE §3.1, Eq. 6, prompt P_init): ``MilestoneStore.update`` with an
  ``LLMMilestones`` writer, exactly as the RL stage's first success of a task does; counted: the
  answer parsed as a JSON list of strings, or the trajectory fallback applied (``fallbacks``);
* **rationales** (GUI-Shepherd §3): for two steps of the same episode, the rationale prompt with a
  verdict; there are no human labels on demonstrations, so the verdicts are proxies: the first
  essential step of the success is ``positive``, a step the cleaning removed (a detour) ``negative``
  (where there is none, the last step, ``positive``); counted: produced, or which failure.

Per call: seconds (wall, through HTTP, greedy). Prints one row per task and the totals.

Run: ``.venv/bin/python benchmarks/bench_smollm2_writers.py [--tasks a,b] [--n-tasks 10]
[--max-tokens 200]``; ``--smoke`` runs one task with short answers (the test suite).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from envs.miniwob.recordings import (  # noqa: E402
    RecordingError,
    demonstration_record,
    parse_recording_json,
    read_recording_bytes,
    recording_to_episode,
)
from envs.protocol import EpisodeRecord, episode_slots  # noqa: E402
from envs.task_catalog import load_catalog  # noqa: E402
from envs.tasks import TaskSpecError  # noqa: E402
from training.llm.chat_client import ChatClient  # noqa: E402
from training.llm.endpoint import serve_local_model, smollm2_folder  # noqa: E402
from training.llm.rationales import RationaleOptions, RationaleRequest, ask_rationale  # noqa: E402
from training.policy.rollouts import Rollout  # noqa: E402
from training.rl.rewards.admire import (  # noqa: E402
    LLMMilestones,
    MilestoneStore,
    essential_steps,
    parse_milestones,
)

DEMOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "miniwob-demos"
DEFAULT_TASKS = (
    "login-user",
    "enter-text",
    "click-option",
    "enter-password",
    "search-engine",
    "click-button-sequence",
    "click-collapsible",
    "use-autocomplete",
    "social-media",
    "email-inbox-forward-nl",
)


def first_success(task: str, demos: Path = DEMOS, limit: int = 300) -> EpisodeRecord | None:
    """The task's first successful demonstration (files in name order, at most ``limit`` read), as
    an episode record with the instruction's slots (ADMIRE's milestones are instruction-relative)."""
    spec = load_catalog("miniwob")[task].spec
    for path in sorted(demos.glob(f"*/{task}/*.json.gz"))[:limit]:
        try:
            demo = recording_to_episode(parse_recording_json(read_recording_bytes(path)[0]), task)
        except (RecordingError, OSError, ValueError):
            continue
        if not demo.success or not demo.steps:
            continue
        try:
            slots = episode_slots(spec, demo.instruction, demo.fields)
        except TaskSpecError:
            continue
        return demonstration_record(demo, f"demo:{task}:{path.stem}", slots=slots)
    return None


def rationale_steps(record: EpisodeRecord) -> list[tuple[int, str]]:
    """(step, proxy verdict): the first essential step positive; a removed step negative, or the last positive."""
    kept = essential_steps(record)
    removed = [i for i in range(record.n_steps) if i not in set(kept)]
    first = kept[0] if kept else 0
    second = (removed[0], "negative") if removed else (record.n_steps - 1, "positive")
    return [(first, "positive"), second]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    parser.add_argument("--n-tasks", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--home", default=None, help="where the dequantised SmolLM2 is kept (default: a temp folder)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    tasks = args.tasks.split(",")[: 1 if args.smoke else args.n_tasks]
    max_tokens = 32 if args.smoke else args.max_tokens
    home = Path(args.home or tempfile.mkdtemp(prefix="bench-smollm2-"))
    started = time.perf_counter()
    folder = smollm2_folder(home)
    print(f"SmolLM2 folder ready in {time.perf_counter() - started:.1f} s: {folder}")
    rows: list = []
    failures: Counter[str] = Counter()
    with serve_local_model(folder, log_path=home / "serve.log") as endpoint:
        print(f"endpoint up in {time.perf_counter() - started:.1f} s: {endpoint.base_url}")
        client = ChatClient(endpoint.chat_endpoint(timeout_s=300))
        writer = LLMMilestones(client, max_tokens=max_tokens)
        store = MilestoneStore(writer)
        options = RationaleOptions(max_tokens=max_tokens)
        for task in tasks:
            record = first_success(task)
            if record is None:
                print(f"{task}: no successful demonstration found")
                continue
            before, t0 = writer.fallbacks, time.perf_counter()
            store.update([Rollout(record)])
            m_seconds = time.perf_counter() - t0
            parsed = writer.fallbacks == before
            assert parsed == (writer.last_answer is not None and parse_milestones(writer.last_answer) is not None)
            milestones = store.tasks[task].milestones
            actions = [s.action.canonical_text() for s in record.steps]
            outcomes = []
            for step, verdict in rationale_steps(record):
                request = RationaleRequest(
                    record.instruction, record.steps[step].screen, actions[step], verdict, tuple(actions[:step])
                )
                outcomes.append(ask_rationale(client, request, options))
            failures.update(o["failure"] for o in outcomes if o["failure"])
            rows.append((task, record, parsed, milestones, m_seconds, outcomes))
            answer = " ".join((writer.last_answer or "").split())[:160]
            print(f"{task}: {'parsed' if parsed else 'FALLBACK'} -> {milestones[:3]} | answer {answer!r}")
            for o in outcomes:
                print(f"    rationale: {o['rationale'] or o['failure']!r}"[:220])
    _report(rows, failures, max_tokens)
    return 0


def _report(rows: list, failures: Counter, max_tokens: int) -> None:
    print("\n| task | essential steps | milestones parsed | milestones | s/milestone call | rationales | s/rationale |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for task, record, parsed, milestones, m_seconds, outcomes in rows:
        r_seconds = [o["seconds"] for o in outcomes if o["seconds"] is not None]
        print(
            f"| {task} | {len(essential_steps(record))} | {'yes' if parsed else 'no (fallback)'} | {len(milestones)} | "
            f"{m_seconds:.2f} | {sum(o['ok'] for o in outcomes)}/{len(outcomes)} | "
            f"{sum(r_seconds) / max(1, len(r_seconds)):.2f} |"
        )
    n = len(rows)
    asked = sum(len(r[5]) for r in rows)
    produced = sum(o["ok"] for r in rows for o in r[5])
    seconds = [o["seconds"] for r in rows for o in r[5] if o["seconds"] is not None]
    print(f"\nmax_tokens {max_tokens}, greedy; tasks {n}; load average {os.getloadavg()[0]:.1f} at the end")
    print(f"milestone answers parsed: {sum(r[2] for r in rows)}/{n}; "
          f"s/call mean {sum(r[4] for r in rows) / max(1, n):.2f}")  # fmt: skip
    print(f"rationales produced: {produced}/{asked}; s/call mean {sum(seconds) / max(1, len(seconds)):.2f}")
    print(f"rationale failures: {dict(failures) or 'none'}")


if __name__ == "__main__":
    raise SystemExit(main())
