"""Loaded (via PYTHONPATH) only into the app instance that runs under libfaketime.

libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 makes CPython's
``time.sleep`` fail with EINVAL (it sleeps with clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME), whose deadline the library shifts anyway); without that variable,
``threading.Event.wait`` never returns. So monotonic time stays true and sleeping
goes through ``select``, whose relative timeout the library leaves alone.
"""

import select
import time


def _sleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        select.select([], [], [], remaining)


time.sleep = _sleep
