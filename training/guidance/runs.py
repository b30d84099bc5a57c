"""The guidance stage: reward-guided agents evaluated on held-out seeds of the task catalog, and
the report.

* :func:`run_guidance_evaluation` runs one *method* (the asset's partition) on the held-out seeds
  (``training.policy.store.HELD_OUT_SEED_BASE``: the RL stage's held-out range, never trained on) of the
  policy's tasks, in live MiniWoB++ through the worker pool:

  - ``base``: the policy alone (greedy; N = 1);
  - ``best_of_n``: every verifier of the settings (PRM, ProgRM gain, ...) at every N of the sweep
    (GUI-Shepherd Table 5: N in {1, 3, 5, 8, 16}; N = 1 is ``base``), optionally also with the
    policy's prior (``+prior``);
  - ``oracle``: GuidNav's "top-k with oracle" upper bound at every N;
  - ``judge``: the GUI-PRA judge and its ablations (GUI-PRA Table 2), local or over an endpoint;
  - ``retry``: reflect and retry (GuidNav §3.3) with R retries; pass@k for k = 1..R + 1.

  Models load and settings are checked before any rollout. Everything lands in
  ``guidance_eval`` / ``guidance_episodes`` / ``guidance_steps`` and, as trajectories, in
  ``episodes`` / ``steps`` (one publish per method; the (setting, model) pairs it measures again
  replace their earlier rows, the rest stay: ``training.guidance.storage``).

The report reads them back: :mod:`training.guidance.report`.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from envs.pool import EnvPool
from envs.pool_jobs import BatchResult, EpisodeJob
from envs.protocol import EpisodeRecord, episode_tables
from envs.rollouts import ATTEMPTS_TABLE, ProgressLog
from envs.task_catalog import CatalogTask, load_catalog
from training.guidance.abstention import MarginFit, fit_verifier_margin, margin_label
from training.guidance.agent import GuidedPolicy, StepLog
from training.guidance.judge import VARIANTS, JudgeSettings
from training.guidance.proposals import GuidanceError, LearnedProposer, LLMProposer, Proposer
from training.guidance.reflection import AttemptGuidance, next_guidance, pass_at, reflect
from training.guidance.registry import make_verifier
from training.guidance.storage import EVALUATION_TABLES, evaluation_dataset, sweep_outputs
from training.guidance.verifiers import VERIFIERS, Verifier
from training.llm.chat_client import ChatClient, ChatEndpoint
from training.llm.policy import LLM_EPISODE_CLOCK_MS
from training.policy.evaluation import env_return, failure_mode, sample_seeds
from training.policy.learned import PolicyModel
from training.policy.store import HELD_OUT_SEED_BASE, PolicyNotFoundError, latest_policy
from training.reward_models.kinds import PROGRESS_KINDS, STEP_JUDGE_KINDS
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.purposes import EpisodePurpose
from warehouse.statistics import (
    bootstrap_interval,
    bootstrap_rows,
    paired_comparison,
    percentile_interval,
)
from warehouse.storage import git_revision
from warehouse.tables_guidance import GUIDANCE_EPISODES, GUIDANCE_EVAL, GUIDANCE_STEPS

GUIDANCE_CODE_VERSION = "guidance-1"
METHODS: tuple[str, ...] = ("base", "best_of_n", "oracle", "judge", "retry")
POLICY_BACKENDS = ("learned", "endpoint", "hf")

Log = Callable[[str], None]
PoolFactory = Callable[[int], AbstractContextManager[EnvPool]]


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuidanceSettings:
    """What one evaluation runs; checked at construction (before any rollout)."""

    policy_backend: str = (
        "learned"  # learned (a policies row) | endpoint (an OpenAI-compatible model) | hf (a local LM)
    )
    policy_id: str | None = None  # learned: this policies row (default: the newest SFT policy)
    policy_endpoint: str | None = None  # endpoint: base URL
    policy_model: str = "default"
    policy_path: str | None = None  # hf: a save_pretrained folder
    tasks: tuple[str, ...] = ()  # default: the learned policy's tasks
    held_out_seeds: int = 25  # episodes per task
    n_values: tuple[int, ...] = (1, 3, 5, 8, 16)
    verifiers: tuple[str, ...] = ("prm", "progrm_env")
    with_prior: bool = False  # best_of_n also with log score + log pi (``+prior``)
    with_abstention: bool = False  # best_of_n also abstaining below a fitted margin (``+abstain``)
    sample: bool = False  # N sampled without replacement instead of the N most probable
    judge_n: int = 8
    judge_variants: tuple[str, ...] = VARIANTS
    endpoint: str | None = None  # the judge's and the reflections' OpenAI-compatible endpoint
    endpoint_model: str = "default"
    endpoint_timeout_s: float = 30.0
    judge_local_kind: str = "prm"
    retries: int = 3
    retry_verifier: str | None = None  # None: retry the base policy; a verifier: GuidNav + AR "integration"
    retry_n: int = 5
    workers: int = 2
    episode_max_time_ms: int | None = None  # MiniWoB++'s episode clock; None: see episode_clock_ms

    def __post_init__(self) -> None:
        if self.policy_backend not in POLICY_BACKENDS:
            raise GuidanceError(
                f"unknown policy_backend {self.policy_backend!r}; choose one of {', '.join(POLICY_BACKENDS)}"
            )
        if self.policy_backend == "endpoint" and not self.policy_endpoint:
            raise GuidanceError("policy_backend 'endpoint' needs policy_endpoint (an OpenAI-compatible base URL)")
        if self.policy_backend == "hf" and not self.policy_path:
            raise GuidanceError("policy_backend 'hf' needs policy_path (a save_pretrained folder)")
        if self.policy_backend != "learned" and not self.tasks:
            raise GuidanceError("an LLM policy has no tasks of its own: name the tasks")
        bad_n = [n for n in (*self.n_values, self.judge_n, self.retry_n) if n < 1]
        if bad_n:
            raise GuidanceError(f"N must be at least 1, got {bad_n[0]}")
        if self.held_out_seeds < 1 or self.retries < 0 or self.workers < 1:
            raise GuidanceError("held_out_seeds and workers must be at least 1, retries at least 0")
        for name in (*self.verifiers, *([self.retry_verifier] if self.retry_verifier else [])):
            if name not in VERIFIERS:
                raise GuidanceError(f"unknown verifier {name!r}; choose one of {', '.join(VERIFIERS)}")
        for variant in self.judge_variants:
            if variant not in VARIANTS:
                raise GuidanceError(f"unknown judge variant {variant!r}; choose one of {', '.join(VARIANTS)}")

    @property
    def episode_clock_ms(self) -> int | None:
        """MiniWoB++'s episode clock for this evaluation: as asked, else the benchmark's 10 s (None)
        for the learned policy with local verifiers, and :data:`LLM_EPISODE_CLOCK_MS` when an LLM
        acts, judges or reflects. The page's timer runs while the agent thinks: a judge over a CPU
        endpoint took 110-180 s a step here, so under the 10 s clock every episode ended at its first
        action and the evaluation measured the clock, not the judge."""
        if self.episode_max_time_ms is not None:
            return self.episode_max_time_ms
        return LLM_EPISODE_CLOCK_MS if (self.endpoint or self.policy_backend != "learned") else None

    def judge_settings(self, variant: str = "full") -> JudgeSettings:
        return JudgeSettings.for_variant(
            variant,
            endpoint=self.endpoint,
            model=self.endpoint_model,
            timeout_s=self.endpoint_timeout_s,
            local_kind=self.judge_local_kind,
        )


@dataclass(frozen=True)
class Setting:
    """One evaluated configuration: ``label`` is its key in the tables (``prm:N=8``)."""

    method: str
    label: str
    verifier: str | None = None
    n: int = 1
    variant: str | None = None
    retries: int = 0
    prior: bool = False
    abstain: bool = False  # keep the policy's choice unless the verifier wins by a fitted margin


def plan_settings(method: str, settings: GuidanceSettings) -> list[Setting]:
    """The configurations a method evaluates (see the module docstring)."""
    if method not in METHODS:
        raise GuidanceError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    sweep = [n for n in dict.fromkeys(settings.n_values) if n > 1]
    if method == "base":
        return [Setting("base", "base")]
    if method == "best_of_n":
        out = [Setting(method, f"{v}:N={n}", v, n) for v in settings.verifiers for n in sweep]
        if settings.with_prior:
            out += [Setting(method, f"{v}+prior:N={n}", v, n, prior=True) for v in settings.verifiers for n in sweep]
        if settings.with_abstention:  # a margin is fitted on a reward model's scores
            models = [v for v in settings.verifiers if v in (*STEP_JUDGE_KINDS, *PROGRESS_KINDS)]
            out += [Setting(method, f"{v}+abstain:N={n}", v, n, abstain=True) for v in models for n in sweep]
        return out
    if method == "oracle":
        return [Setting(method, f"oracle:N={n}", "oracle", n) for n in sweep]
    if method == "judge":
        return [
            Setting(method, f"judge:{variant}:N={settings.judge_n}", "judge", settings.judge_n, variant)
            for variant in settings.judge_variants
        ]
    verifier = settings.retry_verifier
    label = f"retry:R={settings.retries}" + (f":{verifier}:N={settings.retry_n}" if verifier else "")
    n = settings.retry_n if verifier else 1
    return [Setting(method, label, verifier, n, str(settings.retries), settings.retries)]


def build_verifiers(
    warehouse: Warehouse | None, settings: GuidanceSettings, plan: Sequence[Setting]
) -> dict[str, Verifier | None]:
    """Every verifier of the plan, loaded now (a missing or wrong model fails before any rollout)."""
    out: dict[str, Verifier | None] = {}
    for s in plan:
        if s.verifier is None:
            out[s.label] = None
        elif s.verifier == "judge":
            out[s.label] = make_verifier("judge", warehouse, judge=settings.judge_settings(s.variant or "full"))
        else:
            out[s.label] = make_verifier(s.verifier, warehouse)
    return out


def _now() -> datetime:
    return datetime.now(UTC)


def load_proposer(
    warehouse: Warehouse, settings: GuidanceSettings
) -> tuple[Proposer, str, list[CatalogTask], list[LineageInput]]:
    """(the policy as a proposer, its id, the tasks to evaluate, lineage)."""
    catalog = load_catalog("miniwob")
    names: list[str] = list(settings.tasks)
    lineage: list[LineageInput] = []
    proposer: Proposer
    if settings.policy_backend == "learned":
        try:
            row = latest_policy(warehouse, "sft", settings.policy_id)
        except PolicyNotFoundError as exc:
            raise GuidanceError(str(exc)) from None
        proposer = LearnedProposer(PolicyModel.load(row["checkpoint"]), row["policy_id"], sample=settings.sample)
        names = names or list(row["tasks"] or [])
        policy_id = row["policy_id"]
        lineage.append(
            LineageInput(kind="asset", input_asset="policy_sft", path=row["checkpoint_path"], version=policy_id)
        )
    elif settings.policy_backend == "endpoint":
        from training.llm.policy import EndpointPolicy

        assert settings.policy_endpoint is not None
        client = ChatClient(ChatEndpoint(settings.policy_endpoint, settings.policy_model))
        policy_id = f"endpoint:{settings.policy_model}"
        proposer = LLMProposer(EndpointPolicy(client, policy_id=policy_id))
        lineage.append(LineageInput(kind="file", path=settings.policy_endpoint, version=settings.policy_model))
    else:
        from training.llm.policy import HFPolicy

        assert settings.policy_path is not None
        policy_id = f"hf:{Path(settings.policy_path).name}"
        proposer = LLMProposer(HFPolicy.from_pretrained(settings.policy_path, policy_id=policy_id, greedy=True))
        lineage.append(LineageInput(kind="file", path=settings.policy_path))
    unknown = [n for n in names if n not in catalog]
    if unknown or not names:
        raise GuidanceError(f"no tasks to evaluate, or not in the MiniWoB++ catalog: {unknown or names}")
    return proposer, policy_id, [catalog[n] for n in names], lineage


# ---------------------------------------------------------------------------------------------
# Running a setting
# ---------------------------------------------------------------------------------------------


@dataclass
class SettingResult:
    """The episodes of one setting, their step logs, and per attempt the guidance given."""

    setting: Setting
    verifier_model_id: str = ""  # the trained model(s) the verifier scored with ('' for none)
    records: list[tuple[EpisodeRecord, int]] = field(default_factory=list)  # (record, attempt)
    logs: dict[str, list[StepLog]] = field(default_factory=dict)
    given: dict[str, tuple[str | None, str | None, int]] = field(default_factory=dict)  # id -> reflection
    batches: list[BatchResult] = field(default_factory=list)
    lost: int = 0


def verifier_model_id(verifier: Verifier | None) -> str:
    """The trained model(s) a verifier scores with: the versions its lineage names, sorted and
    joined by ``+`` (a local judge with an endpoint names both); ``''`` for none (base, oracle)."""
    if verifier is None:
        return ""
    return "+".join(sorted({i.version for i in verifier.lineage() if i.version}))


def episode_id_for(policy_id: str, label: str, task_id: str, seed: int, attempt: int, model_id: str = "") -> str:
    """A guidance episode's id; a verifier's model id is part of it, so sweeps with other models
    never share an episode id (settings without a trained verifier keep their old ids)."""
    setting = f"{label}@{model_id}" if model_id else label
    return f"guide:{policy_id}:{setting}:{task_id}:{seed}:a{attempt}"


def run_setting(
    pool: EnvPool,
    setting: Setting,
    proposer: Proposer,
    verifier: Verifier | None,
    tasks: Sequence[CatalogTask],
    seeds: Sequence[int],
    *,
    policy_id: str,
    reflection_client: ChatClient | None = None,
    margin: float | None = None,
    log: Log = print,
) -> SettingResult:
    """All held-out episodes of one setting; a retry setting runs failed instances again (same
    seed) with their reflection, up to ``setting.retries`` times."""
    guided = GuidedPolicy(
        proposer,
        verifier,
        setting.n,
        policy_id=f"guided:{policy_id}:{setting.label}",
        prior=setting.prior,
        margin=margin,
    )
    model_id = verifier_model_id(verifier)
    if margin is not None:  # the fitted margin is part of what was evaluated
        setting = replace(setting, variant=margin_label(margin))
    out = SettingResult(setting, verifier_model_id=model_id)
    pending = [(task, seed) for task in tasks for seed in seeds]
    for attempt in range(setting.retries + 1):
        if not pending:
            break
        jobs = [
            EpisodeJob(
                episode_id_for(policy_id, setting.label, t.task_id, s, attempt, model_id),
                t.spec,
                s,
                t.max_steps,
                t.family,
            )
            for t, s in pending
        ]
        label = f"{setting.label}" + (f" attempt {attempt}" if setting.retries else "")
        started = time.perf_counter()
        result = pool.run(jobs, guided, on_episode=ProgressLog(log, label))
        log(f"{label}: {result.successes}/{len(jobs)} solved in {time.perf_counter() - started:.1f} s")
        out.batches.append(result)
        out.lost += len(result.lost)
        failed = []
        by_instance = {(r.task_id, r.seed): r for r in result.episodes}
        for t, s in pending:
            record = by_instance.get((t.task_id, s))
            if record is None:
                continue
            out.records.append((record, attempt))
            out.logs[record.episode_id] = list(guided.logs.get(record.episode_id, []))
            current = guided.attempts.get((t.task_id, s), AttemptGuidance())
            out.given[record.episode_id] = (current.reflection, current.source, len(current.bans))
            if not record.success and attempt < setting.retries:
                reflection = reflect(record, reflection_client)
                guided.attempts[(t.task_id, s)] = next_guidance(current, record, reflection)
                failed.append((t, s))
        pending = failed
    return out


# ---------------------------------------------------------------------------------------------
# Figures (pure)
# ---------------------------------------------------------------------------------------------


def paired_delta(
    a: Mapping[tuple, bool], b: Mapping[tuple, bool], *, samples: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Success of ``a`` minus success of ``b`` on the instances both ran (paired), with a 95%
    percentile bootstrap interval over instances, and McNemar's exact test."""
    keys = sorted(set(a) & set(b))
    if not keys:
        return {"delta": math.nan, "low": math.nan, "high": math.nan, "only_a": 0, "only_b": 0, "p": math.nan}
    diff = np.array([float(a[k]) - float(b[k]) for k in keys])
    low, high = percentile_interval(diff[bootstrap_rows(diff.size, resamples=samples, seed=seed)].mean(axis=1), 0.95)
    counts = paired_comparison(a, b)
    return {
        "delta": float(diff.mean()),
        "low": low,
        "high": high,
        "only_a": int(counts["only_a"]),
        "only_b": int(counts["only_b"]),
        "p": float(counts["mcnemar_p"]),
    }


