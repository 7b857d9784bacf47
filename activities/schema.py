"""The reference DDL shipped with the package, for migrations, `dev` mode and tests."""

from __future__ import annotations

from importlib.resources import files


def reference_ddl() -> str:
    """The text of `activities/schema.sql`: the built-in targets' tables and indexes."""
    return files("activities").joinpath("schema.sql").read_text(encoding="utf-8")
