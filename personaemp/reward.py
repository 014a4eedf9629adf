"""The PereGRM training reward under its public name: `personaemp.reward` (TRL, verl's
`custom_reward_function.path` or `pkg://personaemp.reward`). The code lives in
personaemp/training/reward.py; this file only hands its names on, so that verl's file
loader, which runs a file under a fresh module name, gets the real module's objects."""

import personaemp.training.reward as _reward
from personaemp.training.reward import *  # noqa: F403  (its __all__: the reward's public names)
from personaemp.training.reward import (  # noqa: F401  (what a verl worker or a script may also use)
    CONFIG_VAR,
    STEPS,
    completion_text,
    default_reward,
    rollout_from,
)

__doc__ = _reward.__doc__
__all__ = [*_reward.__all__, "CONFIG_VAR", "STEPS", "completion_text", "default_reward", "rollout_from"]
