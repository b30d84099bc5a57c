"""RL episodes and their per-step rewards in the shapes external LLM-RL trainers read.

Past one machine, RL of an LLM actor at scale belongs to an existing engine (OpenRLHF, verl);
Stepwise hands it what it has: the trajectories its environments produced and the rewards its
reward models gave, per step. Two files per export:

* ``steps.parquet``: one row per agent step, as verl's datasets are laid out: ``data_source``,
  ``prompt`` (chat messages: ProgRM Table 11's actor prompt, built from the recorded screen and
  history), ``response`` (the step's action in the prompt's ``<action>`` format), ``reward`` (the
  run's step reward), ``return`` (discounted reward-to-go), ``advantage`` (as the run's estimator
  computed it), ``done`` and ``extra_info`` (episode, step, task, source).
* ``trajectories.jsonl``: one line per episode, as multi-turn trainers take them (OpenRLHF's
  ``messages`` format): the alternating user/assistant turns, ``step_rewards`` and ``success``.

Steps whose action cannot be written in the prompt's language (a target the numbered screen does
not show) are kept with ``response = null`` and counted.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from training.llm.prompts import HistoryEntry, action_to_call, build_messages, format_response
from training.rl.estimators import discounted_returns
from warehouse.catalog import Warehouse
from warehouse.storage import atomic_path, write_atomic
from warehouse.trajectories import load_trajectories


@dataclass
class ExportSummary:
    """Where the files went and what they hold."""

    steps_path: Path
    trajectories_path: Path
    episodes: int
    steps: int
    steps_without_response: int


def export_rl_data(
    warehouse: Warehouse, out_dir: Path | str, *, run_key: str | None = None, gamma: float = 0.9
) -> ExportSummary:
    """Write every RL episode (of one run, or all) with its step rewards to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    where, params = ("run_key = ?", [run_key]) if run_key else ("TRUE", [])
    rewards = warehouse.query(
        f"SELECT episode_id, step_idx, run_key, reward_source, reward, advantage FROM rl_step_rewards WHERE {where}",
        params,
    ).to_pylist()
    if not rewards:
        raise ValueError(f"no RL step rewards{f' for run {run_key}' if run_key else ''}: run `stepwise rl` first")
    by_episode: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in rewards:
        by_episode[r["episode_id"]][r["step_idx"]] = r
    step_rows, lines, missing = [], [], 0
    for t in load_trajectories(warehouse, "list_contains(?, e.episode_id)", [sorted(by_episode)]):
        info = by_episode[t.episode_id]
        step_rewards = [float(info[i]["reward"]) if i in info else 0.0 for i in range(t.n_steps)]
        returns = discounted_returns(step_rewards, gamma)
        history: list[HistoryEntry] = []
        messages_so_far: list[dict[str, str]] = []
        for i, (screen, action) in enumerate(zip(t.screens, t.actions, strict=True)):
            messages, elements = build_messages(t.instruction, screen, history, step_index=i, max_steps=t.n_steps)
            call = action_to_call(action, elements)
            response = format_response(call) if call is not None else None
            missing += response is None
            step_rows.append(
                {
                    "data_source": f"stepwise/{t.task_id}",
                    "prompt": messages,
                    "response": response,
                    "reward": step_rewards[i],
                    "return": float(returns[i]),
                    "advantage": info.get(i, {}).get("advantage"),
                    "done": i == t.n_steps - 1,
                    "extra_info": {
                        "episode_id": t.episode_id,
                        "step_idx": i,
                        "task_id": t.task_id,
                        "reward_source": info.get(i, {}).get("reward_source"),
                        "run_key": info.get(i, {}).get("run_key"),
                        "success": t.success,
                    },
                }
            )
            if not messages_so_far:
                messages_so_far.append(messages[0])
            messages_so_far.append(messages[1])
            messages_so_far.append({"role": "assistant", "content": response or ""})
            history.append(HistoryEntry(action))
        lines.append(
            json.dumps(
                {
                    "episode_id": t.episode_id,
                    "task_id": t.task_id,
                    "messages": messages_so_far,
                    "step_rewards": step_rewards,
                    "success": t.success,
                },
                ensure_ascii=False,
            )
        )
    steps_path, trajectories_path = out / "steps.parquet", out / "trajectories.jsonl"
    with atomic_path(steps_path) as tmp:
        pq.write_table(pa.Table.from_pylist(step_rows), tmp)
    write_atomic(trajectories_path, "\n".join(lines) + "\n")
    return ExportSummary(steps_path, trajectories_path, len(lines), len(step_rows), missing)
