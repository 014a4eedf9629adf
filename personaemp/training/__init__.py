"""Train with the paper's reward: PereGRM for TRL and verl, and the training files (export)."""
