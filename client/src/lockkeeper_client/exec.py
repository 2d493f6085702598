"""``lockkeeper-exec`` (and ``lockkeeper exec`` on a server install): run a command
only while holding a lock, like flock(1) across machines.

A pure HTTP client of the JSON API: it needs neither the server nor a database, so
a cron host installs only ``lockkeeper-client``.

The API token comes from ``LOCKKEEPER_TOKEN`` or ``--token-file`` (``--token``
works, with a warning: every local user can read a process's arguments). The
command never sees the token: it is removed from the command's environment, which
gets ``LOCKKEEPER_FENCE``, ``LOCKKEEPER_RESOURCE`` and ``LOCKKEEPER_OWNER`` instead.

Exit status:

- the command's own status (128 + N when a signal N ended it), after the release;
- 75 (EX_TEMPFAIL): the lock could not be had within ``--wait``, or the service
  could not be reached; the command did not run;
- 76: the lock was lost while the command ran; the command was terminated
  (SIGTERM, then SIGKILL after ``--grace`` seconds). With ``--on-lost=warn`` the
  command keeps running and its own status is returned;
- 77 (EX_NOPERM): the token was refused, or may not lock this resource;
- 126 / 127: the command could not be executed / was not found (as in a shell);
- 2: bad usage (no URL or token, bad option or resource).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import click
from click.core import ParameterSource

from lockkeeper_client import (
    AccessDenied,
    AuthenticationFailed,
    HeldLock,
    InvalidRequest,
    LockClient,
    LockClientError,
    LockKind,
    LockNotAcquired,
    LockSession,
    ServiceUnavailable,
    default_owner,
)

EXIT_NOT_ACQUIRED = 75
EXIT_LOCK_LOST = 76
EXIT_AUTH_FAILED = 77
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_INTERVAL = 0.1
# Never handed to the command: with LOCKKEEPER_OWNER it could act as the holder,
# or use the token for anything else the token may do.
WITHHELD_FROM_COMMAND = ("LOCKKEEPER_TOKEN",)


class _Interrupted(Exception):
    """A forwarded signal arrived before the command had started."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"lockkeeper exec: {message}", err=True)
    sys.exit(code)


_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> float | None:
    """Seconds, or a number with s, m, h or d."""
    if value is None:
        return None
    found = _DURATION.fullmatch(value)
    if found is None:
        raise click.BadParameter(f"{value!r} is not a duration like 90, 90s, 5m or 1h")
    return float(found.group(1)) * _UNITS[found.group(2)]


def _seconds_option(
    name: str,
    default: float,
    help: str,  # noqa: A002
    *,
    positive: bool = False,
) -> Callable[[Any], Any]:
    """A float option in seconds; 0 allowed unless ``positive``."""
    return click.option(
        name,
        type=click.FloatRange(min=0, min_open=positive),
        default=default,
        help=help,
    )


