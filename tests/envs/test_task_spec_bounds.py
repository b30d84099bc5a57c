"""Loading a task spec is bounded: an alias bomb, deep nesting, an oversized file or instruction fail
fast with a one-line TaskSpecError naming the file and field; generated YAML never does worse.

Regression test for the issue "Bad input never aborts a batch", item 3 (a YAML alias bomb in a spec
hung ``stepwise label`` / ``label-report`` for over 120 s), and fuzz test (b).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from envs.tasks import (
    MAX_INSTRUCTION_CHARS,
    MAX_SPEC_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    TaskSpec,
    TaskSpecError,
    load_task_spec,
    load_task_specs,
)
from tests.envs.fuzzing import fuzz_settings

SPEC = """\
task_id: login-user
instruction: 'Enter the username "(?P<username>[^"]+)"'
milestones:
  - name: typed
    when: {field_value: {element: {element_id: username}, equals: "{username}"}}
  - name: done
    when: {episode_success: true}
"""

# The bomb: the instruction is nine levels of aliases, nine wide (9^9 = 387,420,489 strings).
ALIAS_BOMB = "\n".join(
    ["task_id: login-user", 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    + ["instruction: *i", "milestones: [{name: x, when: {episode_success: true}}]"]
)


def _fails_fast(path: Path, within_cpu_s: float = 10.0) -> str:
    # A hang guard, not a speed figure: an unbounded load of these files takes minutes of CPU. CPU
    # time, not wall time, so other work on a shared machine cannot fail it (it did, at 2 s wall).
    started = time.process_time()
    with pytest.raises(TaskSpecError) as info:
        load_task_spec(path)
    assert time.process_time() - started < within_cpu_s
    message = str(info.value)
    assert len(message.splitlines()) == 1 and str(path) in message
    return message


def test_an_alias_bomb_fails_fast_naming_the_file_and_field(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    message = _fails_fast(path)
    assert "field '" in message and "MAX_YAML_NODES" in message
    # the same, with the aliases expanded only under the instruction
    path.write_text(
        "a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "task_id: x\ninstruction: [" + ", ".join(["*b"] * 200) + "]\n"
    )
    assert "field 'instruction" in _fails_fast(path)


def test_a_folder_with_a_bomb_fails_fast_or_lists_it(tmp_path):
    (tmp_path / "good.yaml").write_text(SPEC)
    (tmp_path / "bomb.yaml").write_text(ALIAS_BOMB)
    started = time.process_time()
    with pytest.raises(TaskSpecError, match="bomb.yaml"):
        load_task_specs(tmp_path)
    errors: list[str] = []
    specs = load_task_specs(tmp_path, errors=errors)
    assert time.process_time() - started < 20.0  # a hang guard in CPU time, as in _fails_fast
    assert list(specs) == ["login-user"] and len(errors) == 1 and "bomb.yaml" in errors[0]


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("&a [*a]", "refers to a node that contains it"),  # a recursive alias
        ("[" * 100_000 + "]" * 100_000, "MAX_SPEC_BYTES"),
        ("x: " + "[" * (MAX_YAML_DEPTH + 5) + "]" * (MAX_YAML_DEPTH + 5), "MAX_YAML_DEPTH"),
        ("task_id: x\nmilestones: [" + ", ".join(["1"] * (MAX_YAML_NODES + 1)) + "]", "MAX_YAML_NODES"),
        ("task_id: x\ninstruction: '" + "a" * (MAX_INSTRUCTION_CHARS + 1) + "'", "MAX_INSTRUCTION_CHARS"),
        ("task_id: x\ninstruction: '(?P<a>x)(?P<a>y)'", "regular expression"),
        ("task_id: x\ninstruction: [a, b]", "must be a string"),
        ("task_id: x\nwhen: 2001-02-30", "invalid YAML value"),  # a date PyYAML cannot build
        ("task_id: x\nn: " + "9" * 5000, "invalid YAML value"),  # more digits than int() converts
        ("task_id: x\nsolution: 5\nmilestones: [{name: a, when: {episode_success: true}}]", "'solution'"),
        (
            "task_id: x\nmilestones: [{name: a, when: {visible: {text: 0x" + "f" * 5000 + "}}}]",
            "too large",
        ),
        ("task_id: [unclosed", "invalid YAML"),  # PyYAML's message spans lines: one line here
    ],
)
def test_bounds_and_malformed_values_are_one_line_errors(tmp_path, text, expect):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    assert expect in _fails_fast(path)


def test_the_bounds_leave_room_for_real_specs():
    assert MAX_SPEC_BYTES > 30 * 1280  # the largest shipped spec is 1.3 KB
    specs = load_task_specs(Path(__file__).resolve().parents[2] / "envs" / "task_specs")
    assert len(specs) >= 30


def test_a_file_name_that_is_not_utf8_is_named_readably(tmp_path):
    raw = os.path.join(os.fsencode(tmp_path), b"bad\xffname.yaml")
    with open(raw, "wb") as handle:
        handle.write(b"task_id: [unclosed")
    with pytest.raises(TaskSpecError) as info:
        load_task_spec(os.fsdecode(raw))
    message = str(info.value)
    message.encode("utf-8")  # printable anywhere: no lone surrogates
    assert "bad\\xffname.yaml" in message


# -- fuzz (b): generated YAML is either a spec or a one-line TaskSpecError naming the file --------

_KEYS = st.sampled_from(
    ["task_id", "instruction", "milestones", "name", "when", "fields", "solution", "backend", "app", "family"]
    + ["visible", "clicked", "field_value", "element", "equals", "all", "any", "not", "episode_success", "text", "role"]
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["login-user", "{username}", "(?P<username>.+)", "(unclosed", "[", "*a", "&a x", "!!binary x"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS | st.text(max_size=5), inner, max_size=4),
    max_leaves=25,
)


@st.composite
def _yaml_documents(draw) -> str:
    kind = draw(st.sampled_from(["structure", "mutated", "aliases", "text"]))
    if kind == "text":
        return draw(st.text(max_size=200))
    if kind == "aliases":
        width, depth = draw(st.integers(1, 12)), draw(st.integers(1, 12))
        lines = ["task_id: t", f"l0: &l0 [{', '.join(['x'] * width)}]"]
        for level in range(1, depth):
            lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
        field = draw(st.sampled_from(["instruction", "milestones", "fields", "solution", "extra"]))
        lines.append(f"{field}: *l{depth - 1}")
        return "\n".join(lines)
    document = draw(_VALUES)
    if draw(st.booleans()):
        document = {"task_id": "t", "milestones": [{"name": "m", "when": document}], "instruction": draw(_SCALARS)}
    text = yaml.safe_dump(document, allow_unicode=draw(st.booleans()))
    if kind == "mutated" and text:
        position = draw(st.integers(0, len(text)))
        insert = draw(st.sampled_from(["&a ", "*a", "[", "]", "{", "}", ": ", "\n- ", "'", '"', "!!", "<<: *a\n"]))
        text = text[:position] + insert + text[position + draw(st.integers(0, 3)) :]
    return text


@pytest.mark.fuzz
@fuzz_settings(150)
@given(text=_yaml_documents())
def test_fuzz_generated_yaml_is_a_spec_or_a_one_line_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    started = time.process_time()
    try:
        spec = load_task_spec(path)
    except TaskSpecError as exc:
        message = str(exc)
        assert len(message.splitlines()) == 1 and str(path) in message
    else:
        assert isinstance(spec, TaskSpec) and spec.milestones
    assert time.process_time() - started < 10.0  # a hang guard in CPU time, as in _fails_fast
