"""purge_config/specs.py without a server: the closed sets of a `[[targets]]` entry (`unit`,
`partitions`) checked at the config's edge, every value of each `Literal` accepted and anything
else refused naming the key and the value."""

from __future__ import annotations

from typing import get_args

import pytest

from purge_config import ConfigError, parse_config
from purge_config.settings import EPOCH_UNITS, PARTITION_MODES, EpochUnit, PartitionMode

EXPIRING = {"kind": "expiring", "name": "e", "table": "events", "column": "at"}


class TestUnit:
    def test_the_set_is_its_literal(self) -> None:
        assert EPOCH_UNITS == get_args(EpochUnit) == ("ms", "s", "us")

    @pytest.mark.parametrize("unit", EPOCH_UNITS)
    def test_each_unit_is_read(self, unit: EpochUnit) -> None:
        config = parse_config({"targets": [{**EXPIRING, "unit": unit}]}, env={})

        assert config.targets[0].unit == unit

    def test_a_missing_unit_is_milliseconds(self) -> None:
        assert parse_config({"targets": [EXPIRING]}, env={}).targets[0].unit == "ms"

    @pytest.mark.parametrize("unit", ["ns", "MS", 1000])
    def test_another_unit_is_refused_naming_it(self, unit: object) -> None:
        with pytest.raises(ConfigError, match=rf"unit: .*one of ms, s, us, got {unit!r}"):
            parse_config({"targets": [{**EXPIRING, "unit": unit}]}, env={})


class TestPartitionMode:
    def test_the_set_is_its_literal(self) -> None:
        assert PARTITION_MODES == get_args(PartitionMode) == ("delete", "drop", "detach")

    @pytest.mark.parametrize("mode", ["delete", "drop"])
    def test_each_mode_is_read(self, mode: PartitionMode) -> None:
        config = parse_config({"targets": [{**EXPIRING, "partitions": mode}]}, env={})

        assert config.targets[0].partitions.mode == mode

    def test_detach_is_read_with_its_schema(self) -> None:
        entry = {**EXPIRING, "partitions": "detach", "detached_schema": "old"}
        policy = parse_config({"targets": [entry]}, env={}).targets[0].partitions

        assert (policy.mode, policy.detached_schema) == ("detach", "old")

    @pytest.mark.parametrize("mode", ["truncate", "DROP", True])
    def test_another_mode_is_refused_naming_it(self, mode: object) -> None:
        with pytest.raises(ConfigError, match=rf"partitions: must be one of .*got {mode!r}"):
            parse_config({"targets": [{**EXPIRING, "partitions": mode}]}, env={})


@pytest.mark.parametrize(
    ("kind", "hint"),
    [
        ("expirng", " (did you mean 'expiring'?)"),
        ("django_session", " (did you mean 'django_sessions'?)"),
        ("zzz", ""),
        (7, ""),
    ],
)
def test_an_unknown_kind_is_refused_with_the_nearest_one(kind: object, hint: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"targets": [{**EXPIRING, "kind": kind}]})
    assert str(refused.value).endswith(f", got {kind!r}{hint}"), refused.value
