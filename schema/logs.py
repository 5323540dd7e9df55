"""Logging for the engine and the gateway: text or JSON lines (python-json-logger), with the
view, batch id and request id as fields where a record has them."""

from __future__ import annotations

import logging
from contextvars import ContextVar

from pythonjsonlogger.json import JsonFormatter

from schema.settings import Settings

# The request a gateway log record belongs to (set per request by the gateway).
REQUEST_ID: ContextVar[str | None] = ContextVar("viewgate_request_id", default=None)

_TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class _RequestId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        return True


def configure_logging(settings: Settings) -> None:
    """One handler on the `viewgate` logger, replacing any earlier one (idempotent)."""
    handler = logging.StreamHandler()
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(
            "{asctime}{levelname}{name}{message}", style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter(_TEXT))
    handler.addFilter(_RequestId())
    logger = logging.getLogger("viewgate")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(settings.log_level.upper())
    logger.propagate = False
