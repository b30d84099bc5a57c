"""Guided agents in live MiniWoB++ (Chromium) and against a real OpenAI-compatible server
(``transformers serve`` on the tiny Qwen2 of ``tiny_causal_lm_path``): the oracle's best-of-N,
reflect-and-retry with bans, and the GUI-PRA judge end to end over the endpoint, in its local
mode, and with the LLM policy proposing over the same server."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from envs.miniwob.live import MiniWoBConfig
from envs.pool import EnvPool
from envs.pool_jobs import EpisodeJob, PoolConfig
from envs.task_catalog import load_catalog
from tests.training.guidance.test_guidance import _free_port, train_tiny_prm
from training.guidance.agent import GuidedPolicy, step_summary
from training.guidance.judge import JudgeSettings
from training.guidance.proposals import LearnedProposer, LLMProposer
from training.guidance.reflection import pass_at, reflect
from training.guidance.registry import make_verifier
from training.guidance.runs import Setting, run_setting
from training.llm.chat_client import ChatClient, ChatEndpoint
from training.llm.policy import EndpointPolicy
from training.policy.learned import PolicyModel

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]
CATALOG = load_catalog("miniwob")
LOGIN = CATALOG["login-user"]
SEEDS = [3_000_101, 3_000_202]


@pytest.fixture(scope="module")
def pool():
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=0, start_timeout_s=180, reset_timeout_s=90)) as p:
        yield p


@pytest.fixture(scope="module")
def trained_prm(tiny_examples, tmp_path_factory):
    return train_tiny_prm(tiny_examples["prm"], tmp_path_factory.mktemp("trained-prm"))


@pytest.fixture(scope="module")
def untrained():
    return PolicyModel()  # a real scorer with random weights: it rarely solves anything alone


def _jobs(prefix: str, task=LOGIN, seeds=SEEDS, max_steps: int | None = None) -> list[EpisodeJob]:
    return [EpisodeJob(f"{prefix}:{s}", task.spec, s, max_steps or task.max_steps, task.family) for s in seeds]


def test_best_of_n_with_the_oracle_solves_what_the_policy_alone_does_not(pool, untrained):
    base = pool.run(_jobs("base"), GuidedPolicy(LearnedProposer(untrained), None, 1))
    oracle = GuidedPolicy(LearnedProposer(untrained), make_verifier("oracle"), 16)
    guided = pool.run(_jobs("oracle"), oracle)
    assert guided.successes == len(SEEDS) > base.successes
    summary = step_summary(oracle.logs)
    assert summary["changed_choice"] > 0 and summary["verifier_calls"] == 0  # the oracle is not a model


def test_retries_ban_where_the_failed_attempt_went_wrong_and_pass_at_k_never_falls(pool, untrained):
    setting = Setting("retry", "retry:R=2", None, 1, "2", 2)
    result = run_setting(pool, setting, LearnedProposer(untrained), None, [LOGIN], SEEDS, policy_id="untrained")
    attempts: dict[int, list] = {}
    for record, attempt in result.records:
        attempts.setdefault(record.seed, []).append((attempt, record))
    reached = 0
    for items in attempts.values():
        items.sort(key=lambda item: item[0])
        assert [a for a, _ in items] == list(range(len(items)))
        assert all(not r.success for _, r in items[:-1])  # an instance stops at its first success
        for (_, failed), (attempt, retried) in zip(items, items[1:], strict=False):
            reflection, source, bans = result.given[retried.episode_id]
            assert source == "template" and reflection and bans == attempt
            blamed = reflect(failed).blamed_step
            assert blamed is not None
            before = [s.action.canonical_text() for s in failed.steps]
            after = [s.action.canonical_text() for s in retried.steps]
            # The random policy's choices can differ between attempts of one seed (seen; cause not isolated), so a
            # retry does not always reach the state where its predecessor was blamed; when it does:
            if after[:blamed] == before[:blamed] and len(after) > blamed:
                reached += 1
                assert result.logs[retried.episode_id][blamed].banned >= 1  # the ban met there ...
                assert after[blamed] != before[blamed]  # ... and something else done
    assert reached  # the bans were exercised
    outcomes = [[r.success for _, r in sorted(items, key=lambda item: item[0])] for items in attempts.values()]
    passes = [pass_at(outcomes, k) for k in (1, 2, 3)]
    assert passes == sorted(passes) and passes[0] == sum(o[0] for o in outcomes) / len(outcomes)


def _serve(model_path: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    log = log_path.open("w")
    server = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "transformers"), "serve", "--host", "127.0.0.1", "--port", str(port),
         "--device", "cpu", model_path],
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 180
    while True:
        assert server.poll() is None, log_path.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if response.status == 200:
                    return server, f"http://127.0.0.1:{port}/v1"
        except OSError:
            pass
        assert time.time() < deadline, "transformers serve did not come up"
        time.sleep(0.3)


def _stop(server: subprocess.Popen) -> None:
    os.killpg(server.pid, 15)
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, 9)
        server.wait()


def test_the_judge_end_to_end_against_transformers_serve_and_in_local_mode(
    pool, untrained, trained_prm, tiny_causal_lm_path, tmp_path
):
    server, url = _serve(tiny_causal_lm_path, tmp_path / "serve.log")
    try:
        settings = JudgeSettings(endpoint=url, model=tiny_causal_lm_path, timeout_s=120, max_tokens=24)
        judge = make_verifier("judge", checkpoint=trained_prm, judge=settings)
        policy = GuidedPolicy(LearnedProposer(untrained), judge, 3)
        result = pool.run(_jobs("judged", seeds=SEEDS[:1], max_steps=3), policy)
        (record,) = result.episodes
        steps = policy.logs[record.episode_id]
        assert len(steps) == record.n_steps >= 1  # every step judged (or fallen back), to the episode's end
        client = judge.client  # type: ignore[attr-defined]
        # at least one call per candidate per step (a screen may offer fewer than N candidates)
        assert client is not None and client.calls >= sum(step.n_candidates for step in steps) >= len(steps)
        for step in steps:
            assert step.mode in ("endpoint", "fallback")
            assert step.mode == "endpoint" or "unparsable" in step.note or "endpoint failed" in step.note
            assert all(s is not None for s in step.scores)  # fallback: the local PRM scored what the LLM did not

        # the LLM policy proposes over the same server (first answer greedy, then sampled)
        llm = EndpointPolicy(ChatClient(ChatEndpoint(url, tiny_causal_lm_path, timeout_s=120)), max_tokens=24)
        guided = GuidedPolicy(LLMProposer(llm, temperature=1.0), judge, 2)
        result = pool.run(_jobs("llm", seeds=SEEDS[:1], max_steps=2), guided)
        (record,) = result.episodes
        logs = guided.logs[record.episode_id]
        assert len(logs) == record.n_steps and all(s.policy_calls == 2 for s in logs)
        assert llm.counters.steps == 2 * record.n_steps  # N = 2 answers per step

        reflection = reflect(record, ChatClient(ChatEndpoint(url, tiny_causal_lm_path, timeout_s=120)), max_tokens=24)
        assert reflection.text and reflection.source in ("endpoint", "template")
    finally:
        _stop(server)

    local = make_verifier("judge", checkpoint=trained_prm, judge=JudgeSettings())
    policy = GuidedPolicy(LearnedProposer(untrained), local, 3)
    result = pool.run(_jobs("local", seeds=SEEDS[:1], max_steps=3), policy)
    steps = policy.logs[result.episodes[0].episode_id]
    assert steps and all(s.mode == "local" and "local mode" in s.note for s in steps)


def test_a_guidance_setting_run_twice_gives_the_same_episodes(pool, trained_prm, tmp_path):
    """PRM best-of-4, once, then again with the policy reloaded and a fresh verifier (both caches
    cold): the same actions and successes on every seed (issue 21: 'varied (N=5: 3 vs 9 of 40)')."""
    import torch

    torch.manual_seed(5)
    policy = PolicyModel()
    policy.save(tmp_path / "policy")
    setting = Setting("prm", "prm:N=4", "prm", 4)
    tasks = [LOGIN, CATALOG["click-tab-2"]]
    runs = []
    for model in (policy, PolicyModel.load(tmp_path / "policy", encoder=policy.encoder)):
        verifier = make_verifier("prm", checkpoint=trained_prm)
        result = run_setting(pool, setting, LearnedProposer(model), verifier, tasks, SEEDS, policy_id="p")
        assert not result.lost
        runs.append(
            sorted(
                (r.task_id, r.seed, tuple(s.action.canonical_text() for s in r.steps), r.success)
                for r, _ in result.records
            )
        )
    assert len(runs[0]) == len(tasks) * len(SEEDS)
    assert runs[0] == runs[1]
