r"""Exploration policies that run on CPU, behind the interface learned policies will implement.

A ``Policy`` is a factory of per-episode actors::

    actor = policy.start(context)          # EpisodeContext: task spec, instruction, slots, seed, backend
    action = actor.act(screen)             # one canonical Action for the current screen
    actor.observe(action, step_result)     # what the action did (reward, milestones, failed step)

``start`` may be called from several threads at once (one per pool worker); an actor serves one
episode in one thread. Actors draw randomness from ``episode_rng(policy_id, task_id, seed)``, so a
retried episode replays the same actions. Two families here (register others with
``register_policy``; the RL stage adds learned ones). Both are portable (``envs.protocol.PortablePolicy``):
on the pool's Ray backend they travel to the nodes and run whole episodes there:

* ``random_walk``: ProgRM App. B's exploration by random walk: at every step a uniformly chosen
  action type on a uniformly chosen element (click anything clickable, type words of the
  instruction into an editable field, scroll, go back, wait).
* ``noisy_expert`` / ``expert``: a scripted expert following the task spec's ``solution``, which
  with probability ``noise`` per step wanders instead (a wrong click, a scroll, back, a wait, text
  typed into the wrong field), sometimes forgets a solution step (``skip``) or mistypes
  (``typo``): rollouts then hold a realistic mix of successes, failures and hollow steps.

Solution format (``solution:`` in a task spec, a list of steps, slots ``{name}`` rendered from the
instruction)::

    - {action: CLICK, target: SELECTOR}                   # first matching element on the screen
    - {action: INPUT, target: SELECTOR, text: "{username}"}
    - {action: SCROLL, direction: DOWN, target: SELECTOR}  # target optional
    - {action: PRESS_KEY, text: Enter}
    - {action: GOBACK} / {action: NOTHING} / {action: OPEN_APP, text: com.example}
    - {action: CLICK, target: {text: "{item}"}, for_each: {slot: words, split: ","}}
    - {action: CLICK, target: {element_id: close}, optional: true}   # skipped when not on the screen
    - {action: CLICK, target: {text: "{item}"}, for_each: {slot: words}, when: {unchecked: {...}}}

SELECTOR is the task-spec selector (``envs.tasks``: role, text, text_contains, element_id,
classes_contains, description). Among the matches, ``nth: k`` picks the k-th (0-based; negative:
from the end), ``ordinal: "{n}"`` the n-th (1-based, may name a slot: "Check the 2nd box");
``after: SELECTOR`` keeps only matches that come after (in document order) the first element
matching it: "the textbox after the label Genre", "the share button after @annis"; ``before:
SELECTOR`` keeps only those before it (with ``nth: -1``, the nearest: a textbox whose label
follows it).
``for_each`` repeats the step for each item of a slot split by ``split`` (default ","), bound to
``{item}``; ``repeat: "{n}"`` repeats it n times (the absolute value; 0 times when the slot is
absent: ``(?:-(?P<down>\d+)|(?P<up>\d+))`` then picks one of two steps); ``when`` (a task-spec
predicate over the current screen) makes the step conditional;
``optional`` skips it when its target is absent; ``if_slot: name`` / ``unless_slot: name`` keep it
only when the instruction gave (did not give) that slot. When a required target is absent the expert waits
(pages animate) up to ``patience`` steps, then moves on.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.protocol import Actor, EpisodeContext, Policy, PolicySnapshot, StatelessSnapshot, StepResult
from envs.spec_evaluation import element_matches, evaluate
from envs.tasks import TaskSpec
from warehouse.model import Action, ActionType, Screen, UIElement

_SLOT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def episode_rng(policy_id: str, task_id: str, seed: int) -> random.Random:
    """The actor's random source: fixed by (policy, task, seed), so retries replay the same episode."""
    return random.Random(f"{policy_id}|{task_id}|{seed}")


# -- shared helpers --------------------------------------------------------------------------

_NON_TARGETS = frozenset({"body"})


def clickable_elements(screen: Screen) -> list[UIElement]:
    """Elements a click could reasonably aim at: flagged clickable, or leaves that show something
    (web pages make spans and divs clickable: links in text, e-mail rows, icons), with an area.
    A leaf named only by its id counts: icons and cells carry nothing else (the forward form's
    send icon, ``span#send-forward``; tic-tac-toe's ``span#ttt-4``), and without them a task
    whose last click is such an icon cannot be done, nor its demonstrations learned."""
    parents = {e.parent_ref for e in screen.elements}
    return [
        e
        for e in screen.elements
        if e.area > 0
        and e.role not in _NON_TARGETS
        and (e.clickable or (e.ref not in parents and (e.text or e.classes or e.description or e.element_id)))
    ]


