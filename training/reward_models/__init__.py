"""Reward models: ORM, ProgRM (LCS and environment-milestone labels), the PRM and GuidNav's step reward.

* :mod:`~training.reward_models.kinds`: the kinds (one enum) and what each learns.
* :mod:`~training.reward_models.prompts`: the prompts of ProgRM Tables 7-8 with the truncation
  rule (what a model reads, ProgRM Eq. 6, is :mod:`training.base.states`, shared with the policies).
* :mod:`~training.reward_models.labels`: the label maths (progress gains, Eq. 2; step verdicts).
* :mod:`~training.reward_models.examples`, :mod:`~training.reward_models.readers`,
  :mod:`~training.reward_models.dataset`: examples from plain data, the warehouse readers, and
  one kind's dataset built from the warehouse.
* :mod:`~training.reward_models.models`: the frozen-encoder CPU model (over the shared
  :mod:`training.base.encoder`) and the LLM profile.
* :mod:`~training.reward_models.train`: Hugging Face Trainer (``python -m training.reward_models.train``).
* :mod:`~training.reward_models.evaluate`: the held-out report (ProgRM Tables 2-3); the registry of
  trained models is :mod:`training.base.registry`, the statistics :mod:`warehouse.statistics`.
* :mod:`~training.reward_models.serving` / :mod:`~training.reward_models.serving_app`: batch
  scoring and its HTTP service.
* :mod:`~training.reward_models.runs`: the stage (datasets, training runs, report) the assets call.
"""
