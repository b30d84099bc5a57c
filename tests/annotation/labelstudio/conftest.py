"""Fixtures for the Label Studio tests: ONE real server per test session, small warehouses built by hand.

The server is the project's own (``LocalLabelStudio``), started once under a session folder on a
free port and stopped when the session ends (also if a test restarted it). Tests that talk to it
use their own project namespace, so their projects never collide.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from annotation.labelstudio.secrets import API_KEY_ENV, URL_ENV, Credentials
from annotation.labelstudio.server import LocalLabelStudio, free_port
from warehouse.catalog import Materialization, Warehouse
from warehouse.model import Screen, UIElement
from warehouse.schema import EPISODES, PROGRESS_LABELS, STEPS, element_records
from warehouse.tables_training import RM_PREDICTIONS


@pytest.fixture(autouse=True)
def _no_user_label_studio(monkeypatch):
    """Tests use the project's own server unless they set the variables themselves."""
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.delenv(API_KEY_ENV, raising=False)


@pytest.fixture(scope="session")
def ls_home(tmp_path_factory) -> Path:
    """The session's STEPWISE_HOME: Label Studio's data under ls_home/labelstudio."""
    return tmp_path_factory.mktemp("ls-session") / "stepwise"


@pytest.fixture(scope="session")
def ls_server(ls_home) -> Iterator[LocalLabelStudio]:
    """The one real Label Studio server of the session (first start runs migrations: about a minute)."""
    for name in (URL_ENV, API_KEY_ENV):
        os.environ.pop(name, None)
    server = LocalLabelStudio(ls_home, port=free_port())
    try:
        server.credentials(progress=lambda message: print(f"[label-studio] {message}", flush=True))
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def ls_credentials(ls_server) -> Credentials:
    return ls_server.credentials()


@pytest.fixture
def namespace() -> str:
    """A project-title prefix of this test's own."""
    return f"T{uuid.uuid4().hex[:8]}"


@pytest.fixture
def ls_resource(ls_server, ls_home, namespace):
    from assets.resources import LabelStudioResource

    return LabelStudioResource(home=str(ls_home), autostart=False, project_namespace=namespace)


# -- a small warehouse ---------------------------------------------------------------------------

TASKS = {
    "login-user": 'Enter the username "{u}" and the password "pw{u}" into the text fields and press login.',
    "click-button": 'Click on the "{u}" button.',
    "enter-text": 'Enter "{u}" into the text field and press Submit.',
}


def _screen(task: str, step: int, word: str) -> tuple[Screen, str]:
    elements = [
        UIElement(ref="1", role="body", bounds=(0, 0, 160, 210)),
        UIElement(
            ref="2",
            role="div",
            element_id="query",
            text=TASKS[task].format(u=word),
            bounds=(0, 0, 160, 50),
            parent_ref="1",
            depth=1,
        ),
        UIElement(ref="3", role="div", element_id="area", bounds=(0, 50, 160, 210), parent_ref="1", depth=1),
        UIElement(
            ref="4",
            role="textbox",
            element_id="username",
            bounds=(5, 60, 150, 80),
            clickable=True,
            editable=True,
            value=word if step > 1 else "",
            parent_ref="3",
            depth=2,
        ),
        UIElement(
            ref="5",
            role="password",
            element_id="password",
            bounds=(5, 90, 150, 110),
            clickable=True,
            editable=True,
            parent_ref="3",
            depth=2,
        ),
        UIElement(
            ref="6",
            role="button",
            element_id="subbtn",
            text="Login <b>now</b>",
            bounds=(5, 120, 80, 145),
            clickable=True,
            parent_ref="3",
            depth=2,
        ),
    ]
    target = ["4", "4", "5", "6"][step % 4]
    return Screen(tuple(elements)), target


# A 1x1 PNG, for steps with a screenshot.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c6360f8cf"
    "c0f01f0005000201a3e0b8e30000000049454e44ae426082"
)