def instance_outcomes(episodes: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], list[bool]]:
    """Per (task, seed): the outcomes of its attempts in order."""
    out: dict[tuple[str, int], list[tuple[int, bool]]] = defaultdict(list)
    for e in episodes:
        out[(e["task_id"], int(e["seed"]))].append((int(e["attempt"]), bool(e["success"])))
    return {k: [s for _, s in sorted(v)] for k, v in out.items()}


def setting_rows(
    meta: Mapping[str, Any],
    episodes: Sequence[Mapping[str, Any]],
    steps: Sequence[Mapping[str, Any]],
    base: Mapping[tuple[str, int], bool] | None,
    *,
    max_attempts: int = 1,
) -> list[dict[str, Any]]:
    """``guidance_eval`` rows of one setting (per task, then ``all``) from its episode and step rows.
    A retry setting's success is the instance's over all its attempts; ``pass_at`` lists pass@k."""
    rows = []
    tasks = sorted({e["task_id"] for e in episodes})
    for task in [*tasks, "all"]:
        mine = [e for e in episodes if task == "all" or e["task_id"] == task]
        ids = {e["episode_id"] for e in mine}
        my_steps = [s for s in steps if s["episode_id"] in ids]
        outcomes = instance_outcomes(mine)
        solved = {k: any(v) for k, v in outcomes.items()}
        low, high = bootstrap_interval(list(solved.values()))
        delta = paired_delta(solved, base) if base is not None else None
        n_steps = max(1, len(my_steps))
        modes = Counter(e["failure_mode"] for e in mine if e["failure_mode"])
        seconds = sum((s["propose_ms"] or 0) + (s["verify_ms"] or 0) for s in my_steps) / 1000
        rows.append(
            {
                **meta,
                "task_id": task,
                "episodes": len(solved),
                "successes": sum(solved.values()),
                "success_rate": sum(solved.values()) / len(solved) if solved else math.nan,
                "success_low": low,
                "success_high": high,
                "delta_vs_base": None if delta is None else delta["delta"],
                "delta_low": None if delta is None else delta["low"],
                "delta_high": None if delta is None else delta["high"],
                "only_setting": None if delta is None else delta["only_a"],
                "only_base": None if delta is None else delta["only_b"],
                "mcnemar_p": None if delta is None else delta["p"],
                "mean_steps": float(np.mean([e["n_steps"] for e in mine])) if mine else math.nan,
                "seconds_per_step": seconds / n_steps,
                "propose_ms": sum(s["propose_ms"] or 0 for s in my_steps) / n_steps,
                "verify_ms": sum(s["verify_ms"] or 0 for s in my_steps) / n_steps,
                "verifier_calls_per_step": sum(s["verifier_calls"] or 0 for s in my_steps) / n_steps,
                "policy_calls_per_step": sum(s["policy_calls"] or 0 for s in my_steps) / n_steps,
                "changed_choice": sum((s["chosen_rank"] or 0) != 0 for s in my_steps) / n_steps,
                "fallback_steps": sum(s["mode"] == "fallback" for s in my_steps) / n_steps,
                "unjudged_steps": sum(s["mode"] == "unjudged" for s in my_steps) / n_steps,
                "pass_at": json.dumps({str(k): pass_at(list(outcomes.values()), k) for k in range(1, max_attempts + 1)})
                if max_attempts > 1
                else None,
                "failure_modes": json.dumps(dict(modes), sort_keys=True),
                "created_at": _now(),
            }
        )
    return rows


