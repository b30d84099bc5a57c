"""The `stepwise` command, as users run it."""

import subprocess
import sys
from pathlib import Path

from training.rl.runs import RL_SEEDS
from warehouse.catalog import Warehouse

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


def test_sql_shell_lineage_and_one_line_errors(small_demos, home, tmp_path):
    env = {"STEPWISE_HOME": str(home), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([STEPWISE, "import-demos", str(small_demos)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    script = ".tables\n.schema steps\nSELECT count(*) AS n\n  FROM episodes;\n.quit\n"
    shell = subprocess.run([STEPWISE, "sql"], input=script, capture_output=True, text=True, env=env, timeout=120)
    assert shell.returncode == 0, shell.stderr
    assert "episodes" in shell.stdout and "step_idx" in shell.stdout and "INTEGER" in shell.stdout
    bad = subprocess.run([STEPWISE, "sql"], input="SELECT * FROM stepz;\n", capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "views: " in bad.stderr and "steps" in bad.stderr
    episode = Warehouse(home).query("SELECT episode_id FROM episodes LIMIT 1").to_pylist()[0]["episode_id"]
    lineage = subprocess.run([STEPWISE, "lineage", episode], capture_output=True, text=True, env=env, timeout=120)
    assert lineage.returncode == 0 and "human_demonstrations" in lineage.stdout and "file" in lineage.stdout
    missing = subprocess.run([STEPWISE, "lineage", "nope"], capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and "no current version holds episode 'nope'" in missing.stderr
    (tmp_path / "specs").mkdir()
    report = subprocess.run(
        [STEPWISE, "label-report", "--tasks", str(tmp_path / "specs")], capture_output=True, text=True, env=env
    )
    assert report.returncode == 2 and report.stderr.strip().count("\n") == 0 and "no task specs" in report.stderr
    empty = subprocess.run([STEPWISE, "import-demos", str(tmp_path / "specs")], capture_output=True, text=True, env=env)
    assert empty.returncode == 2 and "no recordings" in empty.stderr and "Traceback" not in empty.stderr


def test_cli_labels_one_family_incrementally(small_demos, home):
    env = {"STEPWISE_HOME": str(home), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}

    def stepwise(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([STEPWISE, *args], capture_output=True, text=True, env=env, timeout=300)

    assert stepwise("import-demos", str(small_demos)).returncode == 0
    full = stepwise("label", "--embedder", "hashing")
    assert full.returncode == 0, full.stderr
    ledger = Warehouse(home).query("SELECT count(*) AS n FROM label_ledger").to_pylist()[0]["n"]
    assert ledger == Warehouse(home).query("SELECT count(*) AS n FROM episodes").to_pylist()[0]["n"] > 0
    again = stepwise("label", "--embedder", "hashing", "--families", "miniwob-forms", "--mode", "incremental")
    assert again.returncode == 0, again.stderr
    assert "miniwob-forms: 0 new episodes" in again.stdout
    bad = stepwise("label", "--embedder", "hashing", "--families", "miniwob-nope")
    assert bad.returncode == 2 and "unknown label families ['miniwob-nope']" in bad.stderr


def run_in_process(capsys, *argv: str) -> tuple[int, str, str]:
    """``stepwise *argv`` through the same ``main`` the command calls, in this process (a refusal
    needs no fresh interpreter; each test still runs the installed command once)."""
    from pipelines.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_flywheel_refuses_bad_settings_and_an_empty_home(home, capsys):
    env = {"STEPWISE_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"), "HF_HUB_OFFLINE": "1"}
    env["PATH"] = "/usr/bin:/bin"
    for args, message in (
        (["--policies", "sft,my-policy"], "--policies from"),
        (["--kinds", "orm,nope"], "unknown: ['nope']"),
        (["--rounds", "-1"], "--rounds >= 0"),
        (["--alternative-policies", "sft,mine"], "--alternative-policies from"),
        (["--top-k", "1"], "top_k must be at least 2"),
        (["--continuations", "-2"], "continuations and horizon must be 0 or more"),
        (["--recording-labels", "sometimes"], "recording_labels must be one of ['diverged', 'always', 'never']"),
    ):
        code, _, stderr = run_in_process(capsys, "flywheel", *args)
        assert code == 2 and message in stderr, (args, stderr)
    # No policy yet: nothing is trained, collected or recorded; the user is told what to run first.
    out = subprocess.run([STEPWISE, "flywheel"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "run `stepwise rl` first" in out.stdout, out.stdout + out.stderr
    assert Warehouse(home).query("SELECT count(*) FROM flywheel_rounds")[0][0].as_py() == 0


def test_rl_refuses_bad_seeds_and_flywheel_pins_in_one_line(home, capsys):
    """Seeds, flywheel and reward-model pins, and reward names (a malformed composed one says which part is wrong)
    are checked before anything runs: one line on stderr, exit 2."""
    env = {"STEPWISE_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"), "HF_HUB_OFFLINE": "1"}
    env["PATH"] = "/usr/bin:/bin"
    for args, message in (
        (["--seed-keys", "s0,s20"], "--seed-keys ['s20'] unknown"),
        (["--block", "sparse", "--seed-keys", "sparse-s5"], "(name the RL seed alone: --block adds the block's"),
        (["--runs", "orm", "--flywheel-round", "0"], "--flywheel-round >= 1"),
        (["--runs", "outcome,orm", "--flywheel-round", "1"], "['outcome'] use none"),
        (["--runs", "orm", "--flywheel-round", "1"], "flywheel round 1 trained no ['orm'] model (it has none"),
        (["--runs", "orm", "--reward-model", "orm-0123456789abcdef"], "no reward model 'orm-0123456789abcdef'"),
        (["--runs", "orm", "--reward-model", "orm-1", "--flywheel-round", "1"], "both pin reward models; give one"),
        (["--policy", "llm", "--reward-model", "orm-1"], "pin the learned policy's runs; the LLM agent"),
        (
            ["--runs", "outcome,outcome+progrm_env:linear"],
            "unknown form 'linear'; choose one of shaped, decay, shuffled",
        ),
        (["--runs", "outcome+progrm"], "say how the source is added"),
        # the estimator's suffix is not part of the form: the error names the form, not 'linear_kl_apart'
        (["--runs", "outcome+progrm_env:linear_kl_apart"], "unknown form 'linear'; choose one of"),
        (["--runs", "progrm_kl_apart"], "with _kl_apart for REINFORCE++ with its KL penalty kept out"),
        (["--reuse-sft", "--sft-seed", "1"], "--sft-seed (>= 0) trains a new SFT policy; --reuse-sft keeps"),
        (["--sft-seed", "-1"], "--sft-seed (>= 0) trains a new SFT policy"),
        (["--sft", "sft-0123456789", "--sft-seed", "1"], "--sft names one"),
        (["--sft", "sft-0123456789", "--runs", "outcome"], "--sft: no policy sft-0123456789 in the warehouse"),
        (["--sft", "sft-0123456789", "--tasks", "use-spinner"], "--sft: --tasks chooses a new SFT policy's"),
        (["--policy", "llm", "--sft", "sft-0123456789"], "--sft pin the learned policy's runs"),
        (["--runs", "progrm"], "or a composed reward outcome+<source>:<form>"),
    ):
        code, _, stderr = run_in_process(capsys, "rl", *args)
        assert code == 2 and message in stderr, (args, stderr)
        assert len(stderr.strip().splitlines()) == 1, stderr
    out = subprocess.run(
        [STEPWISE, "rl", "--seed-keys", "s0,s20"], capture_output=True, text=True, env=env, timeout=300
    )
    unknown = "stepwise rl: --seed-keys ['s20'] unknown; choose from " + str(list(RL_SEEDS))
    assert out.returncode == 2 and out.stderr.strip() == unknown, out.stderr


def test_the_summary_gives_a_check_one_line_and_shows_any_failed_run(capsys):
    """A check evaluated by several runs (one per partition or round) is one line of the summary,
    saying how many runs failed it; findings (WARN) are listed apart as yes/no."""
    from types import SimpleNamespace

    from dagster import AssetCheckSeverity, AssetKey

    from pipelines.cli.common import print_checks

    def evaluation(asset: str, name: str, passed: bool, severity=AssetCheckSeverity.ERROR):
        return SimpleNamespace(asset_key=AssetKey(asset), check_name=name, passed=passed, severity=severity)

    print_checks(
        [
            evaluation("rollouts", "rollouts_whole_episodes", True),
            evaluation("rollouts", "rollouts_whole_episodes", True),
            evaluation("progress_labels", "labels_in_unit_interval", True),
            evaluation("progress_labels", "labels_in_unit_interval", False),
            evaluation("progress_labels", "labels_in_unit_interval", True),
            evaluation("reward_model_report", "progrm_beats_orm", False, AssetCheckSeverity.WARN),
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "   data checks: 1 of 2 passed in every run",
        "   check rollouts_whole_episodes: passed (rollouts, 2 runs)",
        "   check labels_in_unit_interval: FAILED in 1 of 3 runs (progress_labels)",
        "   findings (claims this run tested; 'no' is a result, not a failure):",
        "     progrm_beats_orm: no",
    ]
    print_checks([evaluation("reward_model_report", "progrm_beats_orm", True, AssetCheckSeverity.WARN)])
    assert capsys.readouterr().out.splitlines()[0] == "   data checks: none ran"  # not "0 of 0 passed"


def test_the_demo_never_shrinks_the_demonstrations_a_home_holds(small_demos, home):
    """`stepwise demo` imports a sample per task, or as many per task as the home already holds."""
    from envs.miniwob.demonstrations import import_demonstrations
    from pipelines.cli.demo import _demo_sample

    assert _demo_sample(30) == 30 and _demo_sample(0) is None  # a new home: the sample asked for
    import_demonstrations(small_demos, Warehouse(home), workers=1, max_files_per_task=3)
    assert _demo_sample(1) == 3 and _demo_sample(5) == 5 and _demo_sample(0) is None


def test_reward_models_refuses_an_unknown_compared_model_before_training(home, capsys):
    """A mistyped ``--compare-models`` id is refused in one line before any model trains (it used to
    be found only by the report, after every kind had trained)."""
    from pipelines.cli import main

    assert main(["reward-models", "--kinds", "orm", "--compare-models", "orm-nowhere"]) == 2
    err = capsys.readouterr().err
    assert "--compare-models: no reward model 'orm-nowhere' in the models table" in err
    assert len(err.strip().splitlines()) == 1
    assert not Warehouse(home).has_table("models")  # nothing was trained


def test_figures_refuses_an_sft_policy_it_cannot_report_in_one_line(home, capsys):
    """``--sft`` names the RL section's SFT policy: a missing id, or another section, is exit 2 and one
    line (a typo used to print "not available" in the RL section and exit 0)."""
    from pipelines.cli import main

    for args, message in (
        (["--sft", "sft-0123456789"], "--sft: no policy sft-0123456789 in the warehouse"),
        (["--sft", "sft-0123456789", "--section", "demonstrations"], "--sft chooses the 'RL (ProgRM Table 1)'"),
    ):
        assert main(["figures", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_specs_validate_refuses_bad_arguments_before_it_opens_the_home(home, capsys):
    """One line each, exit 2, and the home is not created by a refused call."""
    for args, message in (
        (["envs/task_specs/nowhere"], "not a folder"),
        (["envs/task_specs/miniwob", "--per-task", "0"], "--per-task must be at least 1, not 0"),
        (["envs/task_specs/miniwob", "--purpose", "holiday"], "unknown --purpose 'holiday'; known: demonstration"),
    ):
        code, _, stderr = run_in_process(capsys, "specs", "validate", *args)
        assert code == 2 and message in stderr and stderr.strip().count("\n") == 0, (args, stderr)
    assert not home.exists()
