"""One protocol for every GUI environment, and the loop that runs an episode through it.

An environment (MiniWoB++ in Chromium: ``envs.miniwob.live``; Android through uiautomator2:
``envs.android``) does four things::

    reset(task, seed) -> Observation      # the first screen, and the episode's instruction
    step(action)      -> StepResult       # screen after, env reward, milestones hit, done, success
    close()
    healthy()         -> bool             # a cheap liveness probe, for the worker pool

Screens and actions are the canonical ones of ``warehouse.model`` so every backend's trajectories
look alike in the warehouse. Milestones are the task spec's (``envs.tasks``), checked by the
environment on every screen after an action, with exactly the semantics of
``envs.spec_evaluation.track_milestones`` (ProgRM §2.2: environment-milestone progress labels).

An action the environment cannot carry out (a target that is not on the screen, text into an
element that is not editable, an action type the backend lacks) is not an error: the step is
recorded as a *failed step* with ``problem`` set, the environment is left as it was, and the
episode goes on. Exceptions are kept for a broken environment (a crashed browser, a lost device),
which the worker pool (``envs.pool``) answers by replacing the worker and retrying the episode.

``run_episode`` drives a policy (``envs.policies``) through an environment and returns an
``EpisodeRecord``; ``episode_tables`` turns records into rows of the warehouse's ``episodes`` and
``steps`` tables.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from envs.spec_evaluation import evaluate
from envs.tasks import TaskSpec, TaskSpecError
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.purposes import EpisodePurpose
from warehouse.schema import EPISODES, STEPS, append_step, element_records
from warehouse.trajectories import ROLLOUT_SOURCE

# Why an episode ended (EpisodeRecord.end_reason).
END_SUCCESS = "success"  # the environment reported success
END_FAILURE = "failure"  # the environment ended the episode without success (wrong answer, its own timer)
END_MAX_STEPS = "max_steps"  # our step budget ran out first (truncated; outcome reward 0)


@dataclass(frozen=True, slots=True)
class Observation:
    """What ``reset`` returns: the first screen and the instruction the environment generated.

    ``fields`` are slot values the benchmark itself states (MiniWoB++'s utterance fields, e.g.
    ``by`` and ``to`` of a natural-language e-mail task); they fill the slots a spec's instruction
    template does not capture (specs whose instructions vary too much for one template).
    """

    screen: Screen
    instruction: str
    task_id: str
    fields: Mapping[str, str] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What ``step`` returns.

    ``env_reward`` is the environment's own reward for this step: MiniWoB++'s raw reward
    (1 success, -1 failure, partial credit in between) at the step that ends the episode, 0 before;
    so the rewards of an episode sum to its outcome reward. ``milestones_hit`` are the task spec's
    milestones first reached at this step, in order. ``problem`` is set when the action could not be
    carried out (a failed step): nothing was done to the environment.
    """

    screen: Screen
    env_reward: float = 0.0
    milestones_hit: tuple[str, ...] = ()
    done: bool = False
    success: bool = False
    problem: str | None = None
    info: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """A GUI environment behind the canonical screens and actions (see the module docstring)."""

    backend: str
    supported_actions: frozenset[ActionType]

    def reset(self, task: TaskSpec, seed: int) -> Observation: ...

    def step(self, action: Action) -> StepResult: ...

    def close(self) -> None: ...

    def healthy(self) -> bool: ...


# -- the agent side: a policy starts an actor per episode -----------------------------------


@dataclass(frozen=True)
class EpisodeContext:
    """Everything a policy may know when an episode starts."""

    task: TaskSpec
    instruction: str
    slots: Mapping[str, str]
    seed: int
    backend: str
    supported_actions: frozenset[ActionType]
    max_steps: int
    episode_id: str = ""  # the id the episode will have in the warehouse (learned policies key records by it)


class Actor(Protocol):
    def act(self, screen: Screen) -> Action: ...

    def observe(self, action: Action, result: StepResult) -> None: ...


class Policy(Protocol):
    @property
    def policy_id(self) -> str: ...

    def start(self, context: EpisodeContext) -> Actor: ...


# -- policies that act away from the driver ---------------------------------------------------


class NodePolicy(Policy, Protocol):
    """A policy rebuilt from a :class:`PolicySnapshot` where the environment runs (a Ray node).

    It runs episodes there as any policy does; what the driver needs of an episode besides its
    record (a learned policy's decisions) it hands over once the episode ended, and forgets."""

    def episode_output(self, episode_id: str) -> Any:
        """The side data of the episode ``episode_id`` (picklable; None when there is none),
        removed from the policy: asked once per finished attempt."""
        ...


