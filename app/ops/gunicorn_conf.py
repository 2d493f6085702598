"""Production defaults for gunicorn.

    gunicorn -c python:app.ops.gunicorn_conf 'app:create_app()'

Command-line flags override these (``-w 8``, ``-b 0.0.0.0:8000``), and so do the
``LOCKKEEPER_*`` variables read below. See docs/deploy.md.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import tempfile

# Must happen before anything imports prometheus_client: it picks its multiprocess
# value class at import time, and workers inherit whatever the master imported.
# A folder made here is this server's own: removed when the server exits.
_OWN_METRICS_DIR = None
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _OWN_METRICS_DIR = tempfile.mkdtemp(prefix="lockkeeper-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _OWN_METRICS_DIR


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


bind = os.environ.get("LOCKKEEPER_BIND", "127.0.0.1:8000").split(",")
# Requests are short and wait on the database: a few processes with a few threads
# each. gthread, not sync: a sync worker is killed after `timeout` while it streams
# a long audit export.
workers = _env_int("LOCKKEEPER_WORKERS", min(2 * (os.cpu_count() or 1), 8))
worker_class = "gthread"
# A waiting acquire ("wait" > 0) holds its thread until it is granted or gives up:
# each worker keeps 4 threads for everything else on top of the waiting room
# (LOCKKEEPER_MAX_WAITERS, 16 by default), so waiters never starve the releases
# they wait for. See docs/deploy.md, "Sizing".
# An event stream holds its thread too, so its cap (LOCKKEEPER_MAX_STREAMS) is
# added on top (docs/deploy.md, "Event streams").
threads = _env_int(
    "LOCKKEEPER_THREADS",
    4 + _env_int("LOCKKEEPER_MAX_WAITERS", 16) + _env_int("LOCKKEEPER_MAX_STREAMS", 8),
)
# A connection's thread is taken as soon as it is accepted and held while its
# headers arrive: a few dozen clients that never finish their headers (slowloris)
# hold every thread of a one-worker server. gunicorn is not meant to face
# clients: keep it behind the proxy (docs/deploy.md §5), which reads each
# request whole before passing it on (nginx buffers; HAProxy's
# `timeout http-request`).
# Each worker opens its own pool after the fork; nothing is shared across it.
preload_app = False

timeout = 30
# SIGTERM: stop accepting, let in-flight requests finish for up to this long.
graceful_timeout = _env_int("LOCKKEEPER_GRACEFUL_TIMEOUT", 30)
# Longer than the proxy's upstream idle timeout would leave it reusing closed
# connections; nginx keeps upstream connections 60 s, so answer them a bit longer.
keepalive = 75
# Recycle workers now and then (memory creep); jitter keeps them from all
# restarting at once. Their counters survive in the multiprocess directory.
max_requests = 10_000
max_requests_jitter = 1_000

# gunicorn's default request limits stay: a request line over 4094 bytes gets its
# 414 (documented in the OpenAPI); resource names are at most 255 characters.
# Trust X-Forwarded-* only from the reverse proxy.
forwarded_allow_ips = os.environ.get("LOCKKEEPER_FORWARDED_ALLOW_IPS", "127.0.0.1,::1")

proc_name = "lockkeeper"
# The heartbeat file on tmpfs: a disk-backed /tmp can stall it and get healthy
# workers killed.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
# No runtime control socket (~/.gunicorn/): nothing uses it, and several servers
# of one user would collide on it.
control_socket_disable = True

# The app writes its own structured line per request (app/ops/request_log.py) to
# stderr, next to gunicorn's error log; no second access log.
accesslog = None
errorlog = "-"
loglevel = os.environ.get("LOCKKEEPER_LOG_LEVEL", "info")
# gunicorn's own lines (booting, worker timeouts, signals) and everything the app
# logs go through one JSON formatter to the error log (stderr by default): one
# JSON object per line. `--error-logfile` and `--log-level` keep working.
logger_class = "app.ops.gunicorn_logging.JsonLogger"


def on_starting(server) -> None:
    """Start every run with empty metric files: old workers' pids are gone."""
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    os.makedirs(directory, exist_ok=True)
    for path in glob.glob(os.path.join(directory, "*.db")):
        os.remove(path)


def post_worker_init(worker) -> None:
    """The app is loaded in this worker: keep its objects out of the
    collector's full passes (``app.ops.heap``), and end its event streams as
    soon as a graceful shutdown begins."""
    from app.ops.heap import freeze_loaded_app

    freeze_loaded_app()
    if worker is not None:
        _stop_streams_on_sigterm(worker)


def _stop_streams_on_sigterm(worker) -> None:
    """gunicorn has no hook for SIGTERM (a graceful stop): its worker waits up to
    ``graceful_timeout`` for open responses, and an event stream never ends by
    itself. So the worker's own handler is wrapped: the streams end first."""
    previous = signal.getsignal(signal.SIGTERM)

    def stopping(signum, frame) -> None:
        _stop_streams(worker)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, stopping)


def _stop_streams(worker) -> None:
    from app.api.events import stop_streams

    app = getattr(worker, "wsgi", None)
    if app is not None and hasattr(app, "extensions"):
        stop_streams(app)


def worker_int(worker) -> None:
    """SIGINT or SIGQUIT (a quick stop): end the event streams too."""
    _stop_streams(worker)


def child_exit(server, worker) -> None:
    """Let the metrics of a dead worker stop counting as live (gauges)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def worker_exit(server, worker) -> None:
    """Close the waiters' LISTEN connection before the worker goes, rather than
    have PostgreSQL see it drop with the process."""
    from lockkeeper_core.queue import stop_background

    _stop_streams(worker)
    stop_background()


def on_exit(server) -> None:
    """Remove the metrics folder this server made for itself (none is left in
    the temp dir per start); one the operator named is left alone."""
    if _OWN_METRICS_DIR is not None:
        shutil.rmtree(_OWN_METRICS_DIR, ignore_errors=True)