def build_small_warehouse(
    home: Path,
    *,
    episodes_per_stratum: int = 3,
    with_predictions: bool = True,
    screenshots: bool = False,
    source: str = "human_demo",
) -> Warehouse:
    """3 tasks x (success, failure) x ``episodes_per_stratum`` episodes of 4 steps, with LCS and env labels
    (they disagree on login-user) and a progress model's ``rm_predictions``; optionally a screenshot file per step.

    The episodes are of ``source``; called again on the same home with another source, it adds that
    source's episodes (their own ids and datasets) to the warehouse."""
    warehouse = Warehouse(home)
    prefix, dataset = ("test", "test") if source == "human_demo" else (source, source.replace(":", "-"))
    episodes, steps, labels, predictions = [], [], [], []
    for task in TASKS:
        for success in (True, False):
            for k in range(episodes_per_stratum):
                word = f"{task[:3]}{k}{'s' if success else 'f'}"
                episode_id = f"{prefix}:{task}:{word}"
                episodes.append(
                    {name: None for name in EPISODES.names}
                    | {
                        "episode_id": episode_id,
                        "task_id": task,
                        "task_family": "miniwob",
                        "instruction": TASKS[task].format(u=word),
                        "source": source,
                        "success": success,
                        "n_steps": 4,
                        "outcome_reward": 1.0 if success else -1.0,
                    }
                )
                for step in range(4):
                    screen, target = _screen(task, step, word)
                    action_type, text = [("CLICK", None), ("INPUT", word), ("CLICK", None), ("CLICK", None)][step]
                    target_element = screen.by_ref(target)
                    steps.append(
                        {name: None for name in STEPS.names}
                        | {
                            "episode_id": episode_id,
                            "step_idx": step,
                            "action_type": action_type,
                            "action_text": f"{action_type}({target_element.role}#{target_element.element_id}"
                            + (f', "{text}")' if text else ")"),
                            "target_ref": target,
                            "target_role": target_element.role,
                            "target_element_id": target_element.element_id,
                            "input_text": text,
                            "screen": element_records(screen),
                            "n_elements": len(screen.elements),
                            "screenshot_path": _screenshot(home, episode_id, step) if screenshots else None,
                        }
                    )
                    lcs = (step + 1) / 4 if success else min(0.5, (step + 1) / 4)
                    labels.append(
                        {
                            "episode_id": episode_id,
                            "step_idx": step,
                            "source": "lcs",
                            "method": "improved",
                            "progress": lcs,
                            "is_key_step": step != 2,
                            "recipe_id": f"{task}:r0",
                            "completion_ratio": 1.0,
                            "label_version": "test",
                        }
                    )
                    if task == "login-user":
                        env = (step + 1) / 4 if success else 0.0
                        labels.append(
                            {
                                "episode_id": episode_id,
                                "step_idx": step,
                                "source": "env",
                                "method": None,
                                "progress": env,
                                "is_key_step": success,
                                "recipe_id": None,
                                "completion_ratio": None,
                                "label_version": "test",
                            }
                        )
                    predictions.append(
                        {
                            "model_id": "rm-test-1",
                            "kind": "progrm_lcs",  # a progress model: its score is the progress after the step
                            "episode_id": episode_id,
                            "step_idx": step,
                            "split": "test",
                            "task_id": task,
                            "score": min(1.0, 0.3 * (step + 1)) if success else 0.1 * step,
                            "is_final_step": step == 3,
                            "episode_success": success,
                        }
                    )
    m = Materialization(asset="test_fixture")
    outputs = [
        warehouse.stage_table("episodes", dataset, pa.Table.from_pylist(episodes, schema=EPISODES), m),
        warehouse.stage_table("steps", dataset, pa.Table.from_pylist(steps, schema=STEPS), m),
        warehouse.stage_table("progress_labels", dataset, pa.Table.from_pylist(labels, schema=PROGRESS_LABELS), m),
    ]
    if with_predictions:
        table = pa.Table.from_pylist(predictions, schema=RM_PREDICTIONS)
        model_dataset = "rm-test-1" if dataset == "test" else f"rm-test-1-{dataset}"
        outputs.append(warehouse.stage_table("rm_predictions", model_dataset, table, m))
    warehouse.publish(m, outputs)
    return warehouse


def _screenshot(home: Path, episode_id: str, step: int) -> str:
    path = home / "screenshots" / f"{episode_id.replace(':', '_')}_{step}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(PNG)
    return str(path)


@pytest.fixture
def small_warehouse(tmp_path) -> Warehouse:
    return build_small_warehouse(tmp_path / "stepwise")