class PolicySnapshot(Protocol):
    """A policy's picklable state: weights and settings, no caches, no locks. Shipped to the nodes
    once per batch (``envs.ray_pool``: Ray's object store), rebuilt there once per worker and snapshot."""

    def rebuild(self) -> NodePolicy: ...


@runtime_checkable
class PortablePolicy(Policy, Protocol):
    """A policy whose episodes can run away from the driver, next to their environment.

    ``portable()`` is taken once per batch; a node rebuilds the policy from it and runs whole
    episodes (``run_episode``) against its local environment; each finished episode's record and
    its side data (``NodePolicy.episode_output``) come back, and the driver absorbs the side data
    (``absorb``), so that after the batch the driver's policy holds what it would have held had it run the
    episodes itself. An episode must act alike in both places: randomness keyed by the episode,
    not by a process's history. Policies that do not implement this run in the driver, one round
    trip to the environment per step."""

    def portable(self) -> PolicySnapshot: ...

    def absorb(self, episode_id: str, output: Any) -> None:
        """Take in what ``episode_output`` gave for a finished episode (called once per episode
        returned, from the pool's threads)."""
        ...


@dataclass(frozen=True)
class StatelessSnapshot:
    """The snapshot of a policy that has no weights to ship, keeps no state between episodes and
    leaves no side data (the scripted policies of ``envs.policies``): the policy itself travels,
    so it must pickle."""

    policy: Policy

    def rebuild(self) -> NodePolicy:
        return _WithoutSideData(self.policy)


@dataclass(frozen=True)
class _WithoutSideData:
    """A policy with nothing to hand back after an episode."""

    policy: Policy

    @property
    def policy_id(self) -> str:
        return self.policy.policy_id

    def start(self, context: EpisodeContext) -> Actor:
        return self.policy.start(context)

    def episode_output(self, episode_id: str) -> None:
        return None


class InvalidAction(ValueError):
    """Raised inside a backend when an action cannot be mapped to the screen; becomes ``StepResult.problem``."""


class EnvironmentFailure(RuntimeError):
    """The environment itself is broken (browser gone, device lost): the pool retries elsewhere."""


# -- targets ---------------------------------------------------------------------------------


def resolve_target(screen: Screen, target: UIElement | None) -> UIElement:
    """The element of ``screen`` that an action's target designates, or ``InvalidAction``.

    Refs are the backend's handles within one episode (a DOM ref, an Android hierarchy path); a ref
    whose element now has another role or id is a different element, so it does not count.
    """
    if target is None:
        raise InvalidAction("the action needs a target element")
    element = screen.by_ref(target.ref)
    if element is None:
        raise InvalidAction(f"target not on the screen: {target.describe()} (ref {target.ref})")
    if element.role != target.role or element.element_id != target.element_id:
        raise InvalidAction(
            f"target not on the screen: ref {target.ref} is now {element.describe()}, not {target.describe()}"
        )
    return element


# -- milestones ------------------------------------------------------------------------------


def episode_slots(spec: TaskSpec, instruction: str, fields: Mapping[str, str] | None = None) -> dict[str, str]:
    """The slot values of one episode (``TaskSpec.slots``: the template's groups over the fields).

    Raises TaskSpecError when the instruction fits neither, so a mislabelled episode is never
    scored silently (as ``envs.spec_evaluation.track_milestones`` does).
    """
    slots = spec.slots(instruction, fields)
    if slots is None:
        raise TaskSpecError(f"task {spec.task_id}: instruction does not fit the spec's template: {instruction!r}")
    return slots


