"""The layout as a contract: import direction (import-linter), thin asset modules, and stage
commands that run without loading Dagster."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_ASSET_MODULE_LINES = 300


def test_import_contracts_hold():
    """pyproject.toml [tool.importlinter]: layers and forbidden imports, checked by the real tool."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "broken" in done.stdout and "0 broken" in done.stdout


def test_asset_modules_are_declarations():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (REPO_ROOT / "assets").glob("*.py")}
    too_long = {name: n for name, n in sizes.items() if n > MAX_ASSET_MODULE_LINES}
    assert not too_long, f"asset modules over {MAX_ASSET_MODULE_LINES} lines: {too_long}"


def test_stepwise_label_runs_without_dagster(tmp_path):
    """`stepwise label` on an empty warehouse (hashing embedder) loads no Dagster module."""
    script = textwrap.dedent(
        """
        import sys
        from pipelines.cli import main
        code = main(["label", "--embedder", "hashing"])
        loaded = sorted(m for m in sys.modules if m == "dagster" or m.startswith("dagster."))
        print("CODE", code, "DAGSTER", len(loaded))
        """
    )
    env = {"STEPWISE_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CODE 0 DAGSTER 0" in done.stdout, done.stdout[-2000:]
