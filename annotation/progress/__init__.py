"""Automatic progress labels: ProgRM's LCS self-annotation and the environment-milestone labels.

* :mod:`~annotation.progress.soft_lcs`, :mod:`~annotation.progress.grouping`,
  :mod:`~annotation.progress.recipes`: the soft LCS (ProgRM Eq. 3), grouping of similar steps, and
  the recipe libraries of successful trajectories (§2.2, stage 1).
* :mod:`~annotation.progress.key_steps`: key-step discovery and progress labels (stages 2-3, Eq. 4).
* :mod:`~annotation.progress.labeling`, :mod:`~annotation.progress.label_stream`,
  :mod:`~annotation.progress.label_state`: one family's labels, streamed and incremental.
* :mod:`~annotation.progress.label_runs`: labelling runs per family (what the assets call);
  :mod:`~annotation.progress.labels`: synthesis, the train/validation/test split and label quality.
* :mod:`~annotation.progress.synthesis`, :mod:`~annotation.progress.split`,
  :mod:`~annotation.progress.instruction_relative`, :mod:`~annotation.progress.text_similarity`,
  :mod:`~annotation.progress.plots`: the parts they share.
"""
