"""The task catalog: which tasks rollouts run, grouped into families (the rollout partitions).

Every catalog task has a spec (``envs/task_specs/<backend>/<task>.yaml``, format in
``envs.tasks``) with milestones; MiniWoB++ tasks here are multi-step ones. A task is *available*
when its spec file exists, and *runnable by the scripted expert* when its spec has a
``solution`` (``envs.policies``); the random walk runs any available task.

MiniWoB++ families (``MINIWOB_FAMILIES``) are fixed here, so the rollout asset's partitions are
stable. Android families come from the specs' ``family`` field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from envs.tasks import TaskSpec, load_task_specs

SPEC_ROOT = Path(__file__).resolve().parent / "task_specs"
MINIWOB_SPEC_DIR = SPEC_ROOT / "miniwob"
ANDROID_SPEC_DIR = SPEC_ROOT / "android"

# Multi-step MiniWoB++ tasks by family. Tasks whose spec file does not exist (yet) are left out
# at load time; the families themselves (the partition keys) never change.
MINIWOB_FAMILIES: Mapping[str, tuple[str, ...]] = {
    "miniwob-forms": (
        "login-user",
        "login-user-popup",
        "enter-password",
        "enter-text",
        "enter-text-dynamic",
        "enter-date",
        "use-spinner",
        "choose-date-easy",
        "use-autocomplete",
        "use-autocomplete-nodelay",
        "choose-list",
        "form-sequence-2",
        "multi-orderings",
        "multi-layouts",
        "guess-number",
    ),
    "miniwob-choice": (
        "click-button-sequence",
        "click-option",
        "click-checkboxes",
        "click-checkboxes-soft",
        "click-checkboxes-large",
        "click-checkboxes-transfer",
        "click-dialog-2",
        "click-shades",
    ),
    "miniwob-navigation": (
        "click-collapsible",
        "click-collapsible-2-nodelay",
        "click-tab-2",
        "click-tab-2-medium",
        "click-tab-2-hard",
        "navigate-tree",
    ),
    "miniwob-apps": (
        "email-inbox-forward",
        "email-inbox-forward-nl",
        "email-inbox-reply",
        "email-inbox-delete",
        "email-inbox-important",
        "email-inbox-nl-turk",
        "social-media",
        "search-engine",
        "book-flight-nodelay",
    ),
}
DEFAULT_MAX_STEPS = 12


@dataclass(frozen=True)
class CatalogTask:
    task_id: str
    family: str
    backend: str
    spec: TaskSpec
    max_steps: int

    @property
    def has_solution(self) -> bool:
        return bool(self.spec.solution)


def default_max_steps(spec: TaskSpec) -> int:
    """The step budget of a task: the spec's ``max_steps``, else twice its solution plus slack."""
    explicit = spec.extra.get("max_steps")
    if explicit is not None:
        return int(explicit)
    if spec.solution:
        return max(DEFAULT_MAX_STEPS, 2 * len(spec.solution) + 4)
    return DEFAULT_MAX_STEPS


@lru_cache(maxsize=8)
def _load(folder: str) -> dict[str, TaskSpec]:
    path = Path(folder)
    return load_task_specs(path) if path.is_dir() else {}


def miniwob_family_of(task_id: str) -> str | None:
    for family, tasks in MINIWOB_FAMILIES.items():
        if task_id in tasks:
            return family
    return None


def load_catalog(
    backend: str = "miniwob", spec_dir: Path | str | None = None, *, fresh: bool = False
) -> dict[str, CatalogTask]:
    """The available catalog tasks of a backend, keyed by task id, in family order.

    MiniWoB++: the tasks of ``MINIWOB_FAMILIES`` whose spec exists. Android: every spec under
    ``task_specs/android`` (its family from the spec). ``fresh`` re-reads the spec files.
    """
    folder = (
        Path(spec_dir) if spec_dir is not None else (MINIWOB_SPEC_DIR if backend == "miniwob" else ANDROID_SPEC_DIR)
    )
    if fresh:
        _load.cache_clear()
    specs = _load(str(folder.resolve()))
    catalog: dict[str, CatalogTask] = {}
    if backend == "miniwob":
        for family, task_ids in MINIWOB_FAMILIES.items():
            for task_id in task_ids:
                spec = specs.get(task_id)
                if spec is not None and spec.backend == "miniwob":
                    catalog[task_id] = CatalogTask(task_id, family, "miniwob", spec, default_max_steps(spec))
        return catalog
    for task_id, spec in sorted(specs.items(), key=lambda item: (item[1].family, item[0])):
        if spec.backend == backend:
            catalog[task_id] = CatalogTask(task_id, spec.family, backend, spec, default_max_steps(spec))
    return catalog


def families(backend: str = "miniwob") -> list[str]:
    """The families of a backend: the rollout asset's partition keys for its family dimension."""
    if backend == "miniwob":
        return list(MINIWOB_FAMILIES)
    return sorted({task.family for task in load_catalog(backend).values()}) or [f"{backend}-default"]


def tasks_of_family(family: str, catalog: Mapping[str, CatalogTask], only: Iterable[str] = ()) -> list[CatalogTask]:
    """The family's catalog tasks, restricted to ``only`` when given (unknown ids raise)."""
    wanted = list(only)
    unknown = [t for t in wanted if t not in catalog]
    if unknown:
        raise KeyError(f"not in the catalog (no spec, or another backend): {unknown}; available: {sorted(catalog)}")
    tasks = [task for task in catalog.values() if task.family == family]
    if wanted:
        tasks = [task for task in tasks if task.task_id in wanted]
    return tasks