def editable_elements(screen: Screen) -> list[UIElement]:
    return [e for e in screen.elements if e.editable and e.area > 0]


def instruction_words(instruction: str) -> list[str]:
    """Quoted phrases first, then the words of the instruction: what a random walk types."""
    quoted = re.findall(r'"([^"]+)"', instruction)
    words = [w.strip(string.punctuation) for w in instruction.split()]
    return quoted + [w for w in words if w]


def _wander(
    rng: random.Random,
    screen: Screen,
    context: EpisodeContext,
    weights: Mapping[ActionType, float],
    avoid: UIElement | None = None,
) -> Action:
    """One exploratory action, its type drawn from ``weights`` (restricted to what the backend supports)."""
    candidates: list[tuple[ActionType, float]] = []
    clickables = [e for e in clickable_elements(screen) if avoid is None or e.ref != avoid.ref]
    editables = editable_elements(screen)
    for kind, weight in weights.items():
        if weight <= 0 or kind not in context.supported_actions:
            continue
        if kind in (ActionType.CLICK, ActionType.LONG_CLICK) and not clickables:
            continue
        if kind is ActionType.INPUT and not editables:
            continue
        candidates.append((kind, weight))
    if not candidates:
        return Action(ActionType.NOTHING)
    kind = rng.choices([k for k, _ in candidates], weights=[w for _, w in candidates])[0]
    if kind in (ActionType.CLICK, ActionType.LONG_CLICK):
        return Action(kind, target=rng.choice(clickables))
    if kind is ActionType.INPUT:
        words = instruction_words(context.instruction) or ["text"]
        return Action(kind, target=rng.choice(editables), text=rng.choice(words))
    if kind is ActionType.SCROLL:
        return Action(kind, direction=rng.choice(("UP", "DOWN")))
    if kind is ActionType.PRESS_KEY:
        return Action(kind, text=rng.choice(("Enter", "Tab", "Backspace")))
    return Action(kind)


# -- random walk -----------------------------------------------------------------------------

RANDOM_WALK_WEIGHTS: dict[ActionType, float] = {
    ActionType.CLICK: 0.5,
    ActionType.INPUT: 0.2,
    ActionType.SCROLL: 0.1,
    ActionType.GOBACK: 0.05,
    ActionType.NOTHING: 0.1,
    ActionType.PRESS_KEY: 0.05,
}


@dataclass(frozen=True)
class RandomWalkPolicy:
    """ProgRM App. B: explore by a random walk over the action space of the current screen."""

    weights: Mapping[ActionType, float] = field(default_factory=lambda: dict(RANDOM_WALK_WEIGHTS))

    @property
    def policy_id(self) -> str:
        return "random_walk"

    def start(self, context: EpisodeContext) -> Actor:
        return _RandomWalker(context, episode_rng(self.policy_id, context.task.task_id, context.seed), self.weights)

    def portable(self) -> PolicySnapshot:
        """Itself (``envs.protocol.PortablePolicy``): no weights, no state between episodes."""
        return StatelessSnapshot(self)

    def absorb(self, episode_id: str, output: Any) -> None:
        """Nothing comes back from an episode run elsewhere."""


class _RandomWalker:
    def __init__(self, context: EpisodeContext, rng: random.Random, weights: Mapping[ActionType, float]) -> None:
        self.context, self.rng, self.weights = context, rng, weights

    def act(self, screen: Screen) -> Action:
        return _wander(self.rng, screen, self.context, self.weights)

    def observe(self, action: Action, result: StepResult) -> None:
        pass


# -- scripted noisy expert -------------------------------------------------------------------

WANDER_WEIGHTS: dict[ActionType, float] = {
    ActionType.CLICK: 0.4,  # a wrong click
    ActionType.SCROLL: 0.2,
    ActionType.NOTHING: 0.2,  # a wait
    ActionType.INPUT: 0.1,  # text into the wrong field
    ActionType.GOBACK: 0.1,
}


class SolutionError(ValueError):
    """A spec's ``solution`` is malformed; the message names the task and the step."""


@dataclass(frozen=True)
class PlanStep:
    """One solution step with its slots rendered (``for_each`` already expanded)."""

    action: ActionType
    target: Mapping[str, Any] | None = None
    nth: int = 0
    after: Mapping[str, Any] | None = None
    before: Mapping[str, Any] | None = None
    text: str | None = None
    direction: str | None = None
    optional: bool = False
    when: Mapping[str, Any] | None = None
    slots: Mapping[str, str] = field(default_factory=dict)