class MilestoneTracker:
    """Incremental ``envs.spec_evaluation.track_milestones``: one ``update`` per step, same semantics.

    A milestone is reached at the first step where its predicate holds over (screen after the step,
    the step's action) and every earlier milestone has been reached; several may be reached at one
    step. ``episode_success`` sees the outcome at the episode's last step only. A failed step is
    evaluated with no action (it clicked nothing, typed nothing).
    """

    def __init__(self, spec: TaskSpec, instruction: str, fields: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        self.slots: dict[str, str] = episode_slots(spec, instruction, fields)
        self.reached = 0

    @property
    def complete(self) -> bool:
        return self.reached == len(self.spec.milestones)

    def update(
        self, screen_after: Screen | None, action: Action | None, *, success_at_end: bool = False
    ) -> tuple[str, ...]:
        """Milestones first reached at this step. ``success_at_end``: the episode ends here, successfully."""
        milestones = self.spec.milestones
        hit: list[str] = []
        while self.reached < len(milestones) and evaluate(
            milestones[self.reached].when, self.slots, screen_after, action, success_at_end
        ):
            hit.append(milestones[self.reached].name)
            self.reached += 1
        return tuple(hit)


# -- starting from a recorded state ------------------------------------------------------------


def screen_signature(screen: Screen) -> str:
    """A screen's identity for replays: every element's ref with its text line (role, id, text,
    value, flags: ``Screen.to_text``). Refs matter: recorded actions name their targets by ref;
    bounds do not (the warehouse keeps them as float32)."""
    lines = screen.to_text().split("\n") if screen.elements else []
    body = "\n".join(f"{e.ref}\t{line}" for e, line in zip(screen.elements, lines, strict=True))
    return hashlib.sha256(body.encode()).hexdigest()[:20]


#: How every message of a state that was not reproduced starts.
NOT_REPRODUCED = "replay diverged"


class StateNotReproduced(RuntimeError):
    """Replaying a recorded prefix did not give the recorded state (another screen, an early end):
    the episode cannot start there. Not a broken environment: retrying would give the same."""


@dataclass(frozen=True)
class StartState:
    """The state before action t of a recorded episode, to be reached again: the recorded actions
    a_0..a_{t-1}, the screens o_0..o_t they were taken on (o_t: the state itself), and how many of
    the task spec's milestones the prefix reached (the tracker resumes there)."""

    actions: tuple[Action, ...]
    screens: tuple[Screen, ...]
    milestones_reached: int = 0

    def __post_init__(self) -> None:
        if len(self.screens) != len(self.actions) + 1:
            raise ValueError(f"a start after {len(self.actions)} actions needs {len(self.actions) + 1} screens")

    @property
    def step(self) -> int:
        return len(self.actions)


def restore_by_steps(env: Environment, task: TaskSpec, seed: int, start: StartState) -> Observation:
    """Reach ``start`` with the protocol alone: reset with the recorded seed, then carry the
    recorded actions out one step at a time, every screen checked against the recorded one.
    Raises :class:`StateNotReproduced` at the first difference."""
    observation = env.reset(task, seed)
    screen = observation.screen
    for j, action in enumerate(start.actions):
        if screen_signature(screen) != screen_signature(start.screens[j]):
            raise StateNotReproduced(
                f"{NOT_REPRODUCED}: screen {j} is not the recorded one (state at step {start.step})"
            )
        result = env.step(action)
        if result.done:
            raise StateNotReproduced(f"{NOT_REPRODUCED}: the episode ended at step {j}, before step {start.step}")
        screen = result.screen
    if screen_signature(screen) != screen_signature(start.screens[-1]):
        raise StateNotReproduced(f"{NOT_REPRODUCED}: screen {start.step} is not the recorded one (the state itself)")
    return Observation(screen, observation.instruction, observation.task_id, observation.fields, observation.info)


def restore(env: Environment, task: TaskSpec, seed: int, start: StartState) -> Observation:
    """Reach ``start`` in ``env``: its own faster ``restore`` where it has one (MiniWoB++), else
    :func:`restore_by_steps`. Either way the state reached is the recorded one, or
    :class:`StateNotReproduced`."""
    own = getattr(env, "restore", None)
    return own(task, seed, start) if callable(own) else restore_by_steps(env, task, seed, start)


# -- episodes --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step as the warehouse stores it: the screen *before* the action, the action, what it did."""

    step_idx: int
    screen: Screen
    action: Action
    env_reward: float
    milestones_hit: tuple[str, ...]
    done: bool
    time_ms: int  # when the action was issued, since the episode started (after reset)
    latency_ms: float  # how long the environment took to carry it out and observe the result
    problem: str | None = None
    milestone_ms: float | None = None  # time spent checking milestones, where the backend measured it


@dataclass(frozen=True, slots=True)
class EpisodeRecord:
    episode_id: str
    task_id: str
    family: str
    instruction: str
    seed: int
    policy_id: str
    backend: str
    steps: tuple[StepRecord, ...]
    final_screen: Screen  # the screen after the last action (episodes.final_screen)
    fields: Mapping[str, str]  # the benchmark's own slot values, where it states them
    slots: Mapping[str, str]  # the instruction's slot values (template groups, then fields)
    success: bool
    outcome_reward: float
    decayed_reward: float | None
    end_reason: str
    milestones_reached: int
    n_milestones: int
    reset_ms: float
    duration_ms: int
    created_at: datetime
    attempt: int = 0
    worker_id: str | None = None
    spec_digest: str | None = None  # the TaskSpec.milestone_digest of the spec that recorded milestones_hit

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def failed_steps(self) -> int:
        return sum(s.problem is not None for s in self.steps)


@dataclass(frozen=True, slots=True)
class _EpisodeStart:
    """What starting an episode gave: the first observation, its slots, the actor, and the clocks."""

    observation: Observation
    slots: dict[str, str]
    actor: Actor
    created_at: datetime
    reset_ms: float
    t0: float  # perf_counter() right after reset: step times and the duration count from here


def _start_episode(
    env: Environment,
    policy: Policy,
    task: TaskSpec,
    seed: int,
    *,
    episode_id: str,
    max_steps: int,
    start: StartState | None = None,
) -> _EpisodeStart:
    """Reset ``env`` on ``task`` with ``seed`` (or restore the recorded ``start``; timed) and start
    the policy's actor on it."""
    created_at = datetime.now(UTC)
    t_reset = time.perf_counter()
    observation = env.reset(task, seed) if start is None else restore(env, task, seed, start)
    t0 = time.perf_counter()
    reset_ms = (t0 - t_reset) * 1000.0
    slots = episode_slots(task, observation.instruction, observation.fields)
    actor = policy.start(
        EpisodeContext(
            task=task,
            instruction=observation.instruction,
            slots=slots,
            seed=seed,
            backend=env.backend,
            supported_actions=env.supported_actions,
            max_steps=max_steps,
            episode_id=episode_id,
        )
    )
    return _EpisodeStart(observation, slots, actor, created_at, reset_ms, t0)


def _take_step(
    env: Environment, actor: Actor, screen: Screen, idx: int, *, max_steps: int, t0: float
) -> tuple[StepRecord, StepResult]:
    """Let the actor act on ``screen``, carry the action out (timed), record it, and show the actor the result."""
    action = actor.act(screen)
    issued = time.perf_counter()
    result = env.step(action)
    latency_ms = (time.perf_counter() - issued) * 1000.0
    # The last step is done either way: the environment ended the episode or the budget ran out.
    ends = result.done or idx == max_steps - 1
    step = StepRecord(
        step_idx=idx,
        screen=screen,
        action=action,
        env_reward=float(result.env_reward),
        milestones_hit=tuple(result.milestones_hit),
        done=ends,
        time_ms=int((issued - t0) * 1000),
        latency_ms=latency_ms,
        problem=result.problem,
        milestone_ms=result.info.get("milestone_ms"),
    )
    actor.observe(action, result)
    return step, result


def _run_steps(
    env: Environment, start: _EpisodeStart, *, max_steps: int, before_step: Callable[[int], None] | None
) -> tuple[list[StepRecord], StepResult, int]:
    """Step until the episode ends or ``max_steps`` actions were taken: (steps, last result, milestones reached)."""
    screen = start.observation.screen
    steps: list[StepRecord] = []
    result: StepResult | None = None
    reached = 0
    for idx in range(max_steps):
        if before_step is not None:
            before_step(idx)
        step, result = _take_step(env, start.actor, screen, idx, max_steps=max_steps, t0=start.t0)
        reached += len(result.milestones_hit)
        steps.append(step)
        screen = result.screen
        if result.done:
            break
    assert result is not None  # max_steps >= 1: at least one step was taken
    return steps, result, reached


def _episode_end(steps: Sequence[StepRecord], last: StepResult) -> tuple[str, float, float | None]:
    """(end reason, outcome reward, decayed reward) of an episode whose last step gave ``last``."""
    if last.done:
        end_reason = END_SUCCESS if last.success else END_FAILURE
        decayed = last.info.get("decayed_reward")
        return end_reason, float(sum(s.env_reward for s in steps)), None if decayed is None else float(decayed)
    # Truncated by our step budget: the episode failed, and earns no outcome reward.
    return END_MAX_STEPS, 0.0, None


def run_episode(
    env: Environment,
    policy: Policy,
    task: TaskSpec,
    seed: int,
    *,
    episode_id: str,
    max_steps: int,
    family: str | None = None,
    before_step: Callable[[int], None] | None = None,
    attempt: int = 0,
    worker_id: str | None = None,
    start: StartState | None = None,
) -> EpisodeRecord:
    """Reset ``env`` on ``task`` with ``seed``, let ``policy`` act until the episode ends or
    ``max_steps`` actions were taken, and return the whole trajectory.

    The environment's own end (success or failure) wins; running out of steps ends the episode as
    a failure with outcome reward 0 (``end_reason = "max_steps"``). The last step is marked done
    either way, as in the recorded demonstrations. ``before_step(i)`` runs before action ``i``
    (progress, fault injection). Exceptions from the environment propagate: the caller (the pool)
    decides whether to retry; nothing partial is returned.

    With ``start`` the episode begins at a recorded state (:class:`StartState`, reached by
    :func:`restore`; ``reset_ms`` then counts reaching it) and its steps are those after it.
    """

    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    begun = _start_episode(env, policy, task, seed, episode_id=episode_id, max_steps=max_steps, start=start)
    steps, result, reached = _run_steps(env, begun, max_steps=max_steps, before_step=before_step)
    end_reason, outcome, decayed = _episode_end(steps, result)
    return EpisodeRecord(
        episode_id=episode_id,
        task_id=task.task_id,
        family=family or task.family,
        instruction=begun.observation.instruction,
        seed=seed,
        policy_id=policy.policy_id,
        backend=env.backend,
        steps=tuple(steps),
        final_screen=result.screen,
        fields=dict(begun.observation.fields),
        slots=dict(begun.slots),
        success=bool(result.done and result.success),
        outcome_reward=outcome,
        decayed_reward=decayed,
        end_reason=end_reason,
        milestones_reached=reached,
        n_milestones=len(task.milestones),
        reset_ms=begun.reset_ms,
        duration_ms=int((time.perf_counter() - begun.t0) * 1000),
        created_at=begun.created_at,
        attempt=attempt,
        worker_id=worker_id,
        spec_digest=task.milestone_digest,
    )


# -- warehouse rows --------------------------------------------------------------------------


def episode_tables(
    records: Sequence[EpisodeRecord], *, run_id: str | None = None, purpose: EpisodePurpose
) -> tuple[pa.Table, pa.Table]:
    """Rollout episodes -> (episodes, steps) Arrow tables in the warehouse's schemas.

    ``purpose`` says what the episodes may be used for (``warehouse.purposes``): the caller that
    made them knows, and must say (an evaluation episode written as training data would leak).

    ``steps.env_reward`` is the environment's reward at the step, ``steps.milestones_hit`` the
    task-spec milestones first reached there (an empty list when none: never null for rollouts),
    ``steps.problem`` why a failed step's action could not be carried out.
    """
    episodes: dict[str, list] = {name: [] for name in EPISODES.names}
    steps: dict[str, list] = {name: [] for name in STEPS.names}
    for record in records:
        row = {
            "task_fields": json.dumps(dict(record.slots), ensure_ascii=False, sort_keys=True),
            "episode_id": record.episode_id,
            "task_id": record.task_id,
            "task_family": record.family,
            "instruction": record.instruction,
            "source": ROLLOUT_SOURCE,
            "purpose": EpisodePurpose(purpose).value,
            "parent_episode_id": None,
            "policy_id": record.policy_id,
            "env_backend": record.backend,
            "seed": record.seed,
            "success": record.success,
            "outcome_reward": record.outcome_reward,
            "decayed_reward": record.decayed_reward,
            "n_steps": record.n_steps,
            "duration_ms": record.duration_ms,
            "source_file": None,
            "source_sha256": None,
            "import_root": None,
            "created_at": record.created_at,
            "run_id": run_id,
            "final_screen": element_records(record.final_screen),
            "spec_digest": record.spec_digest,
        }
        for name in episodes:  # columns added to the schema later stay null here
            episodes[name].append(row.get(name))
        for step in record.steps:
            append_step(
                steps,
                record.episode_id,
                step.step_idx,
                step.action,
                step.screen,
                env_reward=step.env_reward,
                milestones_hit=list(step.milestones_hit),
                done=step.done,
                time_ms=step.time_ms,
                problem=step.problem,
            )
        width = max((len(v) for v in steps.values()), default=0)
        for column in steps.values():  # columns added to the schema later stay null here
            column.extend([None] * (width - len(column)))
    return pa.Table.from_pydict(episodes, schema=EPISODES), pa.Table.from_pydict(steps, schema=STEPS)


def milestone_track_matches(record: EpisodeRecord, spec: TaskSpec) -> bool:
    """Do the milestones recorded online equal ``envs.spec_evaluation.track_milestones`` over the trajectory?

    The offline tracker sees (screen after each step, the step's action), failed steps with no
    action, and the episode's outcome: the online tracker and the offline one must agree.
    """
    from envs.spec_evaluation import track_milestones

    pairs: list[tuple[Screen | None, Action | None]] = []
    for i, step in enumerate(record.steps):
        after = record.steps[i + 1].screen if i + 1 < len(record.steps) else record.final_screen
        pairs.append((after, None if step.problem is not None else step.action))
    offline = track_milestones(spec, record.instruction, pairs, success=record.success, fields=record.fields)
    return offline.hits == tuple(s.milestones_hit for s in record.steps)
