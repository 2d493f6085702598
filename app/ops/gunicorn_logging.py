"""gunicorn's logger with the app's JSON formatter (``logger_class`` in
app/ops/gunicorn_conf.py).

gunicorn keeps its own handlers and settings (``--error-logfile``, ``--log-level``,
``--access-logfile``, log reopening on SIGUSR1); only their format changes. The
root logger gets the error log's handler too, so the app's records (which
propagate to the root) land in the same place, in the same format, and the app
adds no handler of its own.
"""

from __future__ import annotations

import logging

from gunicorn.glogging import Logger

from app.ops.logs import JsonFormatter


class JsonLogger(Logger):
    def _set_handler(self, log, output, fmt, stream=None):
        super()._set_handler(log, output, JsonFormatter(), stream)

    def setup(self, cfg):
        super().setup(cfg)
        root = logging.getLogger()
        for handler in list(root.handlers):
            if getattr(handler, "_gunicorn", False):
                root.removeHandler(handler)
        for handler in self.error_log.handlers:
            if getattr(handler, "_gunicorn", False):
                root.addHandler(handler)