def _step_rows(result: SettingResult) -> list[dict[str, Any]]:
    rows = []
    for record, _ in result.records:
        for s in result.logs.get(record.episode_id, []):
            rows.append(
                {
                    "episode_id": record.episode_id,
                    "step_idx": s.step_idx,
                    "setting": result.setting.label,
                    "n_candidates": s.n_candidates,
                    "chosen_rank": s.chosen_rank,
                    "chosen_score": s.chosen_score,
                    "first_score": s.first_score,
                    "scores": list(s.scores),
                    "propose_ms": 1000 * s.propose_s,
                    "verify_ms": 1000 * s.verify_s,
                    "policy_calls": s.policy_calls,
                    "verifier_calls": s.verifier_calls,
                    "mode": s.mode,
                    "note": s.note,
                    "banned": s.banned,
                    "details": s.details,
                }
            )
    return rows


def _episode_rows(result: SettingResult, policy_id: str) -> list[dict[str, Any]]:
    rows = []
    for record, attempt in result.records:
        logs = result.logs.get(record.episode_id, [])
        reflection, source, bans = result.given.get(record.episode_id, (None, None, 0))
        rows.append(
            {
                "policy_id": policy_id,
                "setting": result.setting.label,
                "verifier_model_id": result.verifier_model_id,
                "task_id": record.task_id,
                "seed": record.seed,
                "attempt": attempt,
                "method": result.setting.method,
                "episode_id": record.episode_id,
                "success": record.success,
                "env_return": env_return(record),
                "n_steps": record.n_steps,
                "failure_mode": failure_mode(record),
                "seconds": sum(s.propose_s + s.verify_s for s in logs),
                "verifier_calls": sum(s.verifier_calls for s in logs),
                "fallback_steps": sum(s.mode == "fallback" for s in logs),
                "unjudged_steps": sum(s.mode == "unjudged" for s in logs),
                "reflection": reflection,
                "reflection_source": source,
                "banned_actions": bans,
            }
        )
    return rows


