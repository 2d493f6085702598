"""``lockkeeper-exec`` (and ``lockkeeper exec`` on a server install): run a command
only while holding a lock, like flock(1) across machines.

A pure HTTP client of the JSON API: it needs neither the server nor a database, so
a cron host installs only ``lockkeeper-client``.

The API token comes from ``LOCKKEEPER_TOKEN`` or ``--token-file`` (``--token``
works, with a warning: every local user can read a process's arguments). The
command never sees the token: ``exec`` reads it and drops ``LOCKKEEPER_TOKEN`` and
``LOCKKEEPER_TOKEN_FILE`` from its own environment, so the command's has neither
(it gets ``LOCKKEEPER_FENCE``, ``LOCKKEEPER_RESOURCE`` and ``LOCKKEEPER_OWNER``
instead), and on Linux ``exec`` makes itself non-dumpable, so the command cannot
read the token from ``/proc/<exec's pid>/environ`` either.

The command ends when ``exec`` ends, however it ends: it runs in a process group
of its own (signals and a loss reach the whole group), and on Linux it is bound
to ``exec``'s death (``PR_SET_PDEATHSIG``: a ``kill -9`` of ``exec`` kills the
command too, so a run never outlives its lock). The binding is the command's own
process: what it starts in the background must watch its parent itself. macOS
has no such binding.

``--wait`` is 0 by default, as cron wants: a run that finds the previous one
still holding the lock exits 75 at once instead of queueing behind it.

Exit status:

- the command's own status (128 + N when a signal N ended it), after the release;
- 75 (EX_TEMPFAIL): the lock could not be had within ``--wait``, or the service
  could not be reached; the command did not run;
- 76: the lock was lost while the command ran; the command was terminated
  (SIGTERM, then SIGKILL after ``--grace`` seconds). With ``--on-lost=warn`` the
  command keeps running and its own status is returned;
- 77 (EX_NOPERM): the token was refused, or may not lock this resource;
- 126 / 127: the command could not be executed (not executable, a directory) /
  was not found (as in a shell);
- 2: bad usage (no URL or token, bad option or resource).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
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
    HeldSet,
    InvalidRequest,
    LockClient,
    LockClientError,
    LockKind,
    LockNotAcquired,
    LockSession,
    ServiceUnavailable,
    SetMember,
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
WITHHELD_FROM_COMMAND = ("LOCKKEEPER_TOKEN", "LOCKKEEPER_TOKEN_FILE")
# <linux/prctl.h>
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


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
    "--wait",
    0.0,
    "Seconds to wait for a held lock before giving up with status 75 (0: a run "
    "that finds the lock held, e.g. the previous cron run, exits 75 at once).",
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
    "--also",
    "also",
    multiple=True,
    metavar="RESOURCE",
    help="Hold this resource too (repeatable): RESOURCE and every --also are "
    "taken as one set, all or none (no deadlock whatever order other runs name "
    "them in), renewed and released as one.",
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
    also: tuple[str, ...],
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

    With --also the command holds several locks, taken as one set (all or
    none); it gets LOCKKEEPER_RESOURCES and LOCKKEEPER_FENCES ("name=fence,...")
    too:

    \b
        lockkeeper exec acct:1 --also acct:2 -- ./move-money.sh

    With --leader the lock is a leadership bound to a session (one heartbeat,
    lost together when the session ends):

    \b
        lockkeeper exec --leader scheduler:main -- ./scheduler
    """
    if leader and hold_at_least:
        raise click.UsageError("--hold-at-least does not apply to --leader")
    if leader and (limit or shared):
        raise click.UsageError("--leader takes neither --limit nor --shared")
    if also and (leader or hold_at_least):
        raise click.UsageError("--also takes neither --leader nor --hold-at-least")
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
    _forget_the_token()
    if not token:
        raise click.UsageError(
            "no API token: set LOCKKEEPER_TOKEN, or pass --token-file (or --token)"
        )
    problem = _not_runnable(command[0])
    if problem is not None:
        _fail(f"{command[0]}: {problem[0]}", problem[1])

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
            elif also:
                code = _run_holding_set(
                    client,
                    runner,
                    [resource, *also],
                    ttl=ttl,
                    wait=wait,
                    owner=owner,
                    kind=LockKind(limit, shared),
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


def _libc() -> Any:
    """Linux's C library, or None elsewhere (no ``prctl``)."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(None, use_errno=True)


def _forget_the_token() -> None:
    """Drop the token's variables from our environment (the command inherits
    neither) and, on Linux, make this process non-dumpable: its
    ``/proc/<pid>/environ`` still holds the variable as it was at start, and a
    non-dumpable process's is readable by root alone, not by the command."""
    for name in WITHHELD_FROM_COMMAND:
        os.environ.pop(name, None)
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _not_runnable(name: str) -> tuple[str, int] | None:
    """Why ``name`` cannot run, with the shell's status (127 not found, 126
    found but not executable), or None when it can."""
    if shutil.which(name) is not None:
        return None
    if os.sep in name:
        candidates = [Path(name)]
    else:
        path = os.environ.get("PATH", os.defpath).split(os.pathsep)
        candidates = [Path(folder or ".") / name for folder in path]
    for candidate in candidates:
        if candidate.is_dir():
            return "is a directory", EXIT_CANNOT_EXECUTE
        if candidate.exists():
            return "permission denied (not executable)", EXIT_CANNOT_EXECUTE
    return "command not found", EXIT_NOT_FOUND


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


