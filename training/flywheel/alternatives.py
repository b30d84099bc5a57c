"""Alternatives at one state: what else the policy could have done there, and how each would have gone.

A reward model that guides a policy (best-of-N, GUI-Shepherd Alg. 2; GuidNav Eqs. 4-6) must rank the
candidates the policy proposes *at one state*; trained on the steps trajectories took, it never saw
two of them side by side. GuidNav refines its verifier on self-play: at each state the policy's
top-k candidates, each labelled by whether it is right (§4, App. A.1). Here each candidate is
carried out live by deterministic replay (:mod:`training.flywheel.replay`: the recorded episode's
seed and first t actions, every screen checked) and labelled three ways:

(a) whether it is the task plan's next step at that state (the scripted expert's plan,
    ``envs.policies.PlanTracker``: the demonstrated action, where the task's spec has a solution);
(b) what its own step reached: milestones of the task spec, the episode's end and how;
(c) the success rate of m continuations by the policy after it (Math-Shepherd's Monte-Carlo
    estimate of a step's value: completions sampled from the policy, here at ``temperature``).

States are sampled (seeded) from three sources: the proposing policy's own rollouts of the round
(``policy_rollout``), the rollouts asset's expert episodes (``exploration``), both training data, and
the policy's greedy evaluation episodes (``evaluation``: a fixed held-out set, sampled once, never
trained on, on which the reward-model report measures how often a model picks the best candidate).
On request a fourth, ``selection``: the policy's evaluation episodes on its selection seeds only,
sampled once into a held-out set of their own, so that guidance can fit its abstention margin on
states away from the held-out seeds it evaluates on (``training.guidance.abstention``).
Human demonstrations have no seed and cannot be replayed. Where no replay reproduces a state (a page
that does not repeat), its candidates are labelled from the recording instead
(:mod:`training.flywheel.alternative_labels`: the plan's step, the field a typed value belongs to,
the recorded action's own continuation), so a task whose pages do not replay still has candidates.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from annotation.progress.labeling import milestone_hits
from envs.miniwob.live import SUPPORTED_ACTIONS
from envs.policies import PlanTracker, SolutionError, expand_solution
from envs.pool import EnvPool
from envs.pool_jobs import EpisodeJob
from envs.protocol import EpisodeContext
from envs.rollouts import ProgressLog
from envs.task_catalog import CatalogTask
from training.base.states import describe_action
from training.flywheel.alternative_labels import (
    RECORDING_LABELS,
    AlternativesSummary,
    CandidateAction,
    RecordingLabels,
    SourceEpisode,
    StateToLabel,
    alternative_rows,
    recording_rows,
)
from training.flywheel.collection import (
    CollectionError,
    CollectionRequest,
    collection_tasks,
    load_policy_model,
    resolve_policy,
)
from training.flywheel.replay import DIVERGED, ReplayDiverged, ReplayOutcome, ReplayPlan, ReplayPolicy, replay_outcome
from training.policy.learned import LearnedPolicy, PolicyModel, StepDecision
from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.checks import CheckOutcome
from warehouse.model import Action, Screen
from warehouse.purposes import EpisodePurpose, greedy_evaluation_filter
from warehouse.storage import git_revision
from warehouse.tables_training import STEP_ALTERNATIVES
from warehouse.trajectories import Trajectory, load_trajectories

ALTERNATIVES_VERSION = "step-alternatives-1"
ASSET_NAME = "step_alternatives"
TABLE = "step_alternatives"
#: Where states come from: the proposer's own rollouts and the expert rollouts (training data), and
#: the proposer's greedy evaluation episodes (held out: measured on, never trained on).
SOURCE_PURPOSES: tuple[str, ...] = (
    EpisodePurpose.POLICY_ROLLOUT.value,
    EpisodePurpose.EXPLORATION.value,
    EpisodePurpose.EVALUATION.value,
)
#: The proposer's evaluation episodes on its selection seeds (``eval:<policy>:selection:...``) as a
#: source of their own: held-out states (purpose ``evaluation``) in a dataset of their own, sampled
#: once, never on the held-out seeds guidance evaluates. Not a default source.
SELECTION_SOURCE = "selection"
SOURCES: tuple[str, ...] = (*SOURCE_PURPOSES, SELECTION_SOURCE)

Log = Callable[[str], None]
PoolFactory = Callable[[int], AbstractContextManager[EnvPool]]


class AlternativesError(CollectionError):
    """Alternatives that cannot be made: no such policy, no replayable episode, bad settings."""


@dataclass(frozen=True)
class AlternativesRequest:
    """One (proposing policy, family, round) of alternatives.

    ``policy`` names the proposer as a collection does (``sft``, ``rl-<source>``, a policy id);
    ``states_per_task`` states are sampled per task and source (:data:`SOURCES`); at each, the proposer's
    ``top_k`` candidates (and the recorded action, when it is not among them) are replayed, each
    followed by ``continuations`` continuations of at most ``horizon`` steps (0: the rest of the
    task's step budget) sampled at ``temperature``. ``recording_labels`` says where candidates are
    labelled from the recording instead (:mod:`training.flywheel.alternative_labels`): at states no
    replay reproduced (``diverged``), at every state without starting a browser (``always``), or
    never (such states are dropped)."""

    policy: str
    family: str
    round: int = 0
    states_per_task: int = 8
    top_k: int = 4
    continuations: int = 4
    horizon: int = 0
    temperature: float = 1.0
    sources: tuple[str, ...] = SOURCE_PURPOSES
    tasks: tuple[str, ...] = ()
    all_tasks: bool = False
    workers: int = 2
    recording_labels: RecordingLabels = "diverged"

    def __post_init__(self) -> None:
        problems = []
        if self.round < 0:
            problems.append(f"round must be 0 or more, got {self.round}")
        if self.states_per_task < 1:
            problems.append(f"states_per_task must be at least 1, got {self.states_per_task}")
        if self.top_k < 2:
            problems.append(f"top_k must be at least 2 (alternatives compare candidates), got {self.top_k}")
        if self.continuations < 0 or self.horizon < 0:
            problems.append("continuations and horizon must be 0 or more")
        if self.temperature <= 0:
            problems.append(f"temperature must be positive, got {self.temperature}")
        if self.workers < 1:
            problems.append(f"workers must be at least 1, got {self.workers}")
        if self.recording_labels not in RECORDING_LABELS:
            problems.append(f"recording_labels must be one of {list(RECORDING_LABELS)}, got {self.recording_labels!r}")
        unknown = sorted(set(self.sources) - set(SOURCES))
        if unknown or not self.sources:
            problems.append(f"sources must be among {list(SOURCES)}, got {list(self.sources)}")
        if problems:
            raise AlternativesError("; ".join(problems))


# ---------------------------------------------------------------------------------------------
# Which states
# ---------------------------------------------------------------------------------------------


def state_id(proposer_id: str, episode_id: str, step_idx: int) -> str:
    return f"{proposer_id}|{episode_id}|{step_idx}"


def replayable_episodes(
    warehouse: Warehouse, proposer_id: str, task_ids: Sequence[str], request: AlternativesRequest
) -> list[SourceEpisode]:
    """The episodes states may come from (see the module docstring), in episode order: the
    proposer's rollouts of ``request.round``, every expert rollout of the tasks, the proposer's
    evaluation episodes (for ``selection``: those on selection seeds, once more under that source);
    only live MiniWoB++ episodes with a seed."""
    rollout_ids = f"policy:{proposer_id}:%:r{request.round:02d}:%"
    purposes = [s for s in request.sources if s != SELECTION_SOURCE]
    if SELECTION_SOURCE in request.sources:
        purposes.append(EpisodePurpose.EVALUATION.value)
    rows = warehouse.query(
        "SELECT episode_id, task_id, seed, purpose, coalesce(policy_id, '') AS policy_id, n_steps FROM episodes "
        "WHERE env_backend = 'miniwob' AND seed IS NOT NULL AND n_steps > 0 AND list_contains(?, task_id) "
        "AND list_contains(?, purpose) AND ("
        "  (purpose = 'policy_rollout' AND policy_id = ? AND episode_id LIKE ?)"
        "  OR purpose = 'exploration'"
        f"  OR (purpose = 'evaluation' AND policy_id = ? AND {greedy_evaluation_filter('episode_id')})) "
        "ORDER BY episode_id",
        [list(task_ids), purposes, proposer_id, rollout_ids, f"eval:{proposer_id}"],
    ).to_pylist()
    episodes = [SourceEpisode(**r) for r in rows if r["purpose"] in request.sources]
    if SELECTION_SOURCE in request.sources:
        selection_ids = f"eval:{proposer_id}:{SELECTION_SOURCE}:"
        episodes += [
            SourceEpisode(**r, source=SELECTION_SOURCE) for r in rows if r["episode_id"].startswith(selection_ids)
        ]
    return episodes


def held_out_dataset(proposer_id: str, family: str, source: str = EpisodePurpose.EVALUATION.value) -> str:
    """The dataset of a proposer's held-out states in a family: written once, never replaced
    (``held-out``; ``selection`` for the states of the selection seeds' episodes)."""
    return f"{ASSET_NAME}/{proposer_id}/{family}/{'selection' if source == SELECTION_SOURCE else 'held-out'}"


def round_dataset(proposer_id: str, family: str, round_: int) -> str:
    """The dataset of a proposer's training states of a round in a family (a rerun replaces it)."""
    return f"{ASSET_NAME}/{proposer_id}/{family}/r{round_:02d}"


def taken_states(warehouse: Warehouse, proposer_id: str, round_: int) -> set[str]:
    """This proposer's training states labelled in other rounds: not sampled again."""
    rows = warehouse.query(
        "SELECT DISTINCT state_id FROM step_alternatives WHERE proposer_policy_id = ? AND round <> ? "
        "AND purpose <> 'evaluation'",
        [proposer_id, round_],
    )
    return set(rows.column(0).to_pylist())


def sources_to_sample(warehouse: Warehouse, proposer_id: str, request: AlternativesRequest) -> tuple[str, ...]:
    """The request's sources but the held-out ones already sampled for this proposer and family
    (each held-out set is sampled once); an error when nothing is left."""
    held_out_sources = (EpisodePurpose.EVALUATION.value, SELECTION_SOURCE)
    done = {
        s
        for s in held_out_sources
        if warehouse.current_version(TABLE, held_out_dataset(proposer_id, request.family, s))
    }
    sources = tuple(s for s in request.sources if s not in done)
    if not sources:
        raise AlternativesError(
            f"the held-out states of {proposer_id} in {request.family} exist already "
            f"({', '.join(sorted(done))}: they are sampled once)"
        )
    return sources


def held_out_states(warehouse: Warehouse, proposer_id: str) -> set[str]:
    """This proposer's held-out states already labelled (either held-out source): never drawn again."""
    rows = warehouse.query(
        "SELECT DISTINCT state_id FROM step_alternatives WHERE proposer_policy_id = ? AND purpose = 'evaluation'",
        [proposer_id],
    )
    return set(rows.column(0).to_pylist())


def sample_states(
    episodes: Sequence[SourceEpisode],
    per_task: int,
    *,
    proposer_id: str,
    round_: int,
    taken: Collection[str] = (),
) -> list[tuple[SourceEpisode, int]]:
    """Up to ``per_task`` states (episode, step) per task and source, uniformly over the steps of
    the episodes, seeded by (proposer, task, source, round); the held-out sources' samples ignore
    the round (each one fixed set). States in ``taken`` are left out, and a state both held-out
    sources drew is kept once, under ``evaluation``."""
    groups: dict[tuple[str, str], list[tuple[SourceEpisode, int]]] = defaultdict(list)
    for e in episodes:
        for t in range(e.n_steps):
            if state_id(proposer_id, e.episode_id, t) not in taken:
                groups[(e.task_id, e.sample_source)].append((e, t))
    chosen: list[tuple[SourceEpisode, int]] = []
    for (task_id, source), members in sorted(groups.items()):
        salt = {EpisodePurpose.EVALUATION.value: "held-out", SELECTION_SOURCE: "selection"}.get(source, f"r{round_}")
        rng = random.Random(f"{ASSET_NAME}|{proposer_id}|{task_id}|{source}|{salt}")
        picked = rng.sample(members, min(per_task, len(members)))
        chosen += sorted(picked, key=lambda s: (s[0].episode_id, s[1]))
    drawn_elsewhere = {(e.episode_id, t) for e, t in chosen if e.sample_source != SELECTION_SOURCE}
    return [
        (e, t) for e, t in chosen if e.sample_source != SELECTION_SOURCE or (e.episode_id, t) not in drawn_elsewhere
    ]


# ---------------------------------------------------------------------------------------------
# Which candidates, and the plan's step
# ---------------------------------------------------------------------------------------------


def propose(
    model: PolicyModel,
    context: EpisodeContext,
    screen: Screen,
    history: Sequence[Action],
    recorded: Action,
    top_k: int,
) -> list[CandidateAction]:
    """The proposer's ``top_k`` most probable candidates at the state (GuidNav's top-k), then the
    recorded action if it is not among them (so every state compares what happened with what the
    policy would rather do). Ties keep the policy's enumeration order."""
    with torch.inference_mode():
        candidates, instruction, past, rows = model.state_rows(screen, context, history, len(history))
        if not candidates:
            return [CandidateAction(0, recorded, None, None, True)]
        features = np.array([c.features for c in candidates], dtype=np.float32)
        logp = model.state_log_probs(StepDecision(instruction, past, rows, features, 0, 0.0))
    order = np.argsort(-logp.astype(np.float64), kind="stable")
    rank_of = {int(i): r for r, i in enumerate(order)}
    out = [
        CandidateAction(r, candidates[int(i)].action, r, float(logp[int(i)]), candidates[int(i)].action == recorded)
        for r, i in enumerate(order[:top_k])
    ]
    if not any(c.is_recorded for c in out):
        where = next((i for i, c in enumerate(candidates) if c.action == recorded), None)
        rank = rank_of.get(where) if where is not None else None
        logp_of = float(logp[where]) if where is not None else None
        out.append(CandidateAction(len(out), recorded, rank, logp_of, True))
    return out


def planned_action(
    context: EpisodeContext,
    screens: Sequence[Screen],
    actions: Sequence[Action],
    problems: Sequence[str | None],
    t: int,
) -> Action | None:
    """The task plan's next step at state t (the demonstrated action): the spec's solution,
    followed over the recorded prefix as the oracle follows it; None without a plan, or where the
    plan has nothing to do on this screen."""
    if not context.task.solution:
        return None
    try:
        tracker = PlanTracker(expand_solution(context.task, context.slots))
    except SolutionError:
        return None
    for j in range(t):
        tracker.advance(actions[j], screens[j], problems[j] is None)
    wanted, _ = tracker.expected(screens[t])
    return wanted


def states_to_label(
    model: PolicyModel,
    sampled: Sequence[tuple[SourceEpisode, int]],
    trajectories: Mapping[str, Trajectory],
    problems: Mapping[str, Sequence[str | None]],
    tasks: Mapping[str, CatalogTask],
    *,
    proposer_id: str,
    top_k: int,
) -> list[StateToLabel]:
    """Candidates and the plan's step at every sampled state (pure but for the policy's forward pass)."""
    out = []
    for episode, t in sampled:
        traj = trajectories[episode.episode_id]
        task = tasks[episode.task_id]
        context = EpisodeContext(
            task=task.spec,
            instruction=traj.instruction,
            slots=dict(traj.fields),
            seed=episode.seed,
            backend="miniwob",
            supported_actions=SUPPORTED_ACTIONS,
            max_steps=task.max_steps,
            episode_id=episode.episode_id,
        )
        screen = traj.screens[t]
        hits = milestone_hits(traj, task.spec) or ()  # replayed where recorded under another spec version
        candidates = propose(model, context, screen, traj.actions[:t], traj.actions[t], top_k)
        episode_problems = problems.get(episode.episode_id) or [None] * traj.n_steps
        out.append(
            StateToLabel(
                state_id=state_id(proposer_id, episode.episode_id, t),
                episode=episode,
                step_idx=t,
                family=task.family,
                instruction=traj.instruction,
                prefix=tuple(traj.actions[:t]),
                screens=tuple(traj.screens[: t + 1]),
                milestones_reached=sum(len(step_hits) for step_hits in hits[:t]),
                candidates=tuple(candidates),
                descriptions=tuple(describe_action(c.action, screen) for c in candidates),
                planned=planned_action(context, traj.screens, traj.actions, episode_problems, t),
                max_steps=task.max_steps,
                fields={str(k): str(v) for k, v in traj.fields.items() if v is not None},
                recorded_success=traj.success,
                recorded_milestones=tuple(hits[t]) if t < len(hits) else (),
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# Replays and their labels (pure)
# ---------------------------------------------------------------------------------------------


def replay_jobs(
    states: Sequence[StateToLabel], tasks: Mapping[str, CatalogTask], *, continuations: int, horizon: int
) -> tuple[list[EpisodeJob], dict[str, ReplayPlan], dict[str, tuple[str, int]]]:
    """The pool's jobs: per candidate, ``continuations`` replays that continue after it (one that
    stops at it when there is nothing to continue: m = 0, or no step budget left); the plans by
    job id, and which (state, candidate) each job serves. Jobs are grouped by task."""
    jobs: list[EpisodeJob] = []
    plans: dict[str, ReplayPlan] = {}
    serves: dict[str, tuple[str, int]] = {}
    for state in sorted(states, key=lambda s: (s.episode.task_id, s.state_id)):
        left = state.max_steps - state.step_idx - 1
        steps = min(horizon or left, left) if continuations else 0
        repeats = continuations if steps > 0 else 1
        task = tasks[state.episode.task_id]
        for c in state.candidates:
            plan = ReplayPlan(state.prefix, state.screens, c.action, steps, state.instruction, state.milestones_reached)
            for j in range(repeats):
                job_id = f"alt:{state.state_id}:{c.index}:{j}"
                jobs.append(plan.job(job_id, task.spec, state.episode.seed, task.family))
                plans[job_id] = plan
                serves[job_id] = (state.state_id, c.index)
    return jobs, plans, serves


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------


def run_alternatives(
    warehouse: Warehouse,
    request: AlternativesRequest,
    pool_factory: PoolFactory,
    *,
    run_id: str | None,
    partition_key: str | None,
    log: Log = print,
) -> dict[str, Any]:
    """Sample states, propose, replay, label and publish ``step_alternatives``: the held-out states
    as :func:`held_out_dataset` (once), the training states as :func:`round_dataset`. Everything is
    checked before any browser starts; a run with no labelled state publishes nothing."""
    started = time.perf_counter()
    policy_row = resolve_policy(warehouse, request.policy)
    proposer_id = policy_row["policy_id"]
    tasks = collection_tasks(
        CollectionRequest(request.policy, request.family, tasks=request.tasks, all_tasks=request.all_tasks),
        policy_row,
    )
    by_id = {t.task_id: t for t in tasks}
    model = load_policy_model(policy_row)
    model.scorer.eval()
    taken = taken_states(warehouse, proposer_id, request.round) | held_out_states(warehouse, proposer_id)
    sources = sources_to_sample(warehouse, proposer_id, request)
    episodes = [
        e for e in replayable_episodes(warehouse, proposer_id, list(by_id), request) if e.sample_source in sources
    ]
    sampled = sample_states(
        episodes, request.states_per_task, proposer_id=proposer_id, round_=request.round, taken=taken
    )
    if not sampled:
        raise AlternativesError(
            f"no replayable episode of {proposer_id} on {', '.join(by_id)} ({', '.join(sources) or 'no source'}): "
            "collect policy_rollouts (and evaluate the policy) first"
        )
    ids = sorted({e.episode_id for e, _ in sampled})
    trajectories = {t.episode_id: t for t in load_trajectories(warehouse, "list_contains(?, e.episode_id)", [ids])}
    states = states_to_label(
        model,
        sampled,
        trajectories,
        _step_problems(warehouse, ids),
        by_id,
        proposer_id=proposer_id,
        top_k=request.top_k,
    )
    log(f"{len(states)} states of {len(ids)} episodes ({dict(Counter(e.purpose for e, _ in sampled))})")
    to_replay = [] if request.recording_labels == "always" else states
    outcomes, summary = _replay(pool_factory, request, model, proposer_id, to_replay, by_id, log)
    summary.states_sampled = len(states)
    reproduced = {state_id for state_id, _ in outcomes}
    if request.recording_labels == "never":
        replayed, from_recording = to_replay, []  # alternative_rows counts the unreproduced as dropped
    else:
        replayed = [st for st in to_replay if st.state_id in reproduced]
        from_recording = [st for st in states if st.state_id not in reproduced]
    rows = alternative_rows(
        replayed, outcomes, proposer_id=proposer_id, round_=request.round, run_id=run_id, summary=summary
    )
    rows += recording_rows(
        from_recording, proposer_id=proposer_id, round_=request.round, run_id=run_id, summary=summary
    )
    summary.seconds = time.perf_counter() - started
    if not rows and (summary.replays_lost or not summary.replays_diverged):
        raise AlternativesError(
            f"no replay reproduced any of the {len(states)} states ({summary.replays_diverged} diverged, "
            f"{summary.replays_lost} lost): nothing published"
        )
    if not rows:  # every replay diverged: the page does not repeat (a property of the task, not an error)
        log(
            f"no replay reproduced any of the {len(states)} states: all {summary.replays_diverged} diverged "
            f"({dict(summary.diverged_by_task)}; docs/reproducibility.md lists the tasks that do not repeat); "
            "nothing to label, the replays_reproduce_states check says which tasks"
        )
    selection_states = {st.state_id for st in states if st.episode.sample_source == SELECTION_SOURCE}
    materialization = _publish(
        warehouse, request, sources, policy_row, rows, summary, run_id, partition_key, tasks, selection_states
    )
    log(
        f"{summary.states_labelled} states labelled ({summary.states_dropped} dropped), "
        f"{summary.replays_diverged} of {summary.replays} replays diverged; "
        f"{summary.states_from_recording} states labelled from the recording ({dict(summary.from_recording_by_task)})"
    )
    return {"policy_id": proposer_id, "materialization_id": materialization, **summary.to_json()}


def _replay(
    pool_factory: PoolFactory,
    request: AlternativesRequest,
    model: PolicyModel,
    proposer_id: str,
    states: Sequence[StateToLabel],
    by_id: Mapping[str, CatalogTask],
    log: Log,
) -> tuple[dict[tuple[str, int], list[ReplayOutcome]], AlternativesSummary]:
    """Replay every candidate of ``states`` on the pool (no browser starts when there is none) and
    collect each (state, candidate)'s outcomes; diverged and lost replays are counted."""
    jobs, plans, serves = replay_jobs(states, by_id, continuations=request.continuations, horizon=request.horizon)
    log(
        f"{len(states)} states to replay, {sum(len(s.candidates) for s in states)} candidates, {len(jobs)} replays; "
        f"proposer {proposer_id}"
    )
    summary = AlternativesSummary(replays=len(jobs))
    outcomes: dict[tuple[str, int], list[ReplayOutcome]] = defaultdict(list)
    if not jobs:
        return outcomes, summary
    continuation = LearnedPolicy(model, policy_id=f"continue:{proposer_id}", temperature=request.temperature)
    with pool_factory(request.workers) as pool:
        result = pool.run(jobs, ReplayPolicy(plans, continuation), on_episode=ProgressLog(log, ASSET_NAME))
    task_of = {job.episode_id: job.task.task_id for job in jobs}
    for record in result.episodes:
        try:
            outcome = replay_outcome(record)
        except ReplayDiverged:
            summary.replays_diverged += 1
            summary.diverged_by_task[record.task_id] += 1
            continue
        outcomes[serves[record.episode_id]].append(outcome)
        summary.replay_ms.append(outcome.replay_ms)
        summary.live_step_ms += outcome.live_step_ms
    for job, reason in result.lost:
        if reason.startswith(DIVERGED):
            summary.replays_diverged += 1
            summary.diverged_by_task[task_of[job.episode_id]] += 1
        else:
            summary.replays_lost += 1
    return outcomes, summary


def _step_problems(warehouse: Warehouse, episode_ids: Sequence[str]) -> dict[str, list[str | None]]:
    """Each episode's failed-step reasons by step (None: carried out)."""
    rows = warehouse.query(
        "SELECT episode_id, list(problem ORDER BY step_idx) AS problems FROM steps "
        "WHERE list_contains(?, episode_id) GROUP BY episode_id",
        [list(episode_ids)],
    ).to_pylist()
    return {r["episode_id"]: list(r["problems"]) for r in rows}


def _publish(
    warehouse: Warehouse,
    request: AlternativesRequest,
    sources: Sequence[str],
    policy_row: dict[str, Any],
    rows: list[dict[str, Any]],
    summary: AlternativesSummary,
    run_id: str | None,
    partition_key: str | None,
    tasks: Sequence[CatalogTask],
    selection_states: Collection[str] = (),
) -> str:
    proposer_id = policy_row["policy_id"]
    m = Materialization(
        asset=ASSET_NAME,
        run_id=run_id,
        partition_key=partition_key,
        code_version=f"{ALTERNATIVES_VERSION}+{git_revision()}",
        parameters={
            "policy": request.policy,
            "policy_id": proposer_id,
            "family": request.family,
            "round": request.round,
            "tasks": [t.task_id for t in tasks],
            "states_per_task": request.states_per_task,
            "top_k": request.top_k,
            "continuations": request.continuations,
            "horizon": request.horizon,
            "temperature": request.temperature,
            "sources": list(request.sources),
            "recording_labels": request.recording_labels,
            "summary": summary.to_json(),
        },
        inputs=[
            *warehouse.current_inputs(["episodes", "steps"]),
            LineageInput(
                kind="asset",
                input_asset="policy_sft" if policy_row["kind"] == "sft" else "rl_run",
                path=policy_row["checkpoint_path"],
                version=proposer_id,
            ),
        ],
    )
    # Held-out states in a dataset of their own per held-out source, written once; training states
    # in the round's (replaced by a rerun of the round, even by an empty one).
    evaluation = EpisodePurpose.EVALUATION.value
    training = [r for r in rows if r["purpose"] != evaluation]
    outputs = []
    for source in (evaluation, SELECTION_SOURCE):
        held_out = [
            r
            for r in rows
            if r["purpose"] == evaluation and (r["state_id"] in selection_states) == (source != evaluation)
        ]
        if held_out:
            table = pa.Table.from_pylist(held_out, schema=STEP_ALTERNATIVES)
            dataset = held_out_dataset(proposer_id, request.family, source)
            outputs.append(warehouse.stage_table(TABLE, dataset, table, m))
    if any(s not in (evaluation, SELECTION_SOURCE) for s in sources):
        table = pa.Table.from_pylist(training, schema=STEP_ALTERNATIVES)
        outputs.append(
            warehouse.stage_table(TABLE, round_dataset(proposer_id, request.family, request.round), table, m)
        )
    warehouse.publish(m, outputs)
    return m.materialization_id


#: A run whose replays diverge more often than this is flagged (warn): its tasks may not repeat.
MAX_DIVERGED_SHARE = 0.1


def check_alternatives_run(warehouse: Warehouse, run_id: str) -> dict[str, CheckOutcome]:
    """Checks of the rows a run wrote: labels in range (Monte-Carlo values in [0, 1], successes
    within continuations; rows written unless every replay diverged); the replays reproduced their
    states (warn above :data:`MAX_DIVERGED_SHARE` diverged: the figures say which tasks)."""
    rows = (
        warehouse.query(
            "SELECT count(*) AS n, count(*) FILTER (WHERE mc_value < 0 OR mc_value > 1 "
            "OR continuation_successes > continuations OR continuations < 0) AS bad, "
            "count(DISTINCT state_id) AS states FROM step_alternatives WHERE run_id = ?",
            [run_id],
        ).to_pylist()[0]
        if warehouse.has_table("step_alternatives")  # not yet, where the first run's replays all diverged
        else {"n": 0, "bad": 0, "states": 0}
    )
    summaries = warehouse.query(
        "SELECT parameters->'summary' AS s FROM lineage_materializations WHERE asset = ? AND run_id = ?",
        [ASSET_NAME, run_id],
    ).to_pylist()
    summary = json.loads(summaries[0]["s"]) if summaries and summaries[0]["s"] else {}
    replays = int(summary.get("replays") or 0)
    diverged = int(summary.get("replays_diverged") or 0)
    share = diverged / replays if replays else 0.0
    return {
        # no rows is right only where every replay diverged (then the next check flags the tasks)
        "labels_in_range": CheckOutcome(
            (rows["n"] > 0 or 0 < replays == diverged) and rows["bad"] == 0,
            {"alternatives": rows["n"], "states": rows["states"], "out_of_range": rows["bad"]},
        ),
        "replays_reproduce_states": CheckOutcome(
            share <= MAX_DIVERGED_SHARE,
            {
                "replays": replays,
                "diverged": diverged,
                "diverged_share": round(share, 4),
                "diverged_by_task": summary.get("diverged_by_task", {}),
                "states_dropped": summary.get("states_dropped"),
                "states_from_recording": summary.get("states_from_recording"),
            },
        ),
    }