@click.command(
    "exec",
    context_settings={"show_default": True},
    short_help="Run a command while holding a lock.",
)
@click.argument("resource")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_seconds_option(
    "--ttl",
    30.0,
    "Lock ttl in seconds; renewed every ttl/3 while the command runs.",
    positive=True,
)
@_seconds_option(
    "--wait", 60.0, "Seconds to wait for a held lock before giving up with status 75."
)
@click.option("--url", envvar="LOCKKEEPER_URL", help="Server URL [env LOCKKEEPER_URL].")
@click.option(
    "--token",
    envvar="LOCKKEEPER_TOKEN",
    help="API token [env LOCKKEEPER_TOKEN]. On the command line it is visible to "
    "every local user (ps): prefer the variable or --token-file.",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="LOCKKEEPER_TOKEN_FILE",
    help="Read the API token from this file [env LOCKKEEPER_TOKEN_FILE].",
)
@click.option("--owner", help="Owner token (default: host:pid:random).")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=None,
    help="Take one of this many places of RESOURCE (a counting semaphore: at most "
    "LIMIT commands at once across hosts).  [default: 1, exclusive]",
    show_default=False,
)
@click.option(
    "--shared",
    is_flag=True,
    help="Take a shared (read) lock: any number of shared commands at once, none "
    "while an exclusive one runs.",
)
@click.option(
    "--on-lost",
    type=click.Choice(["kill", "warn"]),
    default="kill",
    help="On loss: terminate the command and exit 76, or warn and keep it running.",
)
@click.option(
    "--hold-at-least",
    callback=_duration,
    default=None,
    metavar="DURATION",
    help="Keep the lock at least this long after it was granted, by the "
    "database's clock (90, 90s, 5m, 1h): a run that ends sooner leaves the lock "
    "to expire then, so hosts with skewed clocks run once per window.",
)
@_seconds_option(
    "--grace", 10.0, "Seconds between SIGTERM and SIGKILL when the lock is lost."
)
@click.option(
    "--leader",
    is_flag=True,
    help="Run the command only while leading RESOURCE: wait in line for it (as "
    "long as --wait if given, else until leading), hold it with a session of "
    "--ttl heartbeated in the background, hand it over when the command exits.",
)
@click.pass_context
def exec_command(
    ctx: click.Context,
    resource: str,
    command: tuple[str, ...],
    ttl: float,
    wait: float,
    url: str | None,
    token: str | None,
    token_file: Path | None,
    owner: str | None,
    limit: int | None,
    shared: bool,
    on_lost: str,
    hold_at_least: float | None,
    grace: float,
    leader: bool,
) -> NoReturn:
    """Run COMMAND only while holding the lock RESOURCE, renewing it as it runs.

    \b
        lockkeeper exec report:nightly --ttl 60 --wait 0 -- ./make-report.sh --all

    The command gets LOCKKEEPER_FENCE, LOCKKEEPER_RESOURCE and LOCKKEEPER_OWNER in
    its environment, and never the API token. SIGINT, SIGTERM and SIGHUP are
    forwarded to it. Exit status: the command's; 75 when the lock could not be had
    within --wait; 76 when the lock was lost and the command terminated; 77 when
    the token was refused or may not lock it. With --limit N at most N such
    commands run at once (each its own fence); with --shared, any number of shared
    ones, but never beside an exclusive one. A RESOURCE in use with another limit
    is a refusal (75).

    With --leader the lock is a leadership bound to a session (one heartbeat,
    lost together when the session ends):

    \b
        lockkeeper exec --leader scheduler:main -- ./scheduler
    """
    if leader and hold_at_least:
        raise click.UsageError("--hold-at-least does not apply to --leader")
    if leader and (limit or shared):
        raise click.UsageError("--leader takes neither --limit nor --shared")
    if not url:
        raise click.UsageError("no server: pass --url or set LOCKKEEPER_URL")
    if shared and limit not in (None, 1):
        raise click.UsageError("--shared takes no --limit: shared grants are unbounded")
    if ctx.get_parameter_source("token") is ParameterSource.COMMANDLINE:
        click.echo(
            "lockkeeper exec: WARNING: --token on the command line can be read by "
            "every local user in the process list; set LOCKKEEPER_TOKEN or use "
            "--token-file",
            err=True,
        )
    if token_file is not None:
        token = token_file.read_text().strip()
    if not token:
        raise click.UsageError(
            "no API token: set LOCKKEEPER_TOKEN, or pass --token-file (or --token)"
        )
    executable = shutil.which(command[0])
    if executable is None:
        _fail(f"{command[0]}: command not found", EXIT_NOT_FOUND)

    runner = _Runner(command, on_lost=on_lost, grace=grace)
    # A leader waits until it leads unless --wait was given.
    lead_wait = (
        wait
        if ctx.get_parameter_source("wait") is ParameterSource.COMMANDLINE
        else None
    )
    with LockClient(url, token) as client, runner.forwarding_signals():
        try:
            if leader:
                code = _run_leading(
                    client, runner, resource, ttl=ttl, wait=lead_wait, owner=owner
                )
            else:
                code = _run_holding(
                    client,
                    runner,
                    resource,
                    ttl=ttl,
                    wait=wait,
                    owner=owner,
                    hold_at_least=hold_at_least,
                    kind=LockKind(limit, shared),
                )
        except _Interrupted as exc:
            _fail(
                f"interrupted by {exc} while waiting for {resource!r}", 128 + exc.signum
            )
        except LockNotAcquired as exc:
            _fail(str(exc), EXIT_NOT_ACQUIRED)
        except ServiceUnavailable as exc:
            _fail(str(exc), EXIT_NOT_ACQUIRED)
        except (AuthenticationFailed, AccessDenied) as exc:
            _fail(str(exc), EXIT_AUTH_FAILED)
        except InvalidRequest as exc:
            raise click.UsageError(str(exc)) from exc
        except LockClientError as exc:
            _fail(str(exc), EXIT_NOT_ACQUIRED)
    if runner.killed_for_loss:
        _fail(
            f"lock {resource!r} was lost; the command was terminated",
            EXIT_LOCK_LOST,
        )
    sys.exit(code)


