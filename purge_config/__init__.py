"""Configuration: the TOML file, checked whole before anything connects.

This room never imports temporalio, and psycopg only inside `dsn.py`'s functions (libpq
parses a connection string there), never when the package loads: a config can be checked (and
its errors shown as one line) on a machine that has neither server, and the types it shares
with the activities (`SweepSettings`, `Guards`, `TableName`) carry no dependency.
"""

from purge_config.errors import ConfigError
from purge_config.file import PurgeConfig, config_path, load_config, parse_config
from purge_config.schedules import ScheduleConfig

__all__ = [
    "ConfigError",
    "PurgeConfig",
    "ScheduleConfig",
    "config_path",
    "load_config",
    "parse_config",
]
