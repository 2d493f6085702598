"""The client's exceptions cross process boundaries intact: Celery results,
``multiprocessing`` and ``ProcessPoolExecutor`` pickle them."""

from __future__ import annotations

import inspect
import pickle
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime

import pytest
from lockkeeper_client import LockGrant, errors

HOLDER = LockGrant(
    resource="job:42",
    owner="w-1",
    fence=7,
    acquired_at=datetime(2026, 1, 1, tzinfo=UTC),
    expires_at=datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC),
    ttl_remaining=30.0,
    state="held",
)

# One instance of every class, every field set to something other than its default.
SAMPLES: dict[type, errors.LockClientError] = {
    errors.LockClientError: errors.LockClientError("job:42", "failed", 500),
    errors.InvalidRequest: errors.InvalidRequest(
        "job:42", "bad", 400, [("ttl", "must be positive")]
    ),
    errors.AuthenticationFailed: errors.AuthenticationFailed("job:42", "no", 401),
    errors.AccessDenied: errors.AccessDenied("job:42", "scope", 403),
    errors.LockQuotaReached: errors.LockQuotaReached("job:42", "quota", 12.5),
    errors.LockMissing: errors.LockMissing("job:42", "none", 404),
    errors.LockNotAcquired: errors.LockNotAcquired("job:42", "held", HOLDER),
    errors.LimitMismatch: errors.LimitMismatch("job:42", "limit", 4, "exclusive"),
    errors.LockFrozen: errors.LockFrozen("job:42", "frozen", {"prefix": "job:"}),
    errors.FenceRejected: errors.FenceRejected("job:42", "fence", HOLDER),
    errors.LockLost: errors.LockLost("job:42", "lost", 409),
    errors.SessionLost: errors.SessionLost("session 's1'", "ended", 409),
    errors.ServiceUnavailable: errors.ServiceUnavailable("job:42", "down", 503),
    errors.UnexpectedResponse: errors.UnexpectedResponse("job:42", "odd", 500),
    errors.GuardRefused: errors.GuardRefused("job:42", "guard", "expired", 7, "LK002"),
    errors.GuardOutsideTransaction: errors.GuardOutsideTransaction("job:42", "tx"),
    errors.GuardNotInstalled: errors.GuardNotInstalled("job:42", "no routine"),
    errors.ConfigurationError: errors.ConfigurationError("the API token is empty"),
    errors.SessionBoundLock: errors.SessionBoundLock("job:42", "bound", 409),
    errors.AlreadyHeld: errors.AlreadyHeld("job:42", "held here"),
}


def _classes() -> list[type]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.LockClientError) and cls.__module__ == errors.__name__
    ]


def test_every_exception_class_has_a_sample():
    assert set(_classes()) == set(SAMPLES)


@pytest.mark.parametrize("cls", _classes(), ids=lambda cls: cls.__name__)
def test_an_exception_survives_a_pickle_round_trip_with_its_type_and_fields(cls):
    sent = SAMPLES[cls]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        received = pickle.loads(pickle.dumps(sent, protocol))
        assert type(received) is cls
        assert str(received) == str(sent)
        assert received.args == sent.args
        assert vars(received) == vars(sent)
        assert vars(received)  # resource and status at least


def _raise_not_acquired() -> None:
    raise SAMPLES[errors.LockNotAcquired]


def test_a_process_pool_caller_catches_the_exception_by_type():
    with ProcessPoolExecutor(1) as pool:
        future = pool.submit(_raise_not_acquired)
        with pytest.raises(errors.LockNotAcquired) as caught:
            future.result(timeout=60)
    assert caught.value.holder == HOLDER
    assert caught.value.resource == "job:42"