def render(value: Any, slots: Mapping[str, str]) -> str:
    return _SLOT.sub(lambda m: str(slots.get(m.group(1), m.group(0))), str(value))


def expand_solution(spec: TaskSpec, slots: Mapping[str, str]) -> list[PlanStep]:
    """The spec's ``solution`` as concrete steps for one instruction (``for_each`` unrolled)."""
    plan: list[PlanStep] = []
    for i, raw in enumerate(spec.solution):
        where = f"task {spec.task_id}: solution[{i}]"
        if not isinstance(raw, Mapping) or "action" not in raw:
            raise SolutionError(f"{where} needs an 'action'")
        try:
            kind = ActionType(str(raw["action"]).upper())
        except ValueError:
            raise SolutionError(f"{where}: unknown action {raw['action']!r}") from None
        if raw.get("if_slot") is not None and not slots.get(str(raw["if_slot"])):
            continue
        if raw.get("unless_slot") is not None and slots.get(str(raw["unless_slot"])):
            continue
        items: list[str | None] = [None]
        loop = raw.get("for_each")
        if loop is not None:
            if not isinstance(loop, Mapping) or "slot" not in loop:
                raise SolutionError(f"{where}: for_each needs a 'slot'")
            separator = str(loop.get("split", ","))
            value = slots.get(str(loop["slot"]), "")
            items = [part.strip() for part in value.split(separator) if part.strip()]
        repeats = 1
        if raw.get("repeat") is not None:
            count = render(raw["repeat"], slots)
            if _SLOT.search(count):  # names an absent slot: the step does not apply
                repeats = 0
            else:
                try:
                    repeats = abs(int(count))
                except ValueError:
                    raise SolutionError(f"{where}: repeat {count!r} is not a whole number") from None
        for item in items * repeats:
            bound = dict(slots) if item is None else {**slots, "item": item}
            target = raw.get("target")
            nth = int(raw.get("nth", 0))
            if raw.get("ordinal") is not None:
                ordinal = render(raw["ordinal"], bound)
                digits = re.match(r"\s*(\d+)", ordinal)
                if digits is None or int(digits.group(1)) < 1:
                    raise SolutionError(f"{where}: ordinal {ordinal!r} is not a positive number")
                nth = int(digits.group(1)) - 1
            plan.append(
                PlanStep(
                    action=kind,
                    target=None if target is None else dict(target),
                    nth=nth,
                    after=raw.get("after"),
                    before=raw.get("before"),
                    text=None if raw.get("text") is None else render(raw["text"], bound),
                    direction=None if raw.get("direction") is None else str(raw["direction"]).upper(),
                    optional=bool(raw.get("optional", False)),
                    when=raw.get("when"),
                    slots=bound,
                )
            )
    return plan


def find_target(screen: Screen, step: PlanStep) -> UIElement | None:
    """The element a plan step aims at: the ``nth`` element matching its selector, if any."""
    if step.target is None:
        return None
    elements: Sequence[UIElement] = screen.elements
    if step.after is not None:
        anchor = next((i for i, e in enumerate(elements) if element_matches(e, step.after, step.slots)), None)
        if anchor is None:
            return None
        elements = elements[anchor + 1 :]
    if step.before is not None:
        anchor = next((i for i, e in enumerate(elements) if element_matches(e, step.before, step.slots)), None)
        if anchor is None:
            return None
        elements = elements[:anchor]
    matches = [e for e in elements if element_matches(e, step.target, step.slots)]
    if not matches:
        return None
    if "text" in step.target:
        # Selectors compare text case-insensitively; a page may hold "eget" and "Eget" as two
        # different links. The expert takes the exact spelling only.
        matches = [e for e in matches if _exact_text(e, step.target, step.slots)]
        if not matches:
            return None
    try:
        return matches[step.nth]
    except IndexError:
        return None


def _exact_text(element: UIElement, selector: Mapping[str, Any], slots: Mapping[str, str]) -> bool:
    return "text" not in selector or element.text == " ".join(render(selector["text"], slots).split())


