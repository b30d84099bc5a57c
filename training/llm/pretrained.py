"""Moved to :mod:`training.pretrained` (the reward models load the same checkpoints, and they sit
below the LLM layer); this name stays for imports written before the move."""

from training.pretrained import *  # noqa: F403
from training.pretrained import (  # noqa: F401 - the private helpers some callers use
    PretrainedModelError,
    check_gguf,
    load_gguf_causal_lm,
    load_smollm2,
    smollm2_gguf,
)
