"""``AndroidEnv``: an app on an Android device or emulator, behind the environment protocol.

A task spec for Android names the app (``app:``, the package) and its milestones, predicates over
the view hierarchy (``envs.tasks``); optional extras::

    goals: ["Add 3 and 4 with the calculator", ...]   # concrete instructions, one drawn per seed
    activity: .MainActivity                            # launch activity (default: the launcher's)
    clear_data: true                                   # `pm clear` the app before each episode
    max_steps: 12

reset(task, seed): force-stop the app (clearing its data if asked), start it, wait for it to be in
front, and read the screen. step(action): carry out the uiautomator2 calls of
``envs.android.actions``, wait ``settle_s`` for the UI, read the screen, check milestones.
Success is reaching the spec's last milestone (an Android app reports no task reward); the step
that does so ends the episode with reward 1. ANSWER ends the episode too, a failure (reward -1,
MiniWoB++'s convention) unless the milestones are complete.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envs.android.actions import SUPPORTED_ACTIONS, to_device_calls
from envs.android.device import AndroidDevice, ReplayDevice, connect
from envs.android.hierarchy import parse_hierarchy
from envs.protocol import InvalidAction, MilestoneTracker, Observation, StepResult
from envs.tasks import TaskSpec, TaskSpecError
from warehouse.model import Action, ActionType, Screen

BACKEND = "android"


def _uses_episode_success(predicate: Any) -> bool:
    if isinstance(predicate, Mapping):
        return "episode_success" in predicate or any(_uses_episode_success(v) for v in predicate.values())
    if isinstance(predicate, list):
        return any(_uses_episode_success(v) for v in predicate)
    return False


def instruction_for(task: TaskSpec, seed: int) -> str:
    """The episode's instruction: one of the spec's ``goals`` (drawn by seed), or its ``goal``."""
    goals = task.extra.get("goals") or ([task.extra["goal"]] if task.extra.get("goal") else [])
    if not goals:
        raise TaskSpecError(f"task {task.task_id}: an Android spec needs 'goals' (concrete instructions) or 'goal'")
    return str(random.Random(f"{task.task_id}|{seed}").choice(list(goals)))


def check_android_spec(task: TaskSpec) -> None:
    """Raise TaskSpecError when a spec cannot run on Android (no app, or success it cannot observe)."""
    if not task.app:
        raise TaskSpecError(f"task {task.task_id}: an Android spec needs 'app' (the package to start)")
    if any(_uses_episode_success(m.when) for m in task.milestones):
        raise TaskSpecError(
            f"task {task.task_id}: 'episode_success' cannot be used on Android (success is the last milestone)"
        )


@dataclass(frozen=True)
class AndroidConfig:
    """How to reach a device; picklable, so a pool worker process can connect by itself.

    ``serial``: an adb serial or "IP:port" (None: $ANDROID_SERIAL, else the only device).
    ``replay``: a recording (``envs.android.device``) to play back instead of a device.
    """

    serial: str | None = None
    settle_s: float = 0.6  # wait after an action before reading the screen
    wait_s: float = 1.0  # what NOTHING waits
    launch_timeout_s: float = 15.0
    replay: str | None = None
    replay_strict: bool = True

    def create(self) -> AndroidEnv:
        if self.replay:
            device: AndroidDevice = ReplayDevice.from_file(self.replay, strict=self.replay_strict)
        else:
            device = connect(self.serial)
        return AndroidEnv(device, self)


class AndroidEnv:
    backend = BACKEND
    supported_actions = SUPPORTED_ACTIONS

    def __init__(self, device: AndroidDevice, config: AndroidConfig | None = None) -> None:
        self.device = device
        self.config = config or AndroidConfig()
        self._window: tuple[int, int] | None = None
        self._screen: Screen | None = None
        self._tracker: MilestoneTracker | None = None
        self._done = True

    def reset(self, task: TaskSpec, seed: int) -> Observation:
        if task.backend != BACKEND:
            raise TaskSpecError(f"task {task.task_id} is for backend {task.backend!r}, not {BACKEND!r}")
        check_android_spec(task)
        instruction = instruction_for(task, seed)
        self._tracker = MilestoneTracker(task, instruction)  # raises when the goal does not fit the template
        device, app = self.device, str(task.app)
        if self._window is None:
            width, height = device.window_size()
            self._window = (int(width), int(height))
        device.app_stop(app)
        if task.extra.get("clear_data"):
            device.app_clear(app)
        device.app_start(app, task.extra.get("activity"))
        if not device.app_wait(app, timeout=self.config.launch_timeout_s, front=True):
            raise TaskSpecError(f"task {task.task_id}: app {app} did not come to the front")
        time.sleep(self.config.settle_s)
        self._screen = self._read_screen()
        self._done = False
        return Observation(self._screen, instruction, task.task_id, {}, {"seed": int(seed), "app": app})

    def step(self, action: Action) -> StepResult:
        if self._screen is None or self._tracker is None:
            raise RuntimeError("step() before reset()")
        if self._done:
            return StepResult(self._screen, done=True, problem="the episode has already ended")
        problem = None
        try:
            calls = to_device_calls(action, self._screen, self._window or (1080, 2400))
        except InvalidAction as exc:
            calls, problem = [], str(exc)
        for call in calls:
            call.apply(self.device)
        if action.type is ActionType.NOTHING:
            time.sleep(self.config.wait_s)
        elif calls:
            time.sleep(self.config.settle_s)
        screen = self._read_screen()
        started = time.perf_counter()
        hit = self._tracker.update(screen, None if problem else action)
        milestone_ms = (time.perf_counter() - started) * 1000
        success = self._tracker.complete
        done = success or (action.type is ActionType.ANSWER and problem is None)
        reward = (1.0 if success else -1.0) if done else 0.0
        self._screen, self._done = screen, done
        return StepResult(screen, reward, hit, done, success, problem, {"milestone_ms": milestone_ms})

    def close(self) -> None:
        closer = getattr(self.device, "close", None)
        if callable(closer):
            closer()

    def healthy(self) -> bool:
        """Ask the device for its info (uiautomator2's deviceInfo round trip; not part of a recording)."""
        try:
            return bool(self.device.info)
        except Exception:  # noqa: BLE001 - any failure means the device is not usable
            return False

    def _read_screen(self) -> Screen:
        return parse_hierarchy(self.device.dump_hierarchy())