def condition_holds(predicate: Mapping[str, Any], slots: Mapping[str, str], screen: Screen) -> bool:
    """A step's ``when`` on the current screen, reading ``visible`` text case-sensitively.

    ``envs.tasks`` compares text case-insensitively (right for labels), but a page may hold the
    links "eget" and "Eget" as different targets; the expert reads the exact spelling.
    """
    ((kind, arg),) = predicate.items()
    if kind == "all":
        return all(condition_holds(p, slots, screen) for p in arg)
    if kind == "any":
        return any(condition_holds(p, slots, screen) for p in arg)
    if kind == "not":
        return not condition_holds(arg, slots, screen)
    if kind == "visible" and "text" in arg:
        return evaluate(predicate, slots, screen, None) and any(
            element_matches(e, arg, slots) and _exact_text(e, arg, slots) for e in screen.elements
        )
    return evaluate(predicate, slots, screen, None)


def plan_action(step: PlanStep, target: UIElement | None) -> Action:
    direction = step.direction if step.action is ActionType.SCROLL else None
    return Action(step.action, target=target, text=step.text, direction=direction)


def typo(text: str, rng: random.Random) -> str:
    """The text with one human-like slip: a dropped, doubled or swapped character."""
    if len(text) < 2:
        return text + rng.choice(string.ascii_lowercase)
    i = rng.randrange(len(text) - 1)
    slip = rng.choice(("drop", "double", "swap"))
    if slip == "drop":
        return text[:i] + text[i + 1 :]
    if slip == "double":
        return text[: i + 1] + text[i] + text[i + 1 :]
    return text[:i] + text[i + 1] + text[i] + text[i + 2 :]


@dataclass(frozen=True)
class NoisyExpertPolicy:
    """A scripted expert for the catalog's tasks (the spec's ``solution``) that makes human-like mistakes.

    ``noise``: probability that a step wanders instead of following the solution (the solution
    step is kept for later); ``skip``: probability that a solution step is forgotten; ``typo``:
    probability that typed text carries a slip; ``patience``: waits for an absent target.
    """

    noise: float = 0.2
    skip: float = 0.03
    typo: float = 0.05
    patience: int = 3
    wander_weights: Mapping[ActionType, float] = field(default_factory=lambda: dict(WANDER_WEIGHTS))

    @property
    def policy_id(self) -> str:
        if self.noise == 0 and self.skip == 0 and self.typo == 0:
            return "expert"
        return f"noisy_expert(noise={self.noise:g},skip={self.skip:g},typo={self.typo:g})"

    def supports(self, task: TaskSpec) -> bool:
        """The expert needs the task's solution."""
        return bool(task.solution)

    def start(self, context: EpisodeContext) -> Actor:
        if not context.task.solution:
            raise SolutionError(f"task {context.task.task_id} has no solution: the scripted expert cannot run it")
        plan = expand_solution(context.task, context.slots)
        return _Expert(self, context, plan, episode_rng(self.policy_id, context.task.task_id, context.seed))

    def portable(self) -> PolicySnapshot:
        """Itself (``envs.protocol.PortablePolicy``): no weights, no state between episodes."""
        return StatelessSnapshot(self)

    def absorb(self, episode_id: str, output: Any) -> None:
        """Nothing comes back from an episode run elsewhere."""


class _Expert:
    def __init__(self, policy: NoisyExpertPolicy, context: EpisodeContext, plan: list[PlanStep], rng: random.Random):
        self.policy, self.context, self.plan, self.rng = policy, context, plan, rng
        # Which steps this episode's expert will forget, decided once: a slip, not a per-look coin.
        self.forgotten = {i for i in range(len(plan)) if policy.skip and rng.random() < policy.skip}
        self.pointer = 0
        self.waited = 0

    def act(self, screen: Screen) -> Action:
        policy, rng = self.policy, self.rng
        # Pass over forgotten steps and steps whose condition does not hold on this screen.
        while self.pointer < len(self.plan):
            step = self.plan[self.pointer]
            if self.pointer in self.forgotten or (
                step.when is not None and not condition_holds(step.when, step.slots, screen)
            ):
                self.pointer += 1
                continue
            break
        next_target = None
        if self.pointer < len(self.plan):
            next_target = find_target(screen, self.plan[self.pointer])
        if self.pointer >= len(self.plan) or (policy.noise and rng.random() < policy.noise):
            # Off the script: after the plan (the page wants more than the spec says) or by noise.
            return _wander(rng, screen, self.context, policy.wander_weights, avoid=next_target)
        step = self.plan[self.pointer]
        if step.target is not None and next_target is None:
            if step.optional:
                self.pointer += 1
                return self.act(screen)
            if self.waited < policy.patience:
                self.waited += 1
                return Action(ActionType.NOTHING)
            self.pointer += 1  # give up on this step; the episode will likely fail
            self.waited = 0
            return self.act(screen)
        self.pointer += 1
        self.waited = 0
        action = plan_action(step, next_target)
        if action.type is ActionType.INPUT and action.text and policy.typo and rng.random() < policy.typo:
            action = Action(ActionType.INPUT, target=action.target, text=typo(action.text, rng))
        return action

    def observe(self, action: Action, result: StepResult) -> None:
        pass


