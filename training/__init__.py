"""Learning from the labels: reward models (``reward_models``), the policies (``policy``, ``llm``),
RL (``rl``) and reward-guided inference (``guidance``), in that order of dependence."""