def _meta(setting: Setting, policy_id: str, model_id: str, judge_mode: str | None) -> dict[str, Any]:
    return {
        "policy_id": policy_id,
        "setting": setting.label,
        "verifier_model_id": model_id,
        "method": setting.method,
        "verifier": setting.verifier + ("+prior" if setting.prior else "+abstain" if setting.abstain else "")
        if setting.verifier
        else None,
        "n": setting.n,
        "variant": setting.variant,
        "judge_mode": judge_mode,
    }


def _base_outcomes(warehouse: Warehouse, policy_id: str) -> dict[tuple[str, int], bool] | None:
    try:
        rows = warehouse.query(
            "SELECT task_id, seed, success FROM guidance_episodes WHERE policy_id = ? AND setting = 'base'",
            [policy_id],
        ).to_pylist()
    except Exception:  # noqa: BLE001 - no guidance_episodes yet
        return None
    return {(r["task_id"], int(r["seed"])): bool(r["success"]) for r in rows} or None


# ---------------------------------------------------------------------------------------------
# The evaluation asset
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Evaluation:
    """What one method's evaluation runs with, every model loaded and every setting checked."""

    plan: list[Setting]
    proposer: Proposer
    policy_id: str
    tasks: list[CatalogTask]
    verifiers: dict[str, Verifier | None]
    lineage: list[LineageInput]
    reflection_client: ChatClient | None
    seeds: list[int]
    margins: dict[str, MarginFit] = field(default_factory=dict)  # abstaining settings' fitted margins


