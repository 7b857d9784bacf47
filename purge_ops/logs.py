"""Log lines a person can read and a log pipeline can parse: message, then key=value fields."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from temporalio import activity, workflow

from activities.errors import PurgeError
from purge_config.errors import server_details, without_row_values

#: Attributes a `logging.LogRecord` has on its own; anything else came in through `extra=`.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    """`2026-11-29T10:00:00 INFO purge.worker message purge_target=x purge_removed=3`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s", "%Y-%m-%dT%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {
            key: value
            for key, value in vars(record).items()
            if key not in _STANDARD and key.startswith("purge_")
        }
        # Temporal's loggers put their context in `extra`; keep the ids that find the history.
        context = getattr(record, "temporal_activity", None) or getattr(
            record, "temporal_workflow", None
        )
        if isinstance(context, dict):
            for key in ("workflow_id", "attempt"):
                if key in context:
                    fields[key] = context[key]
        if fields:
            line += " " + " ".join(f"{key}={value}" for key, value in fields.items())
        return line


class OneLineRefusals(logging.Filter):
    """The SDK logs every failed activity with its traceback. For this package's own errors
    (a target the worker does not know, a table that is not ours, a guard that refused: each
    says all there is in its message) the line names the error and its message instead, as
    every other result of a target is one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, PurgeError):
            record.msg = f"{record.msg}: {error.type}: {error.message}"
            record.exc_info = record.exc_text = None
            record.purge_error = error.type  # among the fields, for a log pipeline
        return True


class NoRowValues(logging.Filter):
    """A server error's DETAIL left out of a line and its traceback (`without_row_values`):
    the SDK logs a failed activity with its error, and PostgreSQL quotes a row's values there
    (a duplicate key, a key still referenced, a failing row), a session token say."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        details = server_details(error)
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            # A format and arguments that do not match: the handler says so, as before.
            message = None
        kept = message and without_row_values(message, details)
        if kept != message:
            record.msg, record.args = kept, None
        if record.exc_info:
            text = record.exc_text or _TRACEBACKS.formatException(record.exc_info)
            record.exc_text = without_row_values(text, details)
        return True


#: Formats a record's traceback before `NoRowValues` takes the DETAIL out of it (the handler's
#: formatter then prints the text it is given).
_TRACEBACKS = logging.Formatter()


def handler(stream: TextIO) -> logging.Handler:
    """The handler `configure` installs, writing to `stream`."""
    written = logging.StreamHandler(stream)
    written.setFormatter(KeyValueFormatter())
    written.addFilter(OneLineRefusals())
    written.addFilter(NoRowValues())
    return written


def configure(level: int = logging.INFO) -> None:
    """Send this package's and Temporal's log lines to stderr in the key=value form."""
    root = logging.getLogger()
    root.handlers[:] = [handler(sys.stderr)]
    root.setLevel(level)
    # The context goes into fields (above) rather than a dict appended to every message.
    activity.logger.activity_info_on_message = False
    workflow.logger.workflow_info_on_message = False
