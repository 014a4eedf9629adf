"""The PereGRM training reward under its public name: `personaemp.reward` (TRL, verl's
`custom_reward_function.path` or `pkg://personaemp.reward`). The code lives in
personaemp/training/reward.py; this file re-exports its public names (its `__all__`), so that
verl's file loader, which runs a file under a fresh module name, gets the real module's objects."""

from personaemp.training.reward import *  # noqa: F403 - the public names, listed in its __all__
from personaemp.training.reward import __all__, __doc__  # noqa: F401