def _run_holding_set(
    client: LockClient,
    runner: _Runner,
    resources: list[str],
    *,
    ttl: float,
    wait: float,
    owner: str | None,
    kind: LockKind,
) -> int:
    """The command run holding every resource, taken as one set."""
    held = client.lock_all(
        [SetMember(resource, kind) for resource in resources],
        ttl=ttl,
        wait=wait,
        owner=owner or default_owner(),
        on_lost=runner.lock_lost,
        raise_on_lost=False,  # the runner acts on a loss: 76, not an error
    )
    held.acquire()
    try:
        return runner.run(
            {
                "LOCKKEEPER_FENCE": str(held.fences[resources[0]]),
                "LOCKKEEPER_RESOURCE": resources[0],
                "LOCKKEEPER_RESOURCES": ",".join(resources),
                "LOCKKEEPER_FENCES": ",".join(
                    f"{resource}={held.fences[resource]}" for resource in resources
                ),
                "LOCKKEEPER_OWNER": held.owner,
            }
        )
    finally:
        held.release()


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
        raise_on_lost=False,  # the runner acts on a loss: 76, not an error
    ) as lead:
        return runner.run(
            {
                "LOCKKEEPER_FENCE": str(lead.fence),
                "LOCKKEEPER_RESOURCE": resource,
                "LOCKKEEPER_OWNER": lead.owner,
            }
        )


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

    def lock_lost(self, held: HeldLock | HeldSet | LockSession) -> None:
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
        self._signal_command(signum)

    def _signal_command(self, signum: int) -> None:
        """Signal the command's whole process group (a shell script's children
        too), as a terminal would."""
        if self.child is None or self.child.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.pid, signum)

    def run(self, extra_env: dict[str, str]) -> int:
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in WITHHELD_FROM_COMMAND
        }
        env.update(extra_env)
        terminal = _foreground_terminal()
        self._starting = True
        try:
            # Forked from this (the main) thread: PR_SET_PDEATHSIG fires when the
            # thread that forked ends, and the main thread ends with exec.
            self.child = subprocess.Popen(
                self.command,
                env=env,
                preexec_fn=functools.partial(
                    _bind_to_parent, os.getpid(), terminal, _libc()
                ),
            )
        except PermissionError as exc:
            _fail(f"{self.command[0]}: {exc.strerror}", EXIT_CANNOT_EXECUTE)
        except FileNotFoundError:
            _fail(f"{self.command[0]}: command not found", EXIT_NOT_FOUND)
        except OSError as exc:
            _fail(f"{self.command[0]}: {exc.strerror}", EXIT_CANNOT_EXECUTE)
        finally:
            self._starting = False
        try:
            for signum in self._pending:
                self._signal_command(signum)
            returncode = self._wait_for_the_command()
        finally:
            if terminal is not None:
                _take_the_terminal_back(terminal)
        return 128 - returncode if returncode < 0 else returncode

    def _wait_for_the_command(self) -> int:
        assert self.child is not None
        kill_at: float | None = None
        while True:
            try:
                return self.child.wait(timeout=POLL_INTERVAL)
            except subprocess.TimeoutExpired:
                pass
            if self.lost and self.on_lost == "kill":
                if kill_at is None:
                    click.echo(
                        "lockkeeper exec: lock lost; terminating the command",
                        err=True,
                    )
                    self.killed_for_loss = True
                    self._signal_command(signal.SIGTERM)
                    kill_at = time.monotonic() + self.grace
                elif time.monotonic() >= kill_at:
                    self._signal_command(signal.SIGKILL)
                    kill_at = float("inf")


def _foreground_terminal() -> int | None:
    """The terminal (as a file descriptor) whose foreground we are, if any: the
    command then gets the foreground, so that it reads the terminal and a Ctrl-C
    typed there reaches it (once: exec, in another group, does not see it)."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
        except OSError:
            continue
    return None


def _bind_to_parent(parent: int, terminal: int | None, libc: Any) -> None:
    """In the command's process, between fork and exec: a process group of its
    own, the terminal's foreground if exec had it, and death with exec."""
    os.setpgid(0, 0)
    if terminal is not None:
        # A background group asking for the terminal gets SIGTTOU: ignore it.
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            os.tcsetpgrp(terminal, os.getpgrp())
        signal.signal(signal.SIGTTOU, previous)
    if libc is not None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(EXIT_CANNOT_EXECUTE)  # exec died before the binding held


def _take_the_terminal_back(terminal: int) -> None:
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(terminal, os.getpgrp())
    finally:
        signal.signal(signal.SIGTTOU, previous)


def main() -> None:
    """The ``lockkeeper-exec`` console script."""
    exec_command.main(prog_name="lockkeeper-exec")
