"""``stepwise flywheel``: the reward flywheel as one command, each step a Dagster job run in-process.

A round: policy rollouts of every available checkpoint on its own tasks (``policy_rollouts``, one
family x policy partition each) -> alternatives at one state proposed by the SFT policy
(``step_alternatives``: its top-k candidates replayed and labelled by Monte-Carlo continuations) ->
incremental recipes and progress labels of the families that got episodes (``label_families``) ->
the reward-model split -> each reward-model kind's dataset and model on the new mix
(``reward_models``; the PRM with its pairwise loss over alternatives) -> the reward-model report
(AUC on held-out agent episodes; top-1 among candidates at held-out states) -> the round recorded
(``flywheel_round``: table ``flywheel_rounds``, a plot of AUC by round).

Before the first round, round 0 records the baseline: the current models (trained when missing)
judged by the same report, after the held-out alternatives are made (once, so that every round
is judged on the same states). Every step publishes atomically, so a round killed part-way is simply
run again: the same round number, the same seeds, identical episodes replacing the ones already
collected, labels picking up where they stopped, a killed training resuming.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.task_catalog import load_catalog
from training.flywheel.alternatives import held_out_dataset
from training.flywheel.collection import CollectionError, resolve_policy
from training.flywheel.rounds import next_round
from training.reward_models.kinds import SUCCESS_JUDGE_KINDS
from warehouse.catalog import Warehouse

#: Runs one job: (job name, label, partition key, op config, tags) -> success.
JobRunner = Callable[..., bool]
Log = Callable[[str], None]


@dataclass(frozen=True)
class FlywheelSettings:
    policies: tuple[str, ...] = ("sft", "rl-outcome", "rl-orm", "rl-progrm_lcs", "rl-progrm_env")
    episodes_per_task: int = 16
    temperature: float = 1.0
    kinds: tuple[str, ...] = ("orm", "progrm_lcs", "progrm_env", "prm")
    reward_model: Mapping[str, Any] = field(default_factory=dict)  # reward_model op config (train_steps, ...)
    report: Mapping[str, Any] = field(default_factory=dict)  # reward_model_report op config
    workers: int = 2
    # Alternatives at one state (step_alternatives op config: states_per_task, top_k, continuations,
    # ...), proposed by these policies; empty policies: none. Best-of-N guidance proposes with the
    # SFT policy, so its alternatives are what a verifier is judged on.
    alternative_policies: tuple[str, ...] = ("sft",)
    alternatives: Mapping[str, Any] = field(default_factory=dict)


def collection_plan(warehouse: Warehouse, policies: Sequence[str], log: Log) -> list[tuple[str, str]]:
    """(family, policy) partitions to collect: every policy that exists, on the families of its tasks."""
    catalog = load_catalog("miniwob")
    plan: list[tuple[str, str]] = []
    for policy in policies:
        try:
            row = resolve_policy(warehouse, policy)
        except CollectionError as exc:
            log(f"   {policy}: skipped ({exc})")
            continue
        families = sorted({catalog[t].family for t in row["tasks"] or [] if t in catalog})
        plan += [(family, policy) for family in families]
    return plan


def run_alternatives(
    warehouse: Warehouse, round_: int, settings: FlywheelSettings, run: JobRunner, log: Log, *, held_out_only: bool
) -> bool:
    """``step_alternatives`` for every (family, proposing policy) partition: the held-out states
    only (the baseline: they are sampled once, so every round is judged on the same states), or
    every source (a round: the round's policy rollouts, expert rollouts, and the held-out states if
    they are still missing)."""
    from dagster import MultiPartitionKey

    config = {"round": round_, "workers": settings.workers} | dict(settings.alternatives)
    if held_out_only:
        config["sources"] = ["evaluation"]
    for family, policy in collection_plan(warehouse, settings.alternative_policies, log):
        proposer = resolve_policy(warehouse, policy)["policy_id"]
        if held_out_only and warehouse.current_version("step_alternatives", held_out_dataset(proposer, family)):
            continue  # sampled once: they judge every round
        key = MultiPartitionKey({"family": family, "policy": policy})
        label = f"step_alternatives[{family}|{policy}] r{round_}"
        log(f"   round {round_}: alternatives at {'held-out ' if held_out_only else ''}states, {family} | {policy}")
        if not run("step_alternatives_job", label, key, {"step_alternatives": {"config": config}}):
            return False
    return True


def run_round(
    warehouse: Warehouse, round_: int, settings: FlywheelSettings, run: JobRunner, log: Log, *, collect: bool = True
) -> bool:
    """One round (see the module docstring); ``collect=False``: the baseline (round 0). Stops at the
    first failed step and returns False."""
    from dagster import MultiPartitionKey

    alternatives = bool(settings.alternative_policies)
    if not collect and alternatives and proposers_without_held_out_states(warehouse, settings):
        if not run_alternatives(warehouse, round_, settings, run, log, held_out_only=True):
            return False
    if collect:
        plan = collection_plan(warehouse, settings.policies, log)
        if not plan:
            log("   no policy to collect from: run `stepwise rl` first (an SFT policy at least)")
            return False
        config = {
            "round": round_,
            "episodes_per_task": settings.episodes_per_task,
            "temperature": settings.temperature,
            "workers": settings.workers,
        }
        for family, policy in plan:
            log(f"   round {round_}: collecting {family} | {policy}")
            key = MultiPartitionKey({"family": family, "policy": policy})
            if not run(
                "policy_rollouts_job",
                f"policy_rollouts[{family}|{policy}] r{round_}",
                key,
                {"policy_rollouts": {"config": config}},
            ):
                return False
        if alternatives and not run_alternatives(warehouse, round_, settings, run, log, held_out_only=False):
            return False
        for family in sorted({family for family, _ in plan}):
            if not run("label_families", f"labels[{family}] r{round_}", family):
                return False
        if not run("progress_split_job", f"progress_split r{round_}"):
            return False
    for kind in settings.kinds:
        if collect or not _has_model(warehouse, kind):
            log(f"   round {round_}: training {kind} on the current mix")
            if not run(
                "reward_models",
                f"reward_models[{kind}] r{round_}",
                kind,
                {"reward_model": {"config": dict(settings.reward_model)}},
            ):
                return False
    # the report judges every kind that has a model, retrained this round or not (the report's
    # checks compare the success judges, and the round records each kind's model as it stands)
    report = {"kinds": sorted(set(settings.kinds) | set(SUCCESS_JUDGE_KINDS))} | dict(settings.report)
    if not run(
        "reward_model_evaluation", f"reward_model_report r{round_}", None, {"reward_model_report": {"config": report}}
    ):
        return False
    return run(
        "flywheel_round_job", f"flywheel_round r{round_}", None, {"flywheel_round": {"config": {"round": round_}}}
    )


def proposers_without_held_out_states(warehouse: Warehouse, settings: FlywheelSettings) -> list[str]:
    """The (family | proposer id) partitions whose held-out alternatives do not exist yet."""
    missing = []
    for family, policy in collection_plan(warehouse, settings.alternative_policies, lambda _: None):
        proposer = resolve_policy(warehouse, policy)["policy_id"]
        if warehouse.current_version("step_alternatives", held_out_dataset(proposer, family)) is None:
            missing.append(f"{family} | {proposer}")
    return missing


def _has_model(warehouse: Warehouse, kind: str) -> bool:
    from training.base.registry import latest_models

    return bool(latest_models(warehouse, [kind]))


def run_flywheel(warehouse: Warehouse, rounds: int, settings: FlywheelSettings, run: JobRunner, log: Log) -> bool:
    """The baseline when none is recorded, then ``rounds`` rounds after the last recorded one.
    Without a policy to collect from, nothing runs (the baseline would judge no agent episode)."""
    if not collection_plan(warehouse, settings.policies, log):
        log("   no policy to collect from: run `stepwise rl` first (an SFT policy and its evaluation at least)")
        return False
    if next_round(warehouse) == 0:
        log("== flywheel round 0 (baseline): the current reward models on held-out agent episodes")
        if not run_round(warehouse, 0, settings, run, log, collect=False):
            return False
    elif missing := proposers_without_held_out_states(warehouse, settings):
        # A proposer new since the last round (a new SFT policy): its held-out states are made
        # first, and the last round's models are judged on them again, so that the next round's
        # top-1 has a "before" on the same states.
        last = next_round(warehouse) - 1
        log(f"== held-out alternatives of {', '.join(missing)}: the models of round {last} judged on them again")
        if not run_round(warehouse, last, settings, run, log, collect=False):
            return False
    for _ in range(rounds):
        round_ = next_round(warehouse)
        log(f"== flywheel round {round_}: collect, label, retrain {', '.join(settings.kinds)}, report")
        if not run_round(warehouse, round_, settings, run, log):
            return False
    return True
