"""The catalog: atomic publish, lineage, and a home that can be copied or moved as a whole."""

import shutil

import duckdb
import pyarrow as pa
import pytest

from envs.miniwob.demonstrations import import_demonstrations
from warehouse.catalog import ConcurrentPublishError, LineageInput, Materialization, Warehouse
from warehouse.schema import TABLE_SCHEMAS


def _views(warehouse: Warehouse) -> dict[str, int]:
    return {
        name: warehouse.query(f"SELECT count(*) AS n FROM {name}").to_pylist()[0]["n"]
        for name in [*TABLE_SCHEMAS, "lineage"]
    }


def test_a_copied_home_answers_every_view_after_the_original_is_deleted(small_demos, tmp_path):
    original = Warehouse(tmp_path / "original")
    import_demonstrations(small_demos, original, workers=1)
    before = _views(original)
    assert before["episodes"] > 0 and before["steps"] > 0
    stored = original.query("SELECT path FROM table_versions").to_pylist()
    assert stored and all(not r["path"].startswith("/") for r in stored)  # relative to the home

    moved = tmp_path / "elsewhere" / "home"
    shutil.copytree(original.home, moved)
    shutil.rmtree(original.home)
    copy = Warehouse(moved)
    assert _views(copy) == before
    mid, path = copy.current_version("steps", next(iter(_datasets(copy, "steps"))))
    assert path.startswith(str(moved)) and mid
    # Lineage still walks from the steps output back to the raw files.
    relative = copy.query("SELECT path FROM table_versions WHERE table_name = 'steps'").to_pylist()[0]["path"]
    walked = copy.walk_back(relative).to_pylist()
    assert any(r["kind"] == "file" for r in walked)
    # An outside DuckDB client opening the moved file sees the views of the new location.
    with duckdb.connect(str(copy.db_path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM episodes").fetchall() == [(before["episodes"],)]


def _datasets(warehouse: Warehouse, table: str) -> list[str]:
    return [d for d, _, _ in warehouse.current_versions(table)]


def test_a_home_written_with_absolute_paths_is_migrated_when_moved(tmp_path):
    """Catalogs from before relative paths: absolute paths into the old home still resolve."""
    old = Warehouse(tmp_path / "old")
    m = Materialization(asset="t")
    table = pa.table({"x": [1, 2, 3]})
    out = old.stage_table("things", "d", table, m)
    old.publish(m, [out])
    with duckdb.connect(str(old.db_path)) as con:  # what an older version stored
        con.execute("UPDATE table_versions SET path = ?", [str(out.path)])
        con.execute("DELETE FROM catalog_meta")
    shutil.copytree(old.home, tmp_path / "new")
    shutil.rmtree(old.home)
    new = Warehouse(tmp_path / "new")
    assert new.query("SELECT sum(x) AS s FROM things").to_pylist() == [{"s": 6}]
    assert not new.query("SELECT path FROM table_versions").to_pylist()[0]["path"].startswith("/")


def test_outside_files_keep_absolute_paths_in_lineage(tmp_path):
    warehouse = Warehouse(tmp_path / "home")
    raw = tmp_path / "raw.json"
    raw.write_text("{}")
    m = Materialization(asset="t", inputs=[LineageInput(kind="file", path=str(raw), version="abc")])
    warehouse.publish(m, [warehouse.stage_table("things", "d", pa.table({"x": [1]}), m)])
    inputs = warehouse.query("SELECT path FROM lineage_inputs").to_pylist()
    assert inputs == [{"path": str(raw)}]


def test_a_guarded_publish_refuses_when_another_run_published_its_datasets_meanwhile(tmp_path):
    warehouse = Warehouse(tmp_path / "home")
    table = pa.table({"x": [1, 2]})

    def publish(dataset: str, guard=None) -> Materialization:
        m = Materialization(asset="a")
        warehouse.publish(m, [warehouse.stage_table("t", dataset, table, m)], guard=guard)
        return m

    first = publish("labels/f")
    guard = warehouse.guard(["t"], ["labels/f"])  # a run of family f starts here
    publish("labels/g")  # another family: no conflict
    publish("labels/f/+0", guard=warehouse.guard(["t"], ["labels/f"]))  # a second run of f lands first
    late = Materialization(asset="a")
    staged = warehouse.stage_table("t", "labels/f", table, late)
    with pytest.raises(ConcurrentPublishError, match=r"labels/f/\+0 was published by materialization"):
        warehouse.publish(late, [staged], guard=guard)
    assert not staged.path.exists()  # nothing half-written
    current = {d: mid for d, mid, _ in warehouse.current_versions("t")}
    assert current["labels/f"] == first.materialization_id
    assert (
        warehouse.query(
            "SELECT count(*) AS n FROM lineage_materializations WHERE materialization_id = ?", [late.materialization_id]
        ).to_pylist()[0]["n"]
        == 0
    )
    publish("labels/f", guard=warehouse.guard(["t"], ["labels/f"]))  # started afresh, it lands


def test_adopting_versions_refuses_when_the_home_published_meanwhile(tmp_path):
    """A pull adopts a store's versions only if the home's are still those it read."""
    source, home = Warehouse(tmp_path / "store-side"), Warehouse(tmp_path / "home")
    m = Materialization(asset="a")
    source.publish(m, [source.stage_table("t", "d", pa.table({"x": [1]}), m)])
    remote = source.catalog_tables()
    path = home.resolve(remote["versions"].column("path")[0].as_py())
    path.parent.mkdir(parents=True)
    shutil.copy(source.resolve(remote["versions"].column("path")[0].as_py()), path)
    local = Materialization(asset="a")
    home.publish(local, [home.stage_table("t", "d", pa.table({"x": [2, 3]}), local)])  # after the pull read None
    with pytest.raises(ConcurrentPublishError, match="t / d was published here"):
        home.adopt_versions(
            remote["versions"],
            remote["lineage_materializations"],
            remote["lineage_inputs"],
            expected={("t", "d"): None},
        )
    assert home.query("SELECT count(*) AS n FROM t").to_pylist()[0]["n"] == 2  # nothing adopted
    home.adopt_versions(
        remote["versions"],
        remote["lineage_materializations"],
        remote["lineage_inputs"],
        expected={("t", "d"): local.materialization_id},
    )
    assert home.query("SELECT count(*) AS n FROM t").to_pylist()[0]["n"] == 1
    assert (
        m.materialization_id
        in home.query("SELECT materialization_id FROM lineage_materializations")
        .column("materialization_id")
        .to_pylist()
    )


def test_a_home_from_before_a_column_existed_reads_it_as_null_or_inferred(tmp_path):
    """Files written before ``episodes.purpose`` lack the column; an older catalog's views lack it
    too. Opened by this version, the views are rebuilt: every schema column is there, in schema
    order, and the purpose is inferred from the source and the id prefix."""
    import pyarrow.parquet as pq

    from warehouse.schema import EPISODES

    wh = Warehouse(tmp_path / "home")
    rows = [
        {"episode_id": "demo:a:1", "task_id": "a", "source": "human_demo", "success": True, "n_steps": 1},
        {
            "episode_id": "eval:p:held_out:a:3000000",
            "task_id": "a",
            "source": "rollout",
            "success": False,
            "n_steps": 1,
        },
        {
            "episode_id": "guide:p:prm:N=3:a:3000000:a0",
            "task_id": "a",
            "source": "rollout",
            "success": True,
            "n_steps": 1,
        },
        {"episode_id": "rl:k:p:i000:a:1000000", "task_id": "a", "source": "rollout", "success": True, "n_steps": 1},
        {"episode_id": "rollout:a:b:5", "task_id": "a", "source": "rollout", "success": True, "n_steps": 1},
        {"episode_id": "syn:x", "task_id": "a", "source": "synthetic:shuffle", "success": False, "n_steps": 1},
    ]
    m = Materialization(asset="t")
    out = wh.stage_table("episodes", "d", pa.Table.from_pylist(rows, schema=EPISODES), m)
    wh.publish(m, [out])
    old_file = pq.read_table(out.path).drop_columns(["purpose"])  # what an older version wrote
    pq.write_table(old_file, out.path)
    with duckdb.connect(str(wh.db_path)) as con:  # and its views: without the column, no version mark
        con.execute(f"CREATE OR REPLACE VIEW episodes AS SELECT * FROM read_parquet('{out.path}')")
        con.execute("UPDATE catalog_meta SET value = ? WHERE key = 'views_home'", [str(wh.home)])  # no version
    reopened = Warehouse(tmp_path / "home")
    purposes = {
        r["episode_id"].split(":")[0]: r["purpose"]
        for r in reopened.query("SELECT episode_id, purpose FROM episodes").to_pylist()
    }
    assert purposes == {
        "demo": "demonstration",
        "eval": "evaluation",
        "guide": "guidance_evaluation",
        "rl": "rl_training",
        "rollout": "exploration",
        "syn": "synthetic",
    }
    assert [c for c, _ in reopened.columns("episodes")] == EPISODES.names


def test_a_column_renamed_since_a_home_was_written_reads_under_its_new_name(tmp_path):
    """``agent_eval.reward_source`` held policy labels (``sft``, ``llm_base``) and is now
    ``policy_label``: a file written before the rename is read under the new name beside a new file,
    and the old name is gone from the view, so no query sees half the rows under each name."""
    import pyarrow.parquet as pq

    from warehouse.tables_rl import AGENT_EVAL

    wh = Warehouse(tmp_path / "home")
    row = {"evaluation": "held_out", "task_id": "a", "episodes": 4, "successes": 1}
    m_old = Materialization(asset="old")
    old = wh.stage_table(
        "agent_eval", "old", pa.Table.from_pylist([row | {"policy_id": "sft-1"}], schema=AGENT_EVAL), m_old
    )
    wh.publish(m_old, [old])
    # what a version before the rename wrote: the same schema, the label under the old name
    before_rename = pa.schema([f.with_name("reward_source") if f.name == "policy_label" else f for f in AGENT_EVAL])
    pq.write_table(
        pa.Table.from_pylist([row | {"policy_id": "sft-1", "reward_source": "sft"}], schema=before_rename), old.path
    )
    m_new = Materialization(asset="new")
    new_row = row | {"policy_id": "llm-1", "policy_label": "llm_base"}
    wh.publish(m_new, [wh.stage_table("agent_eval", "new", pa.Table.from_pylist([new_row], schema=AGENT_EVAL), m_new)])

    reopened = Warehouse(tmp_path / "home")
    labels = reopened.query("SELECT policy_id, policy_label FROM agent_eval ORDER BY policy_id").to_pylist()
    assert labels == [{"policy_id": "llm-1", "policy_label": "llm_base"}, {"policy_id": "sft-1", "policy_label": "sft"}]
    assert [c for c, _ in reopened.columns("agent_eval")] == AGENT_EVAL.names


def test_alternatives_written_before_labelled_by_existed_read_as_replayed(tmp_path):
    """Every ``step_alternatives`` row before views version 9 was labelled by replay; a file without
    the column reads ``labelled_by = 'replay'`` beside a new file's rows labelled from the recording."""
    import pyarrow.parquet as pq

    from warehouse.tables_training import STEP_ALTERNATIVES

    wh = Warehouse(tmp_path / "home")

    def row(candidate: int, **extra) -> dict:
        return {"alternative_id": f"s:{candidate}", "state_id": "s", "episode_id": "e", "step_idx": 0} | {
            "candidate": candidate,
            **extra,
        }

    m_old = Materialization(asset="old")
    old = wh.stage_table("step_alternatives", "old", pa.Table.from_pylist([row(0)], schema=STEP_ALTERNATIVES), m_old)
    wh.publish(m_old, [old])
    before = pa.schema([f for f in STEP_ALTERNATIVES if f.name not in ("labelled_by", "field_match")])
    pq.write_table(pa.Table.from_pylist([row(0)], schema=before), old.path)
    m_new = Materialization(asset="new")
    new = pa.Table.from_pylist([row(1, labelled_by="recording", field_match=False)], schema=STEP_ALTERNATIVES)
    wh.publish(m_new, [wh.stage_table("step_alternatives", "new", new, m_new)])

    reopened = Warehouse(tmp_path / "home")
    got = reopened.query("SELECT candidate, labelled_by, field_match FROM step_alternatives ORDER BY candidate")
    assert got.to_pylist() == [
        {"candidate": 0, "labelled_by": "replay", "field_match": None},
        {"candidate": 1, "labelled_by": "recording", "field_match": False},
    ]
