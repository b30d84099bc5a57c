"""Policies and how they are judged: the candidates of a screen, the learned CPU policy and its SFT
on demonstrations, evaluation on held-out seeds, and where trained policies are found."""
