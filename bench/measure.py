"""Alternating measurement and the result record every section produces."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Sample:
    """One timed run of one side: its rate and anything else worth keeping."""

    rate: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Comparison:
    """One line of latest.json: ``value`` against ``baseline`` measured alongside.

    ``ratio`` = value / baseline, so above 1 means faster (for rates).
    """

    name: str
    value: float
    baseline: float
    ratio: float
    unit: str
    baseline_name: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("value", "baseline", "ratio"):
            data[key] = round(data[key], 4)
        return data


def alternate(
    sides: Mapping[str, Callable[[], Sample]], rounds: int
) -> dict[str, list[Sample]]:
    """Run every side once per round, A B A B ..., so slow drifts of a shared
    machine hit every side alike."""
    samples: dict[str, list[Sample]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            samples[name].append(run())
    return samples


def median_rate(samples: list[Sample]) -> float:
    return statistics.median(s.rate for s in samples)


def median_of(samples: list[Sample], key: str) -> float | None:
    values = [s.extra[key] for s in samples if s.extra.get(key) is not None]
    return statistics.median(values) if values else None


def compare(
    name: str,
    samples: dict[str, list[Sample]],
    side: str,
    baseline: str,
    unit: str,
    **detail: Any,
) -> Comparison:
    value, base = median_rate(samples[side]), median_rate(samples[baseline])
    return Comparison(
        name=name,
        value=value,
        baseline=base,
        ratio=value / base if base else float("nan"),
        unit=unit,
        baseline_name=baseline,
        detail={
            "rounds": len(samples[side]),
            f"{side}_runs": [round(s.rate, 1) for s in samples[side]],
            f"{baseline}_runs": [round(s.rate, 1) for s in samples[baseline]],
            **detail,
        },
    )


# What a cycle cost in CPU, by whom (``Sample.extra``): the side's client
# (worker processes, or wrk), its server (gunicorn, etcd) and its database.
CPU_KEYS = (
    "client_cpu_ms_per_cycle",
    "server_cpu_ms_per_cycle",
    "database_cpu_ms_per_cycle",
)


def cpu_detail(samples: dict[str, list[Sample]], *sides: str) -> dict[str, float]:
    """Each side's median CPU per cycle by whom, and the sum of the parts
    measured (``{side}_cpu_ms_per_cycle``)."""
    detail = {}
    for side in sides:
        parts = {key: median_of(samples[side], key) for key in CPU_KEYS}
        measured = {key: value for key, value in parts.items() if value is not None}
        for key, value in measured.items():
            detail[f"{side}_{key}"] = round(value, 3)
        if measured:
            detail[f"{side}_cpu_ms_per_cycle"] = round(sum(measured.values()), 3)
    return detail
