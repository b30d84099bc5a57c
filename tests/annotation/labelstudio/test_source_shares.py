"""The selection asset shares its budget by episode source: shown in its metadata and lineage, set by its
config and by ``stepwise annotate push --share``; real episodes come first in ``annotation_candidates``."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from dagster import DagsterInstance, materialize

from annotation.labelstudio.human_labels import (
    DEFAULT_SOURCE_SHARES,
    SelectionOptions,
    parse_source_shares,
    push_report_lines,
    select_candidates,
)
from annotation.labelstudio.reads import read_step_candidates
from tests.annotation.labelstudio.conftest import build_small_warehouse
from warehouse.catalog import Warehouse

SOURCES = ("human_demo", "rollout", "synthetic:random_walk", "synthetic:mismatched_instruction")


@pytest.fixture
def mixed_warehouse(tmp_path) -> Warehouse:
    """The small warehouse's 72 steps for each of four episode sources."""
    for source in SOURCES:
        warehouse = build_small_warehouse(tmp_path / "stepwise", source=source)
    return warehouse


def _sources(warehouse: Warehouse) -> list[str]:
    """The episode source of each ``annotation_candidates`` row, in the table's (push) order."""
    source = {
        r["episode_id"]: r["source"] for r in warehouse.query("SELECT episode_id, source FROM episodes").to_pylist()
    }
    rows = warehouse.query("SELECT episode_id FROM annotation_candidates").to_pylist()
    return [source[r["episode_id"]] for r in rows]


def test_candidates_know_their_episode_source(mixed_warehouse):
    by_source = Counter(c.episode_source for c in read_step_candidates(mixed_warehouse))
    assert by_source == dict.fromkeys(SOURCES, 72)


def test_the_selection_shares_its_budget_by_source_and_shows_it(mixed_warehouse):
    summary = select_candidates(mixed_warehouse, SelectionOptions(budget=40, spot_check_share=0.0))
    sources = _sources(mixed_warehouse)
    counts = Counter(sources)
    # rollouts: 18 episodes x 2 steps is room enough for their 0.3; synthetic 0.1; mismatched instructions none
    assert counts == {"human_demo": 24, "rollout": 12, "synthetic:random_walk": 4}
    assert sources[:24] == ["human_demo"] * 24 and sources[24:36] == ["rollout"] * 12  # real ones first
    assert summary["source_shares"] == DEFAULT_SOURCE_SHARES
    assert summary["selected_share_by_source"] == {"human_demo": 0.6, "rollout": 0.3, "synthetic": 0.1}
    table = str(summary["by_source"])
    assert "| synthetic:mismatched_instruction | 0.000 | 0 | 0 |" in table and "synthetic:random_walk" in table
    lineage = mixed_warehouse.query(
        "SELECT parameters FROM lineage WHERE asset = 'annotation_candidates' ORDER BY created_at DESC LIMIT 1"
    ).to_pylist()[0]
    parameters = json.loads(lineage["parameters"])
    assert parameters["source_shares"] == DEFAULT_SOURCE_SHARES and parameters["min_disagreement"] == 0.25
    assert parameters["source_budget"] == {
        "human_demo": 24,
        "rollout": 12,
        "synthetic": 4,
        "synthetic:mismatched_instruction": 0,
    }
    # within human_demo the steps whose label sources disagree come first: LCS vs environment, the model vs them
    rows = mixed_warehouse.query("SELECT reason, uncertainty FROM annotation_candidates").to_pylist()
    tiers = [r["reason"] in ("label_disagreement", "model_disagreement") and r["uncertainty"] >= 0.25 for r in rows]
    assert tiers[:24] == sorted(tiers[:24], reverse=True) and sum(tiers[:24]) >= 12

    lines = push_report_lines(
        summary,
        {
            "pushed": 40,
            "label_studio": "http://127.0.0.1:8080",
            "by_interface": {"step_correctness": {"pushed": 40, "queued_total": 40}},
            "projects": {"step_correctness": "http://127.0.0.1:8080/projects/1"},
            "login": "admin@stepwise.local",
        },
    )
    assert "human_demo 0.6, rollout 0.3, synthetic 0.1, synthetic:mismatched_instruction 0" in lines[0]
    assert any("rollout" in line and "30.0% of the selection" in line for line in lines)


def test_the_asset_takes_shares_from_its_config_and_reports_them(mixed_warehouse):
    from assets.human_labels import annotation_candidates
    from assets.resources import WarehouseResource

    config = {"budget": 20, "spot_check_share": 0.0, "source_shares": {"synthetic": 1.0, "human_demo": 0.0}}
    result = materialize(
        [annotation_candidates],
        resources={"warehouse": WarehouseResource(home=str(mixed_warehouse.home))},
        run_config={"ops": {"annotation_candidates": {"config": config}}},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    metadata = result.asset_materializations_for_node("annotation_candidates")[0].metadata
    assert metadata["source_shares"].value == {"synthetic": 1.0, "human_demo": 0.0}
    assert "| synthetic | 1.000 | 20 | 20 |" in metadata["by_source"].value
    assert {s.split(":")[0] for s in _sources(mixed_warehouse)} == {"synthetic"}

    default = materialize(
        [annotation_candidates],
        resources={"warehouse": WarehouseResource(home=str(mixed_warehouse.home))},
        instance=DagsterInstance.ephemeral(),
    )
    shown = default.asset_materializations_for_node("annotation_candidates")[0].metadata
    assert shown["source_shares"].value == DEFAULT_SOURCE_SHARES


def test_one_source_alone_and_shares_from_the_command_line(mixed_warehouse):
    select_candidates(mixed_warehouse, SelectionOptions(budget=10, episode_source="synthetic:mismatched_instruction"))
    assert set(_sources(mixed_warehouse)) == {"synthetic:mismatched_instruction"}  # asked for by name: all of it

    assert parse_source_shares([]) == DEFAULT_SOURCE_SHARES
    shares = parse_source_shares(["rollout=0.5", " synthetic = 0 "])
    assert shares["rollout"] == 0.5 and shares["synthetic"] == 0 and shares["human_demo"] == 0.6
    for bad, message in (("rollout", "SOURCE=WEIGHT"), ("rollout=lots", "not a number"), ("rollout=-1", ">= 0")):
        with pytest.raises(ValueError, match=message):
            parse_source_shares([bad])
    with pytest.raises(ValueError, match="every source share is 0"):
        select_candidates(mixed_warehouse, SelectionOptions(source_shares=dict.fromkeys(SOURCES, 0.0)))
