"""Fixtures for the reward-model tests: a small synthetic warehouse shaped like the real one.

Two MiniWoB-like tasks with real screen structure (forms with values, buttons):

* ``login-user``: click the username field, type it, type the password, click Login. Failures
  type a wrong username, or stop before clicking Login.
* ``click-button``: click the button the instruction names; failures click another one.

Progress labels are written for both sources the reward models read: ``lcs`` (methods ``paper`` and ``improved``)
and ``env`` (milestones: fields filled, button clicked), with ``is_key_step`` where progress rises;
``progress_split`` splits by goal (task + instruction) into train / validation / test.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pyarrow as pa
import pytest

from warehouse.catalog import LineageInput, Materialization, Warehouse
from warehouse.model import Action, ActionType, Screen, UIElement
from warehouse.schema import EPISODES, PROGRESS_LABELS, PROGRESS_SPLIT, STEPS, element_records

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

NAMES = ["renda", "lyda", "vanda", "kiri", "omar", "tess", "ugo", "wen", "zola", "ines", "bo", "cyd", "dana", "eli"]
BUTTONS = ["ok", "cancel", "submit", "next", "previous", "yes", "no"]


def _login_screen(username_value: str | None, password_value: str | None, focused: str | None) -> Screen:
    def el(ref, role, depth, **kw):
        return UIElement(ref=ref, role=role, depth=depth, **kw)

    return Screen(
        (
            el("1", "body", 0),
            el("2", "div", 1, element_id="wrap"),
            el("3", "label", 2, text="Username", classes="bold", clickable=True),
            el(
                "4",
                "textbox",
                2,
                element_id="username",
                value=username_value,
                clickable=True,
                editable=True,
                focused=focused == "username",
            ),
            el("5", "label", 2, text="Password", classes="bold", clickable=True),
            el(
                "6",
                "password",
                2,
                element_id="password",
                value=password_value,
                clickable=True,
                editable=True,
                focused=focused == "password",
            ),
            el("7", "button", 2, element_id="subbtn", text="Login", clickable=True),
        )
    )


def _login_episode(rng: random.Random, outcome: str):
    user, password = rng.choice(NAMES), rng.choice(NAMES)[:3]
    instruction = f'Enter the username "{user}" and the password "{password}" into the text fields and press login.'
    typed_user = user if outcome != "wrong_user" else rng.choice([n for n in NAMES if n != user])
    screens = [
        _login_screen(None, None, None),
        _login_screen(None, None, "username"),
        _login_screen(typed_user, None, "password"),
        _login_screen(typed_user, password, "password"),
    ]
    field_user, field_pass = screens[0].elements[3], screens[0].elements[5]
    login = screens[0].elements[6]
    actions = [
        Action(ActionType.CLICK, field_user),
        Action(ActionType.INPUT, field_user, text=typed_user),
        Action(ActionType.INPUT, field_pass, text=password),
        Action(ActionType.CLICK, login),
    ]
    if outcome == "stopped":
        screens, actions = screens[:3], actions[:3]
    success = outcome == "success"
    # env milestones: username typed (right), password typed, login clicked with both right
    env = []
    reached = 0
    for t in range(len(actions)):
        if t == 1 and typed_user == user:
            reached = 1
        if t == 2 and reached == 1:
            reached = 2
        if t == 3 and success:
            reached = 3
        env.append(reached / 3)
    # lcs labels (recipe: click user, input user, input password, click login), soft on a wrong name
    lcs = [0.25, 0.5 if typed_user == user else 0.25, 0.75 if typed_user == user else 0.5, 1.0 if success else 0.75][
        : len(actions)
    ]
    if outcome == "stopped":
        lcs = [0.25, 0.5, 0.75]
    return "login-user", instruction, screens, actions, success, lcs, env


def _button_screen(names: list[str]) -> Screen:
    elements = [UIElement(ref="1", role="body", depth=0), UIElement(ref="2", role="div", element_id="area", depth=1)]
    elements += [UIElement(ref=str(3 + i), role="button", text=n, clickable=True, depth=2) for i, n in enumerate(names)]
    return Screen(tuple(elements))


def _button_episode(rng: random.Random, outcome: str):
    names = rng.sample(BUTTONS, 4)
    target = names[0]
    instruction = f'Click on the "{target}" button.'
    rng.shuffle(names)
    screen = _button_screen(names)
    chosen = target if outcome == "success" else rng.choice([n for n in names if n != target])
    element = next(e for e in screen.elements if e.text == chosen)
    success = outcome == "success"
    return (
        "click-button",
        instruction,
        [screen],
        [Action(ActionType.CLICK, element)],
        success,
        [1.0 if success else 0.0],
        [1.0 if success else 0.0],
    )


def build_tiny_warehouse(home: Path, *, n_login: int = 40, n_button: int = 30, seed: int = 7) -> Warehouse:
    """A warehouse with episodes, steps, progress_labels (lcs paper + env) and progress_split."""
    rng = random.Random(seed)
    episodes, steps, labels, split_rows = [], [], [], []
    specs = [
        ("login", o)
        for o in ["success"] * (n_login // 2)
        + ["wrong_user"] * (n_login // 4)
        + ["stopped"] * (n_login - n_login // 2 - n_login // 4)
    ]
    specs += [("button", o) for o in ["success"] * (n_button // 2) + ["wrong"] * (n_button - n_button // 2)]
    for k, (task, outcome) in enumerate(specs):
        task_id, instruction, screens, actions, success, lcs, env = (
            _login_episode(rng, outcome) if task == "login" else _button_episode(rng, outcome)
        )
        episode_id = f"ep{k:03d}"
        episodes.append(
            {name: None for name in EPISODES.names}
            | {
                "episode_id": episode_id,
                "task_id": task_id,
                "task_family": "miniwob",
                "instruction": instruction,
                "source": "human_demo",
                "success": success,
                "n_steps": len(actions),
            }
        )
        for t, (screen, action) in enumerate(zip(screens, actions, strict=False)):
            steps.append(
                {name: None for name in STEPS.names}
                | {
                    "episode_id": episode_id,
                    "step_idx": t,
                    "action_type": action.type.value,
                    "action_text": action.canonical_text(),
                    "screen": element_records(screen),
                    "target_ref": action.target.ref if action.target is not None else None,
                    "n_elements": len(screen.elements),
                    "done": t == len(actions) - 1,
                }
            )
        for source, method, progress in (("lcs", "paper", lcs), ("lcs", "improved", lcs), ("env", None, env)):
            previous = 0.0
            for t, p in enumerate(progress):
                labels.append(
                    {
                        "episode_id": episode_id,
                        "step_idx": t,
                        "source": source,
                        "method": method,
                        "progress": float(p),
                        "is_key_step": p > previous,
                        "recipe_id": None,
                        "completion_ratio": float(progress[-1]),
                        "label_version": f"{source}-{method}-test-v1" if method == "improved" else f"{source}-test-v1",
                    }
                )
                previous = max(previous, p)
        goal = f"{task_id}|{instruction}"
        h = int(hashlib.sha1(goal.encode()).hexdigest()[:8], 16) % 10
        split = "train" if h < 6 else ("validation" if h < 8 else "test")
        split_rows.append(
            {
                "episode_id": episode_id,
                "task_id": task_id,
                "goal_key": goal,
                "split": split,
                "success": success,
                "n_steps": len(actions),
                "n_steps_sampled": len(actions) if success else max(1, len(actions) - 1),
                "sampled_steps": list(range(len(actions))) if success else list(range(max(1, len(actions) - 1))),
            }
        )
    warehouse = Warehouse(home)
    m_ingest = Materialization(
        asset="human_demonstrations",
        inputs=[LineageInput(kind="file", path="synthetic://tiny-warehouse", version=f"seed-{seed}")],
    )
    warehouse.publish(
        m_ingest,
        [
            warehouse.stage_table("episodes", "tiny", pa.Table.from_pylist(episodes, schema=EPISODES), m_ingest),
            warehouse.stage_table("steps", "tiny", pa.Table.from_pylist(steps, schema=STEPS), m_ingest),
        ],
    )
    m_labels = Materialization(
        asset="progress_labels",
        inputs=[
            LineageInput(
                kind="asset", input_asset="human_demonstrations", input_materialization_id=m_ingest.materialization_id
            )
        ],
    )
    warehouse.publish(
        m_labels,
        [
            warehouse.stage_table(
                "progress_labels", "default", pa.Table.from_pylist(labels, schema=PROGRESS_LABELS), m_labels
            )
        ],
    )
    m_split = Materialization(
        asset="progress_split",
        inputs=[
            LineageInput(
                kind="asset", input_asset="progress_labels", input_materialization_id=m_labels.materialization_id
            )
        ],
    )
    warehouse.publish(
        m_split,
        [
            warehouse.stage_table(
                "progress_split", "default", pa.Table.from_pylist(split_rows, schema=PROGRESS_SPLIT), m_split
            )
        ],
    )
    return warehouse


@pytest.fixture(scope="session")
def tiny_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("rm-home")
    build_tiny_warehouse(home)
    return home


@pytest.fixture(scope="session")
def minilm_path() -> str:
    from training.base.encoder import default_backbone

    return default_backbone()


@pytest.fixture(scope="session")
def tiny_examples(tiny_home, tmp_path_factory) -> dict[str, Path]:
    """rm_examples Parquet files per kind, built from the tiny warehouse."""
    import pyarrow.parquet as pq

    from training.reward_models.dataset import build_reward_model_dataset
    from training.reward_models.kinds import REWARD_MODEL_KINDS
    from training.reward_models.readers import read_splits, read_trajectories

    warehouse = Warehouse(tiny_home)
    trajectories = read_trajectories(warehouse, read_splits(warehouse).keys())
    folder = tmp_path_factory.mktemp("rm-examples")
    paths = {}
    for kind in REWARD_MODEL_KINDS:
        dataset = build_reward_model_dataset(warehouse, kind, trajectories=trajectories)
        paths[kind] = folder / f"{kind}.parquet"
        pq.write_table(dataset.examples, paths[kind])
    return paths


@pytest.fixture(scope="session")
def trained_progrm(tiny_examples, tmp_path_factory) -> Path:
    """A ProgRM-Env model trained (briefly, for real) on the tiny warehouse; its export folder."""
    return _train_tiny(tiny_examples, tmp_path_factory, "progrm_env")


@pytest.fixture(scope="session")
def trained_orm(tiny_examples, tmp_path_factory) -> Path:
    """An outcome reward model trained (briefly, for real) on the tiny warehouse."""
    return _train_tiny(tiny_examples, tmp_path_factory, "orm")


@pytest.fixture(scope="session")
def trained_prm(tiny_examples, tmp_path_factory) -> Path:
    """A binary step-correctness PRM trained (briefly, for real) on the tiny warehouse."""
    return _train_tiny(tiny_examples, tmp_path_factory, "prm")


def _train_tiny(tiny_examples, tmp_path_factory, kind: str) -> Path:
    from training.reward_models.train import parse_args, train_reward_model

    out = tmp_path_factory.mktemp(f"trained-{kind}")
    model_config, data, args = parse_args(
        [
            "--kind",
            kind,
            "--examples",
            str(tiny_examples[kind]),
            "--output_dir",
            str(out / "trainer"),
            "--embedding_cache_dir",
            str(out / "cache"),
            "--max_steps",
            "60",
            "--per_device_train_batch_size",
            "16",
            "--learning_rate",
            "3e-3",
            "--save_steps",
            "1000",
            "--logging_steps",
            "20",
            "--disable_tqdm",
            "true",
            "--eval_strategy",
            "no",
            "--warmup_steps",
            "0",
        ]
    )
    train_reward_model(model_config, data, args)
    return out / "trainer" / "final"


@pytest.fixture(scope="session")
def tiny_causal_lm_path(tmp_path_factory) -> str:
    """A random 2-layer Qwen2ForCausalLM (hidden 64) with a tokenizer that matches it: a byte-level
    BPE trained on ~300 actor prompts of the MiniWoB++ demonstrations, ChatML template (issue
    "Hardening" item 17: not MiniLM's BERT tokenizer, which loads as a character-splitting
    Qwen2Tokenizer). Both saved with save_pretrained; built in a few seconds."""
    from tests.training.llm.llm_fixtures import build_tiny_causal_lm

    return str(build_tiny_causal_lm(tmp_path_factory.mktemp("tiny-causal-lm")))