# -- where an episode is in the plan ---------------------------------------------------------


def same_action(a: Action, b: Action) -> bool:
    """Whether two actions do the same thing: type, target element, text, direction. A click on an
    element or on the element that directly wraps it is the same click (a checkbox and its
    ``<label>``: the task specs' ``labelled`` selector treats them alike)."""
    if a.type is not b.type:
        return False
    if (a.target is None) != (b.target is None):
        return False
    if a.target is not None and b.target is not None and a.target.ref != b.target.ref:
        wrapped = a.target.parent_ref == b.target.ref or b.target.parent_ref == a.target.ref
        if a.type is not ActionType.CLICK or not wrapped:
            return False
    if a.type in (ActionType.INPUT, ActionType.PRESS_KEY, ActionType.ANSWER):
        return (a.text or "").strip() == (b.text or "").strip()
    if a.type is ActionType.SCROLL:
        return (a.direction or "").upper() == (b.direction or "").upper()
    return True


def _ticked(screen: Screen, target: UIElement) -> bool:
    """Whether a click target is a ticked checkbox, or a label wrapping one."""
    if target.role == "checkbox":
        return target.checked is True
    return any(e.parent_ref == target.ref and e.role == "checkbox" and e.checked is True for e in screen.elements)


class PlanTracker:
    """The spec's plan for one episode and where the episode is in it (the expert's pointer,
    without its noise or patience): which action the plan wants next on a screen. A planned click
    on a box that is already ticked is passed over (the plan ticks boxes; the policy may have
    ticked them in another order)."""

    def __init__(self, plan: Sequence[PlanStep]) -> None:
        self.plan = list(plan)
        self.pointer = 0

    def expected(self, screen: Screen) -> tuple[Action | None, int]:
        """(the planned action on ``screen``, its index in the plan); None when the plan is done or
        its next target is not on the screen. Steps whose condition fails here, and optional
        steps whose target is absent, are passed over."""
        i = self.pointer
        while i < len(self.plan):
            step = self.plan[i]
            if step.when is not None and not condition_holds(step.when, step.slots, screen):
                i += 1
                continue
            target = find_target(screen, step) if step.target is not None else None
            if step.action is ActionType.CLICK and target is not None and _ticked(screen, target):
                i += 1  # a box the plan would tick is ticked already (clicking it would untick it)
                continue
            if step.target is not None and target is None:
                if step.optional:
                    i += 1
                    continue
                return None, i
            return plan_action(step, target), i
        return None, i

    def advance(self, executed: Action, screen: Screen, ok: bool) -> None:
        """After ``executed`` was carried out on ``screen``: past the planned step it did."""
        action, index = self.expected(screen)
        if ok and action is not None and same_action(executed, action):
            self.pointer = index + 1


# -- registry --------------------------------------------------------------------------------

PolicyFactory = Callable[..., Policy]
_REGISTRY: dict[str, PolicyFactory] = {
    "random_walk": lambda **params: RandomWalkPolicy(**params),
    "noisy_expert": lambda **params: NoisyExpertPolicy(**params),
    "expert": lambda **params: NoisyExpertPolicy(noise=0.0, skip=0.0, typo=0.0, **params),
}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make a policy available by name (rollout configs pick policies by name)."""
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def make_policy(name: str, **params: Any) -> Policy:
    """A registered policy by name, with its parameters (e.g. ``make_policy("noisy_expert", noise=0.3)``)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {policy_names()})") from None
    return factory(**params)


@dataclass(frozen=True)
class ScriptedPolicy:
    """Replays a fixed list of actions built from each screen (tests, demonstrations of a bug)."""

    steps: Sequence[Callable[[Screen, EpisodeContext], Action]]
    policy_id: str = "scripted"

    def start(self, context: EpisodeContext) -> Actor:
        return _Scripted(self.steps, context)


class _Scripted:
    def __init__(self, steps: Sequence[Callable[[Screen, EpisodeContext], Action]], context: EpisodeContext):
        self.steps, self.context, self.index = list(steps), context, 0

    def act(self, screen: Screen) -> Action:
        if self.index >= len(self.steps):
            return Action(ActionType.NOTHING)
        builder = self.steps[self.index]
        self.index += 1
        return builder(screen, self.context)

    def observe(self, action: Action, result: StepResult) -> None:
        pass
