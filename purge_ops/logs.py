"""Log lines a person can read and a log pipeline can parse: message, then key=value fields."""

from __future__ import annotations

import logging
import sys

from temporalio import activity, workflow

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


def configure(level: int = logging.INFO) -> None:
    """Send this package's and Temporal's log lines to stderr in the key=value form."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The context goes into fields (above) rather than a dict appended to every message.
    activity.logger.activity_info_on_message = False
    workflow.logger.workflow_info_on_message = False
