"""RL from step rewards (ProgRM Table 1): reward sources, estimators (REINFORCE++, GRPO, PPO,
RLOO), the learners of the CPU and LLM policies, the runs and their report."""