@dataclass
class _EvaluationRows:
    """The rows of the three guidance tables over every setting, and each setting's summary."""

    eval_rows: list[dict] = field(default_factory=list)
    episode_rows: list[dict] = field(default_factory=list)
    step_rows: list[dict] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def run_guidance_evaluation(
    warehouse: Warehouse,
    method: str,
    settings: GuidanceSettings,
    pool_factory: PoolFactory,
    *,
    run_id: str | None,
    log: Log = print,
) -> dict[str, Any]:
    """Evaluate one method on the held-out seeds (see the module docstring); returns the asset's
    metadata. Every model is loaded and every setting checked before the first rollout."""
    torch.set_num_threads(1)
    evaluation = _prepare_evaluation(warehouse, method, settings, log)
    results = _run_plan(evaluation, pool_factory, settings.workers, log)
    policy_id = evaluation.policy_id
    base = _base_outcomes(warehouse, policy_id)
    m = Materialization(
        asset="guidance_evaluation",
        run_id=run_id,
        partition_key=method,
        code_version=f"{GUIDANCE_CODE_VERSION}+{git_revision()}",
        parameters={
            "method": method,
            "settings": asdict(settings),
            "policy_id": policy_id,
            "held_out_seeds": evaluation.seeds,
        },
        inputs=evaluation.lineage,
    )
    rows = _evaluation_rows(results, method, settings, policy_id, base)
    records = _publish_evaluation(warehouse, m, results, rows, run_id, (policy_id, method))
    return {
        "policy_id": policy_id,
        "method": method,
        "tasks": [t.task_id for t in evaluation.tasks],
        "held_out_seeds": len(evaluation.seeds),
        "episodes": len(records),
        "settings": rows.summary,
        "judge_mode": ("endpoint" if settings.endpoint else "local") if method == "judge" else None,
    }