def _run_holding(
    client: LockClient,
    runner: _Runner,
    resource: str,
    *,
    ttl: float,
    wait: float,
    owner: str | None,
    hold_at_least: float | None,
    kind: LockKind,
) -> int:
    held = client.lock(
        resource,
        ttl=ttl,
        wait=wait,
        owner=owner or default_owner(),
        on_lost=runner.lock_lost,
        limit=kind.limit,
        shared=kind.shared,
    )
    held.acquire()
    started = time.monotonic()
    code: int | None = None
    try:
        code = runner.run(
            {
                "LOCKKEEPER_FENCE": str(held.fence),
                "LOCKKEEPER_RESOURCE": resource,
                "LOCKKEEPER_OWNER": held.owner,
            }
        )
        return code
    finally:
        if hold_at_least:
            held.hold_at_least(hold_at_least)
        elif code is None:
            held.release()  # the command never ran to an end of its own
        else:
            # How the run ended goes with the release into the audit log.
            held.release(
                run={
                    "exit_status": max(-255, min(code, 255)),
                    "duration": round(time.monotonic() - started, 3),
                    "host": socket.gethostname()[:255],
                }
            )


def _run_leading(
    client: LockClient,
    runner: _Runner,
    resource: str,
    *,
    ttl: float,
    wait: float | None,
    owner: str | None,
) -> int:
    with client.leadership(
        resource,
        ttl=ttl,
        wait=wait,
        owner=owner or default_owner(),
        on_lost=runner.lock_lost,
    ) as lead:
        return runner.run(
            {
                "LOCKKEEPER_FENCE": str(lead.fence),
                "LOCKKEEPER_RESOURCE": resource,
                "LOCKKEEPER_OWNER": lead.owner,
            }
        )


def _sent_by_terminal(signum: int) -> bool:
    """Ctrl-C at a terminal signals the whole foreground process group, the child
    included: forwarding that SIGINT again would deliver it twice."""
    if signum != signal.SIGINT:
        return False
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


class _Runner:
    """The child process, the signals forwarded to it, and what a loss does to it."""

    def __init__(self, command: tuple[str, ...], *, on_lost: str, grace: float):
        self.command = command
        self.on_lost = on_lost
        self.grace = grace
        self.child: subprocess.Popen[bytes] | None = None
        self.lost = False
        self.killed_for_loss = False
        self._starting = False
        self._pending: list[int] = []

    def lock_lost(self, held: HeldLock | LockSession) -> None:
        """Called from the renewal thread; the main loop acts on it."""
        self.lost = True
        if self.on_lost == "warn":
            click.echo(
                f"lockkeeper exec: WARNING: {held.lost_reason}; "
                "the command keeps running unprotected (--on-lost=warn)",
                err=True,
            )

    @contextlib.contextmanager
    def forwarding_signals(self) -> Iterator[None]:
        previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in FORWARDED_SIGNALS
        }
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.child is None:
            if self._starting:
                # Between fork and our holding the child's handle: deliver after.
                self._pending.append(signum)
                return
            raise _Interrupted(signum)
        if self.child.poll() is None and not _sent_by_terminal(signum):
            self.child.send_signal(signum)

    def run(self, extra_env: dict[str, str]) -> int:
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in WITHHELD_FROM_COMMAND
        }
        env.update(extra_env)
        self._starting = True
        try:
            self.child = subprocess.Popen(self.command, env=env)
        except PermissionError as exc:
            _fail(f"{self.command[0]}: {exc.strerror}", EXIT_CANNOT_EXECUTE)
        except FileNotFoundError:
            _fail(f"{self.command[0]}: command not found", EXIT_NOT_FOUND)
        except OSError as exc:
            _fail(f"{self.command[0]}: {exc.strerror}", EXIT_CANNOT_EXECUTE)
        finally:
            self._starting = False
        for signum in self._pending:
            self.child.send_signal(signum)
        kill_at: float | None = None
        while True:
            try:
                returncode = self.child.wait(timeout=POLL_INTERVAL)
                break
            except subprocess.TimeoutExpired:
                pass
            if self.lost and self.on_lost == "kill":
                if kill_at is None:
                    click.echo(
                        "lockkeeper exec: lock lost; terminating the command",
                        err=True,
                    )
                    self.killed_for_loss = True
                    self.child.terminate()
                    kill_at = time.monotonic() + self.grace
                elif time.monotonic() >= kill_at:
                    self.child.kill()
                    kill_at = float("inf")
        return 128 - returncode if returncode < 0 else returncode


def main() -> None:
    """The ``lockkeeper-exec`` console script."""
    exec_command.main(prog_name="lockkeeper-exec")
