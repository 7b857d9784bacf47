"""The command line: `python worker.py [run|dev] ...` (installed as `pg-purge`).

Also the entry point for teams that build their worker in code: see `new_worker`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from activities.config import config_path, load_config
from activities.errors import ConfigError
from purge_ops import logs
from purge_ops.runner import new_worker

__all__ = ["main", "new_worker"]

PROG = "pg-purge"
COMMANDS = ("run", "dev")


def parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    top = argparse.ArgumentParser(
        prog=PROG,
        description="Retention sweeps for PostgreSQL, run as Temporal workflows.",
    )
    sub = top.add_subparsers(dest="command", metavar="command")

    run = sub.add_parser("run", help="run a worker on the task queue until SIGINT/SIGTERM")
    _config_option(run)

    dev = sub.add_parser(
        "dev",
        help="embedded Temporal and PostgreSQL with demo rows, a worker, and one pass now",
    )
    dev.add_argument("--once", action="store_true", help="exit after the first pass")
    return top


def _config_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--config",
        metavar="FILE",
        help="the TOML config (default: $PURGE_CONFIG, else ./purge.toml)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status: 0 done, 1 failed, 2 bad config or usage."""
    args = list(sys.argv[1:] if argv is None else argv)
    # `run` is the default command: `python worker.py --config F` runs a worker.
    if not args or (args[0] not in COMMANDS and args[0] not in ("-h", "--help")):
        args.insert(0, "run")
    opts = parser().parse_args(args)
    # `dev` prints its own report; only warnings from the worker belong on that screen.
    logs.configure(logging.WARNING if opts.command == "dev" else logging.INFO)
    try:
        if opts.command == "dev":
            from purge_ops.dev import run_dev

            return asyncio.run(run_dev(once=opts.once))
        config = load_config(config_path(opts.config))
        config.require_database_url()
        from purge_ops.runner import run_worker

        asyncio.run(run_worker(config))
        return 0
    except ConfigError as err:
        print(f"{PROG}: config error: {err}", file=sys.stderr)
        return 2
    except ConnectionError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
