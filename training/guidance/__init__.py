"""Reward-guided agents at inference time.

Nothing here changes a policy's weights: at every step a policy proposes N candidate actions, a
verifier scores them and the best is executed (GUI-Shepherd §4.2 Alg. 2 / Eq. 6; GuidNav §3.2
Eqs. 4-6; GUI-PRA Eq. 7), and after a failed episode a reflection guides the next attempt
(GuidNav §3.3).

* :mod:`training.guidance.proposals`: the N candidates of the learned CPU policy (its N most
  probable actions, or N sampled without replacement) and of the LLM policies (N answers).
* :mod:`training.guidance.verifiers`: the step PRM (one batch per step), the ProgRM progress gain,
  the milestone oracle (GuidNav's "top-k with oracle"), and how a verifier is chosen by name.
* :mod:`training.guidance.judge`: the GUI-PRA judge (dynamic memory, adaptive UI perception, the
  0-10 rubric) over any OpenAI-compatible endpoint, or on the local reward model without one.
* :mod:`training.guidance.agent`: the guided policy (``envs.protocol.Policy``) that runs it all.
* :mod:`training.guidance.reflection`: reflect-and-retry, and pass@R.
* :mod:`training.guidance.runs`: the stage (held-out evaluation of every method);
  :mod:`training.guidance.report`: its report.
"""