def _prepare_evaluation(warehouse: Warehouse, method: str, settings: GuidanceSettings, log: Log) -> _Evaluation:
    """Plan the method's settings, load the policy and every verifier, and draw the held-out seeds."""
    plan = plan_settings(method, settings)
    proposer, policy_id, tasks, lineage = load_proposer(warehouse, settings)
    verifiers = build_verifiers(warehouse, settings, plan)
    for v in verifiers.values():
        lineage += v.lineage() if v is not None else []
    if method == "oracle":
        missing = [t.task_id for t in tasks if not t.has_solution]
        if missing:
            log(f"oracle: {missing} have no solution in their spec: the oracle keeps the policy's choice there")
    reflection_client = None
    if settings.endpoint:
        endpoint = ChatEndpoint(settings.endpoint, settings.endpoint_model, timeout_s=settings.endpoint_timeout_s)
        reflection_client = ChatClient(endpoint)
    seeds = sample_seeds(HELD_OUT_SEED_BASE, settings.held_out_seeds, "held_out")
    log(
        f"guidance {method}: {len(plan)} settings x {len(tasks)} tasks x {len(seeds)} held-out seeds "
        f"with {policy_id}: {', '.join(s.label for s in plan)}"
    )
    margins = _fit_margins(warehouse, plan, verifiers, {(t.task_id, s) for t in tasks for s in seeds}, log)
    return _Evaluation(plan, proposer, policy_id, tasks, verifiers, lineage, reflection_client, seeds, margins)


