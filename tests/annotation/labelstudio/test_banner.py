"""What `make annotate` prints: one command to queue work, a password hint that says where the password
is and how to print it, and commands that name the STEPWISE_HOME the script runs with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from annotation.labelstudio.banner import annotate_banner
from annotation.labelstudio.secrets import LocalSecrets, write_local_secrets
from annotation.labelstudio.server import labelstudio_dir

REPO_ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "pw-Zq8vX2kLmN4r"


def _home_with_credentials(tmp_path: Path) -> Path:
    home = tmp_path / "my annotations"  # a custom home, with a space
    write_local_secrets(labelstudio_dir(home), LocalSecrets(username="admin@stepwise.local", password=PASSWORD))
    return home


def test_the_banner_names_the_home_the_login_and_one_way_to_queue_work(tmp_path):
    home = _home_with_credentials(tmp_path)
    text = annotate_banner(home=home, ls_url="http://127.0.0.1:8123", dagster_port=3123, own_server=True)
    quoted = f"'{home}'"
    assert "Annotators log in at   http://127.0.0.1:8123/user/login/" in text
    assert "Username               admin@stepwise.local" in text
    assert f".venv/bin/python -m annotation.labelstudio password --home {quoted}   prints it" in text
    assert f'kept in {home}/labelstudio/stepwise-credentials.json, field "password"' in text
    assert PASSWORD not in text and 'password: "password"' not in text
    assert f"STEPWISE_HOME={quoted} .venv/bin/stepwise annotate push" in text
    assert text.count("annotate push") == 2 and "Materialize" not in text  # one way: the command (and its --help)
    assert "human_demo 0.6, rollout 0.3, synthetic 0.1, none of synthetic:mismatched_instruction" in text
    assert f'STEPWISE_HOME={quoted} .venv/bin/stepwise sql "SELECT interface' in text
    assert "http://127.0.0.1:3123" in text and f"{home}/logs/" in text

    own = annotate_banner(home=home, ls_url="https://ls.example.org", dagster_port=3000, own_server=False)
    assert "your own Label Studio account" in own and "stepwise-credentials.json" not in own
    assert f"STEPWISE_HOME={quoted} .venv/bin/stepwise annotate push" in own


def test_the_script_prints_the_banner_for_its_own_stepwise_home(tmp_path):
    home = _home_with_credentials(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABEL_STUDIO_")}
    env |= {"STEPWISE_HOME": str(home), "ANNOTATE_BANNER_ONLY": "1", "PORT": "3555", "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/annotate.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    bin_dir = Path(sys.executable).parent
    assert f"STEPWISE_HOME='{home}' {bin_dir}/stepwise annotate push" in out
    assert f"STEPWISE_HOME='{home}' {bin_dir}/stepwise sql" in out
    assert f"{home}/labelstudio/stepwise-credentials.json" in out and PASSWORD not in out
    assert "http://127.0.0.1:3555" in out
    assert not (home / "dagster").exists()  # the banner alone starts nothing


def test_the_password_command_prints_it_or_says_why_not(tmp_path):
    home = _home_with_credentials(tmp_path)
    command = [sys.executable, "-m", "annotation.labelstudio", "password", "--home"]
    done = subprocess.run([*command, str(home)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == PASSWORD
    missing = subprocess.run(
        [*command, str(tmp_path / "none")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 1 and "start the server first" in missing.stderr
