"""The `stepwise` command, as users run it."""

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPWISE = Path(sys.executable).with_name("stepwise")


def test_cli_import_demos_and_sql(small_demos, home):
    env = {"STEPWISE_HOME": str(home), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [STEPWISE, "import-demos", str(small_demos)], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "23 files" in out.stdout and "quarantined" in out.stdout
    out = subprocess.run(
        [STEPWISE, "sql", "SELECT action_type, count(*) AS n FROM steps GROUP BY 1 ORDER BY 1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "CLICK" in out.stdout and "INPUT" in out.stdout
    bad = subprocess.run(
        [STEPWISE, "sql", "SELECT nope FROM steps"], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == 2 and "nope" in bad.stderr
    missing = subprocess.run(
        [STEPWISE, "import-demos", str(home / "nowhere")], capture_output=True, text=True, env=env, timeout=120
    )
    assert missing.returncode == 2 and "not a folder" in missing.stderr