def _fit_margins(
    warehouse: Warehouse,
    plan: Sequence[Setting],
    verifiers: Mapping[str, Verifier | None],
    evaluated: set[tuple[str, int]],
    log: Log,
) -> dict[str, MarginFit]:
    """Each abstaining setting's margin, fitted on held-out states outside the evaluated instances."""
    margins: dict[str, MarginFit] = {}
    for setting in (s for s in plan if s.abstain):
        verifier = verifiers[setting.label]
        scorer = getattr(getattr(verifier, "scorer", None), "scorer", None)
        if scorer is None or setting.verifier is None:
            raise GuidanceError(f"{setting.label}: abstention needs a reward-model verifier")
        fit = fit_verifier_margin(warehouse, setting.verifier, scorer, evaluated, setting.n)
        log(
            f"{setting.label}: margin {fit.margin:.4f} fitted on {fit.states} held-out states, their top "
            f"{setting.n} candidates (mean value "
            f"{fit.value:.3f}; the policy alone {fit.policy_value:.3f}, the verifier's argmax "
            f"{fit.verifier_value:.3f}; overrides {100 * fit.overridden:.0f}% of states)"
        )
        margins[setting.label] = fit
    return margins


def _run_plan(evaluation: _Evaluation, pool_factory: PoolFactory, workers: int, log: Log) -> list[SettingResult]:
    """Run every setting of the plan, in order, through one worker pool."""
    results: list[SettingResult] = []
    with pool_factory(workers) as pool:
        for setting in evaluation.plan:
            results.append(
                run_setting(
                    pool,
                    setting,
                    evaluation.proposer,
                    evaluation.verifiers[setting.label],
                    evaluation.tasks,
                    evaluation.seeds,
                    policy_id=evaluation.policy_id,
                    reflection_client=evaluation.reflection_client,
                    margin=evaluation.margins[setting.label].margin if setting.label in evaluation.margins else None,
                    log=log,
                )
            )
    return results


