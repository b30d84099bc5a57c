"""The reward flywheel: the agent's own episodes as reward-model data, and the metrics that judge
reward models on them (ProgRM §3 "Reward model training data"; GuidNav §4 self-play).

* :mod:`~training.flywheel.collection`: policy rollouts, sampled from checkpoints at temperature;
* :mod:`~training.flywheel.metrics`: each reward model's episode scores against success on held-out
  policy episodes (AUC with intervals, per task family).
"""
