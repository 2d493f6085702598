"""The machine's own scheduling delay during a run: a canary process.

The liveness bounds of a run (a waiter answers by its wait plus ``WAIT_SLACK``,
an instance serves within ``max_recovery`` of the database coming back) are
measured in wall-clock time by processes that share the machine with everything
else. On a loaded machine (CI: four pytest workers on two cores) a process that
is ready to run may wait for a CPU, and that wait is charged to the bound though
neither the service nor the database held anything.

The canary measures it: a separate process that sleeps in ticks of ``TICK`` and
notes each time it woke later than due (by more than ``THRESHOLD``) as a stall,
the wall-clock interval from when it should have run until it ran. The checker
credits a bound with the stall inside the interval it judges (``stalled``), and
the run reports it. The credit is what one ready process waited for a CPU: a
request crossing several processes (worker, instance, database) may have waited
at each, so it is a cautious estimate, and a service that holds a request for
seconds while the machine runs freely still gets no credit at all.

Run as ``python stall.py OUT``: after a first line, ``ticking``, it appends
``start end`` (wall clock, seconds) per stall to OUT until terminated, or until
its parent is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

TICK = 0.01
# A timer wake-up is late by tens of microseconds on an idle machine; later
# than this, the canary was ready and not running.
THRESHOLD = 0.002


def canary(out_path: str) -> None:
    parent = os.getppid()
    with open(out_path, "a", encoding="utf-8") as out:
        out.write("ticking\n")
        out.flush()
        due = time.monotonic() + TICK
        while os.getppid() == parent:
            time.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            late = now - due
            if late > THRESHOLD:
                wall = time.time()
                out.write(f"{wall - late:.6f} {wall:.6f}\n")
                out.flush()
            due = now + TICK


class StallCanary:
    """Starts the canary process; ``stop`` ends it and returns the stalls, as
    ``(start, end)`` wall-clock intervals in order."""

    def __init__(self, out: Path):
        self.out = out
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Start it, and return once it ticks."""
        self.out.touch()
        self.process = subprocess.Popen(
            [sys.executable, "-I", __file__, str(self.out)], stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while not self.out.read_text(encoding="utf-8"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the stall canary did not start")
            time.sleep(0.01)

    def read(self) -> list[tuple[float, float]]:
        """The stalls so far."""
        return read_stalls(self.out)

    def stop(self) -> list[tuple[float, float]]:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None
        return read_stalls(self.out)


def read_stalls(path: Path) -> list[tuple[float, float]]:
    stalls = []
    if not path.exists():  # never started
        return stalls
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2:  # a line cut short by the canary's end: skipped
            stalls.append((float(parts[0]), float(parts[1])))
    return stalls


def stalled(stalls, start: float, end: float) -> float:
    """Seconds of ``stalls`` (``(start, end)`` intervals) inside ``[start, end]``."""
    return sum(max(0.0, min(end, stop) - max(start, begin)) for begin, stop in stalls)


if __name__ == "__main__":
    canary(sys.argv[1])
