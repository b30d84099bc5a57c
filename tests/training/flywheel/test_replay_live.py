"""Deterministic replay on live MiniWoB++ in Chromium: recorded episodes, stored in the warehouse and
read back, are reached again step by step; a state that is not the recorded one is refused; the
policy continues after a candidate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from envs.miniwob.live import MiniWoBConfig
from envs.policies import NoisyExpertPolicy
from envs.pool import EnvPool
from envs.pool_jobs import EpisodeJob, PoolConfig, plan_jobs
from envs.protocol import episode_tables, restore_by_steps, screen_signature
from envs.spec_validation import replay_milestones
from envs.task_catalog import load_catalog
from training.flywheel.replay import DIVERGED, ReplayPlan, ReplayPolicy, replay_outcome
from training.policy.learned import LearnedPolicy, PolicyModel
from warehouse.catalog import Materialization, Warehouse
from warehouse.model import Screen
from warehouse.purposes import EpisodePurpose
from warehouse.trajectories import load_trajectories

pytestmark = pytest.mark.e2e

TASKS = ("login-user", "click-tab-2-medium")


def test_recorded_episodes_replay_step_by_step_and_another_state_is_refused(tmp_path):
    catalog = load_catalog("miniwob")
    tasks = [catalog[t] for t in TASKS]
    with EnvPool(MiniWoBConfig(), PoolConfig(workers=2, spares=0)) as pool:
        recorded = pool.run(plan_jobs(tasks, batch="b", seeds=[11, 12]), NoisyExpertPolicy(noise=0.3))
        assert len(recorded.episodes) == 4
        warehouse = Warehouse(tmp_path / "home")
        episodes, steps = episode_tables(recorded.episodes, purpose=EpisodePurpose.EXPLORATION)
        m = Materialization(asset="rollouts")
        warehouse.publish(
            m, [warehouse.stage_table("episodes", "b", episodes, m), warehouse.stage_table("steps", "b", steps, m)]
        )
        stored = {t.episode_id: t for t in load_trajectories(warehouse)}  # screens as the warehouse keeps them
        live = {r.episode_id: r for r in recorded.episodes}
        for episode_id, traj in stored.items():  # the final screen and the spec version are stored: an exact replay
            spec = catalog[traj.task_id].spec
            assert traj.final_screen is not None
            assert screen_signature(traj.final_screen) == screen_signature(live[episode_id].final_screen)
            assert traj.spec_digest == spec.milestone_digest
            assert replay_milestones(spec, traj).hits == traj.milestones_hit

        # every step of every episode: reach its state again and carry the recorded action out
        plans: dict[str, ReplayPlan] = {}
        jobs: list[EpisodeJob] = []
        for episode_id, traj in stored.items():
            record = live[episode_id]
            spec = catalog[record.task_id]
            for t in range(traj.n_steps):
                reached = sum(len(h) for h in (traj.milestones_hit or ())[:t])
                plan = ReplayPlan(
                    traj.actions[:t], traj.screens[: t + 1], traj.actions[t], 0, traj.instruction, reached
                )
                job_id = f"replay:{episode_id}:{t}"
                plans[job_id] = plan
                jobs.append(plan.job(job_id, spec.spec, record.seed, spec.family))
        replays = pool.run(jobs, ReplayPolicy(plans))
        assert not replays.lost, replays.lost
        for replay in replays.episodes:
            episode_id, step = replay.episode_id.removeprefix("replay:").rsplit(":", 1)
            t = int(step)
            original = live[episode_id]
            outcome = replay_outcome(replay)
            assert outcome.milestones_hit == original.steps[t].milestones_hit  # the same step, the same effect
            last = t == original.n_steps - 1
            assert outcome.ended == (last and original.end_reason != "max_steps")
            after = original.final_screen if last else original.steps[t + 1].screen
            assert screen_signature(replay.final_screen) == screen_signature(after)
            assert outcome.replay_ms > 0

        # the same states reached step by step (every screen read and compared): the same screens
        slow = MiniWoBConfig().create()
        try:
            for job in jobs[:: max(1, len(jobs) // 6)]:
                assert job.start is not None
                by_steps = restore_by_steps(slow, job.task, job.seed, job.start)
                assert screen_signature(by_steps.screen) == screen_signature(job.start.screens[-1])
        finally:
            slow.close()

        # a state that is not the recorded one: refused, counted as lost by the pool, never labelled
        job = next(j for j in jobs if plans[j.episode_id].step >= 1)
        plan = plans[job.episode_id]
        state = plan.screens[-1]
        other = Screen(tuple(replace(e, ref=f"9{e.ref}") for e in state.elements))  # the same page, other refs
        wrong = replace(plan, screens=(*plan.screens[:-1], other))
        refused = pool.run([wrong.job(job.episode_id, job.task, job.seed)], ReplayPolicy({job.episode_id: wrong}))
        assert not refused.episodes and refused.lost[0][1].startswith(DIVERGED), refused.lost
        assert [a.status for a in refused.attempts] == ["aborted"]  # not retried: it would diverge again

        # the policy continues after the candidate, with the prefix and the candidate as its past
        first = next(j for j in jobs if plans[j.episode_id].step == 0 and j.task.task_id == "login-user")
        go_on = replace(plans[first.episode_id], continuation_steps=3)
        continuing = LearnedPolicy(PolicyModel(), policy_id="continue:test", temperature=1.0)
        again = [go_on.job(f"{first.episode_id}:c{j}", first.task, first.seed) for j in range(2)]
        result = pool.run(again, ReplayPolicy({j.episode_id: go_on for j in again}, continuing))
        assert len(result.episodes) == 2
        for record in result.episodes:
            outcome = replay_outcome(record)
            assert outcome.continued or outcome.ended
            assert record.steps[0].action == go_on.candidate
