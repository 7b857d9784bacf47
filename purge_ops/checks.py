"""Checks of a config against what the workflow accepts, made when a command starts: a config
whose passes the workflow would refuse is refused once, at start, not by every pass."""

from __future__ import annotations

import json

from activities.errors import BadPurgeInput
from activities.input_checks import parse_input
from purge_config.errors import ConfigError
from purge_config.file import PurgeConfig

#: Temporal warns from a payload of 512 KB (and fails one of 2 MB): a scheduled pass's input
#: must stay below the warning, or every pass would start under it.
PAYLOAD_WARNING_BYTES = 512 * 1024


def check_passes(config: PurgeConfig) -> None:
    """A ConfigError, one line, when the input of the config's scheduled pass is one the
    `Purge` workflow would refuse or one Temporal would warn about."""
    where = config.where
    request = config.pass_input()
    try:
        parse_input(request)
    except BadPurgeInput as err:
        raise ConfigError(
            f"{where}: every pass of this config would be refused: {err.message}"
        ) from None
    size = len(json.dumps(request).encode())
    if size > PAYLOAD_WARNING_BYTES:
        raise ConfigError(
            f"{where}: targets: the pass input would be {size // 1024} KB, over Temporal's "
            f"{PAYLOAD_WARNING_BYTES // 1024} KB payload warning; name these tables by a "
            'pattern (table = "tenant_*.sessions") instead of one by one'
        )


def check_targets(config: PurgeConfig, why: str) -> None:
    """A ConfigError, one line, when the config names no target: `why` says what then runs empty
    (a schedule's every pass, a sweep)."""
    if not config.target_names:
        raise ConfigError(
            f"{config.where}: names no target, so {why}; add [[targets]] "
            "(`pg-purge discover` suggests them)"
        )
