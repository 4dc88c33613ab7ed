"""One JSON object per log line; message text and credentials never reach it.

Code logs ids, counts, timings and reasons, never message text; as a second wall every
field of every line goes through the redaction pass the store uses (one pass guards
the store and the logs), and fields named like credentials lose their values whole.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from proxy.redaction.redact import redact_mapping

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
# uvicorn passes its message again with terminal colour codes, for its own coloured formatter:
# in JSON those are escape sequences (\u001b[1m...) that repeat `msg`.
_NOT_LOGGED = _STANDARD | {"color_message"}


class JsonFormatter(logging.Formatter):
    """Formats a record and its `extra` fields as compact JSON (`pid`: each line names the process)."""

    def __init__(self, *, pid: bool = False) -> None:
        super().__init__()
        self._pid = os.getpid() if pid else None

    def format(self, record: logging.LogRecord) -> str:
        extras = {k: v for k, v in vars(record).items() if k not in _NOT_LOGGED}
        extras["msg"] = record.getMessage()
        if record.exc_info:
            extras["exc"] = self.formatException(record.exc_info)
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        if self._pid is not None:
            entry["pid"] = self._pid
        # Only what the record carries can hold outside text; the fields above are ours.
        entry.update(redact_mapping(_plain(extras)))
        return json.dumps(entry, separators=(",", ":"))


def _plain(value: Any) -> Any:
    """JSON-ready data: containers kept, anything else JSON cannot hold as its text."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


class _ExpectedAbort(logging.Filter):
    """uvicorn's ERROR for a response left unfinished is, from memproxy, a deliberate abort.

    memproxy leaves a response unfinished only when its body cannot be finished: the
    provider's broke after its headers went out (the connection must close: a status
    already sent cannot change), or the server stopped at the end of its grace period. It has logged why at INFO;
    this line stays, as INFO, and says so.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Cancel %s running task(s), timeout graceful shutdown exceeded":
            # The grace period is over; each request it cut has ended its response and says so.
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        elif record.getMessage() == "ASGI callable returned without completing response.":
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "response aborted: its body could not be finished (see the line before)", ()
        return True


def mark_expected_aborts() -> None:
    """Have uvicorn's line for a response memproxy left unfinished say why, at INFO (idempotent)."""
    uvicorn_error = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ExpectedAbort) for f in uvicorn_error.filters):
        uvicorn_error.addFilter(_ExpectedAbort())


def configure(level: str, *, pid: bool = False) -> None:
    """Route memproxy's and uvicorn's loggers through the JSON formatter (`pid`: name the process
    on each line, as the workers of `memproxy serve --workers N` do)."""
    # A line carries none of the caller's file, thread or process: the logging HOWTO's
    # "Optimization" switches spare every record their lookup (a stack walk among them).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(pid=pid))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True

    # httpx logs every upstream call at INFO with its full URL: one line per request is ours.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
