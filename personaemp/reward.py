"""The PereGRM training reward under its public name: `personaemp.reward` (TRL, verl's
`custom_reward_function.path` or `pkg://personaemp.reward`). The code lives in
personaemp/training/reward.py; this file only hands its names on, so that verl's file
loader, which runs a file under a fresh module name, gets the real module's objects."""

import personaemp.training.reward as _reward

globals().update({name: value for name, value in vars(_reward).items() if not name.startswith("__")})
__doc__ = _reward.__doc__
