"""Same seeds, same episodes, in live MiniWoB++ (Chromium): a greedy policy evaluated in memory
after its cache met other texts in other batches (as training leaves it) and the same checkpoint
reloaded with a cold cache act identically; the scoring service gives a request the same scores
whatever else is queued with it."""

from __future__ import annotations

import random

import pytest
import torch

from envs.miniwob.live import MiniWoBConfig
from envs.pool import EnvPool
from envs.pool_jobs import EpisodeJob, PoolConfig
from envs.protocol import EpisodeRecord
from envs.task_catalog import load_catalog
from training.policy.learned import LearnedPolicy, PolicyModel

pytestmark = pytest.mark.e2e

CATALOG = load_catalog("miniwob")
# tasks whose screens change as the agent acts (forms, tabs, a sequence), several seeds each
TASKS = ("login-user", "click-tab-2", "click-button-sequence", "enter-text")
SEEDS = (4_100_001, 4_100_002, 4_100_003)


def episode_signature(record: EpisodeRecord) -> tuple:
    """What an episode did: its actions, its outcome and its end."""
    return (
        record.task_id,
        record.seed,
        tuple(step.action.canonical_text() for step in record.steps),
        record.success,
        record.end_reason,
    )


def _jobs(prefix: str) -> list[EpisodeJob]:
    return [
        EpisodeJob(f"{prefix}:{task}:{seed}", CATALOG[task].spec, seed, CATALOG[task].max_steps, CATALOG[task].family)
        for task in TASKS
        for seed in SEEDS
    ]


@pytest.fixture(scope="module")
def pool():
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=0, start_timeout_s=180, reset_timeout_s=90)) as p:
        yield p


def test_a_reloaded_policy_acts_as_the_one_in_memory(pool, tmp_path):
    torch.manual_seed(11)
    in_memory = PolicyModel()
    in_memory.save(tmp_path / "policy")
    # Training leaves the cache full of the texts it met, encoded in large mixed batches: meet the
    # evaluation's texts once (a throwaway copy's cache collects them), then encode them that way.
    collector = PolicyModel.load(tmp_path / "policy", encoder=in_memory.encoder)
    pool.run(_jobs("collect"), LearnedPolicy(collector, policy_id="greedy", greedy=True))
    pool.run(_jobs("collect-sampled"), LearnedPolicy(collector, policy_id="sampler", temperature=1.0))
    texts = list(collector.cache._index)
    random.Random(0).shuffle(texts)
    in_memory.cache.indices(texts, batch_size=64)
    assert len(in_memory.cache) > 50

    greedy_in_memory = LearnedPolicy(in_memory, policy_id="greedy", greedy=True, record=True)
    first = pool.run(_jobs("eval"), greedy_in_memory)
    reloaded = PolicyModel.load(tmp_path / "policy", encoder=in_memory.encoder)  # a cold cache
    assert len(reloaded.cache) == 0
    greedy_reloaded = LearnedPolicy(reloaded, policy_id="greedy", greedy=True, record=True)
    second = pool.run(_jobs("eval"), greedy_reloaded)

    assert not first.lost and not second.lost
    ours = sorted(map(episode_signature, first.episodes))
    theirs = sorted(map(episode_signature, second.episodes))
    assert len(ours) == len(TASKS) * len(SEEDS)
    assert ours == theirs
    # not only the same choices: the same probabilities, bit for bit, at every step
    for episode, decisions in greedy_in_memory.decisions.items():
        assert [d.logp for d in decisions] == [d.logp for d in greedy_reloaded.decisions[episode]], episode
