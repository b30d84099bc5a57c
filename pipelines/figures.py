"""``stepwise figures``: the README's tables, printed from the warehouse as markdown, so that the
numbers in the README can be regenerated rather than typed. Each section prints only when its
stage has run."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from functools import partial

from training.base.registry import LATEST_REPORT_RUN
from warehouse.catalog import Warehouse


def _markdown(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "_(nothing yet)_"
    columns = columns or list(rows[0])

    def cell(value: object) -> str:
        if value is None:
            return ""
        if isinstance(value, Decimal):  # DuckDB's sums of integers
            value = int(value) if value == value.to_integral_value() else float(value)
        if isinstance(value, float):
            return f"{value:,.3f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def demonstrations(warehouse: Warehouse) -> str:
    files = warehouse.query(
        "SELECT status, count(*) AS files FROM source_files WHERE import_root LIKE '%miniwob-demos' "
        "GROUP BY 1 ORDER BY 1"
    ).to_pylist()
    episodes = warehouse.query(
        "SELECT source, purpose, count(*) AS episodes, count(*) FILTER (WHERE success) AS successes, "
        "sum(n_steps) AS steps, count(DISTINCT task_id) AS tasks FROM episodes GROUP BY 1, 2 ORDER BY 1, 2"
    ).to_pylist()
    return _markdown(files) + "\n\n" + _markdown(episodes)


def label_quality(warehouse: Warehouse) -> str:
    rows = warehouse.query(
        "SELECT task_set, method, tasks, episodes, key_step_precision AS precision, key_step_recall AS recall, "
        "key_step_progress_error AS key_step_error FROM label_quality "
        "WHERE task_set IN ('dev', 'held_out', 'untagged', 'dev (task mean)', 'held_out (task mean)', "
        "'untagged (task mean)') ORDER BY task_set, method"
    ).to_pylist()
    return _markdown(rows)


def reward_models(warehouse: Warehouse) -> str:
    rows = warehouse.query(
        "SELECT kind, max(value) FILTER (WHERE metric = 'accuracy') AS accuracy, "
        "max(value) FILTER (WHERE metric = 'key_step_progress_error') AS key_step_error, "
        "max(value) FILTER (WHERE metric = 'mcnemar_p_vs_orm') AS mcnemar_p_vs_orm, "
        "max(value) FILTER (WHERE metric = 'latency_ms_p50') AS latency_ms_p50 FROM rm_metrics "
        f"WHERE split = 'test' AND report_run_id = {LATEST_REPORT_RUN} GROUP BY 1 ORDER BY 1"
    ).to_pylist()
    return _markdown(rows)


def reward_models_on_agents(warehouse: Warehouse) -> str:
    """Each model of the latest report on held-out agent episodes (``rm_agent_auc``), by family (two
    models of a kind, e.g. a flywheel round's beside the demonstration-trained one, told apart by id)."""
    rows = warehouse.query(
        "SELECT kind, model_id, family, episodes, successes, policies, auc, auc_low, auc_high, score_rule "
        f"FROM rm_agent_auc WHERE report_run_id = {LATEST_REPORT_RUN} "
        "ORDER BY kind, model_id, family = 'all', family"
    ).to_pylist()
    return _markdown(rows)


def reward_models_choosing(warehouse: Warehouse) -> str:
    """Each model of the latest report choosing among alternatives at held-out states
    (``rm_alternative_top1``): its top-1 against the policy's own argmax, by family."""
    rows = warehouse.query(
        "SELECT kind, model_id, family, states, round(100 * top1, 1) AS top1, round(100 * top1_low, 1) AS low, "
        "round(100 * top1_high, 1) AS high, round(100 * policy_top1, 1) AS policy_argmax, "
        "round(100 * random_top1, 1) AS random_pick, round(100 * gain, 1) AS gain, round(100 * gain_low, 1) AS "
        "gain_low, round(100 * gain_high, 1) AS gain_high, wins, losses, round(mcnemar_p, 4) AS p, plan_states, "
        "round(100 * plan_top1, 1) AS plan_top1 FROM rm_alternative_top1 "
        f"WHERE report_run_id = {LATEST_REPORT_RUN} "
        "ORDER BY kind, model_id, family = 'all', family"
    ).to_pylist()
    return _markdown(rows)


def flywheel(warehouse: Warehouse) -> str:
    """Every recorded flywheel round (``flywheel_rounds``)."""
    from training.flywheel.rounds import rounds_markdown

    return rounds_markdown(warehouse.query("SELECT * FROM flywheel_rounds ORDER BY round, kind").to_pylist())


def rl(warehouse: Warehouse, sft_policy_id: str | None = None) -> str:
    """Table 1 of the RL runs from ``sft_policy_id`` (default: the newest SFT policy)."""
    from training.rl.evaluation import run_rl_report
    from training.rl.report import report_markdown

    return str(report_markdown(run_rl_report(warehouse, sft_policy_id=sft_policy_id)))


RL_SECTION = "RL (ProgRM Table 1)"


SECTIONS: dict[str, Callable[[Warehouse], str]] = {
    "demonstrations": demonstrations,
    "label quality": label_quality,
    "reward models": reward_models,
    "reward models on agent episodes": reward_models_on_agents,
    "reward models choosing among alternatives": reward_models_choosing,
    "flywheel rounds": flywheel,
    RL_SECTION: rl,
}


def print_figures(warehouse: Warehouse, only: str | None = None, *, sft_policy_id: str | None = None) -> int:
    """Print every section (or ``only`` one) whose tables exist, the RL one for ``sft_policy_id``
    where given; returns how many printed."""
    sections = dict(SECTIONS)
    if sft_policy_id:
        sections[RL_SECTION] = partial(rl, sft_policy_id=sft_policy_id)
    printed = 0
    for name, section in sections.items():
        if only and only != name:
            continue
        try:
            body = section(warehouse)
        except Exception as exc:  # noqa: BLE001 - a stage that has not run has no figures to print
            print(f"## {name}\n\n_(not available: {str(exc).splitlines()[0]})_\n")
            continue
        print(f"## {name}\n\n{body}\n")
        printed += 1
    return printed
