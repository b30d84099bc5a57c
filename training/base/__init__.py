"""The shared base of every training stage: what a model reads, the frozen encoder and the model
registry (the statistics every stage reports with are one layer lower, :mod:`warehouse.statistics`,
since the spec validator in ``envs`` reports an AUC too).

* :mod:`~training.base.states`: text trajectories, the state at a step (ProgRM Eq. 6), screen
  and action texts, and a text's lexical match with the instruction.
* :mod:`~training.base.encoder`: the frozen sentence encoder (MiniLM on CPU, int8, batch-invariant)
  with its own config, fingerprint and embedding cache.
* :mod:`~training.base.registry`: the trained reward models the ``models`` table lists (the newest
  usable one of a kind, one by id).
* :mod:`~training.base.pretrained`: SmolLM2-135M-Instruct from its GGUF file.

The stages (``reward_models``, ``policy``, ``llm``, ``rl``, ``guidance``, ``flywheel``) stand on this
package; it imports none of them.
"""
