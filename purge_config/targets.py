"""Compatibility alias of `purge_config.specs`, this module's name before the rooms were renamed.
It holds nothing of its own: new code imports from `purge_config.specs`."""

from purge_config.settings import EPOCH_UNITS
from purge_config.specs import (
    SWEEP_FLAGS,
    SWEEP_KEYS,
    SWEEP_PACING,
    Factory,
    TargetSpec,
    parse_target,
    sweep_settings,
)

__all__ = [
    "EPOCH_UNITS",
    "SWEEP_FLAGS",
    "SWEEP_KEYS",
    "SWEEP_PACING",
    "Factory",
    "TargetSpec",
    "parse_target",
    "sweep_settings",
]