def _evaluation_rows(
    results: Sequence[SettingResult],
    method: str,
    settings: GuidanceSettings,
    policy_id: str,
    base: dict[tuple[str, int], bool] | None,
) -> _EvaluationRows:
    """Every setting's ``guidance_eval``, ``guidance_episodes`` and ``guidance_steps`` rows, and its summary."""
    out = _EvaluationRows()
    for result in results:
        episodes, steps = _episode_rows(result, policy_id), _step_rows(result)
        judge_mode = None
        if result.setting.verifier == "judge":
            judge_mode = "endpoint" if settings.endpoint else "local"
        # The base method is its own baseline; every other method is compared with base's outcomes.
        mine = {(e["task_id"], int(e["seed"])): bool(e["success"]) for e in episodes} if method == "base" else base
        rows = setting_rows(
            _meta(result.setting, policy_id, result.verifier_model_id, judge_mode),
            episodes,
            steps,
            mine,
            max_attempts=result.setting.retries + 1,
        )
        out.eval_rows += rows
        out.episode_rows += episodes
        out.step_rows += steps
        out.summary[result.setting.label] = _setting_summary(result, rows[-1])
    return out


def _setting_summary(result: SettingResult, overall: Mapping[str, Any]) -> dict[str, Any]:
    """One setting's entry in the asset's metadata, from its ``all``-tasks ``guidance_eval`` row."""
    return {
        "success_rate": overall["success_rate"],
        "interval": [overall["success_low"], overall["success_high"]],
        "delta_vs_base": overall["delta_vs_base"],
        "ms_per_step": 1000 * overall["seconds_per_step"],
        "verifier_calls_per_step": overall["verifier_calls_per_step"],
        "lost": result.lost,
        **({"pass_at": json.loads(overall["pass_at"])} if overall["pass_at"] else {}),
    }


def _publish_evaluation(
    warehouse: Warehouse,
    m: Materialization,
    results: Sequence[SettingResult],
    rows: _EvaluationRows,
    run_id: str | None,
    policy_and_method: tuple[str, str],
) -> list[EpisodeRecord]:
    """Publish every setting's episodes, attempts and guidance rows as one version, with what
    earlier sweeps stored that this one did not measure again (:func:`sweep_outputs`); returns the
    episodes."""
    records = [r for result in results for r, _ in result.records]
    merged = BatchResult(
        episodes=records,
        attempts=[a for result in results for b in result.batches for a in b.attempts],
        lost=[x for result in results for b in result.batches for x in b.lost],
        seconds=sum(b.seconds for result in results for b in result.batches),
        workers_started=0,
        workers_replaced=0,
    )
    episodes_table, steps_table = episode_tables(records, run_id=run_id, purpose=EpisodePurpose.GUIDANCE_EVALUATION)
    tables = {
        "episodes": episodes_table,
        "steps": steps_table,
        ATTEMPTS_TABLE: merged.attempts_table(run_id),
        "guidance_eval": pa.Table.from_pylist(rows.eval_rows, schema=GUIDANCE_EVAL),
        "guidance_episodes": pa.Table.from_pylist(rows.episode_rows, schema=GUIDANCE_EPISODES),
        "guidance_steps": pa.Table.from_pylist(rows.step_rows, schema=GUIDANCE_STEPS),
    }
    measured = {(r.setting.label, r.verifier_model_id) for r in results}
    models = [r.verifier_model_id for r in results]
    # taken before the datasets are read: two sweeps of one method never drop each other's rows
    guard = warehouse.guard(EVALUATION_TABLES, [evaluation_dataset(*policy_and_method, [])])
    warehouse.publish(m, sweep_outputs(warehouse, m, *policy_and_method, tables, measured, models), guard=guard)
    return records
