"""The markdown table of a run, from the same dict as latest.json."""

from __future__ import annotations

from typing import Any

# Targets from issues 8 and 48: the ratio each comparison should reach or beat.
# The longest matching prefix wins (docs/benchmarks.md, "Targets").
TARGETS = {
    "service_vs_driver_postgresql": 0.8,
    "service_vs_driver_sqlite": 0.5,
    "service_vs_driver_mariadb": 0.7,
    "http_vs_ideal_postgresql": 0.6,
    "http_vs_ideal_sqlite": 0.5,
    "http_vs_seed_design": 1.1,
    "http_vs_redis": 0.45,
    "http_pgbouncer_vs_direct": 0.85,
    # Issue 48: the embedded mode.
    "embedded_vs_driver_postgresql": 0.8,
    "embedded_vs_etcd_lock_postgresql": 1.0,
    "embedded_vs_http": 3.0,
    "embedded_async_vs_threads": 0.8,
}

# Targets the ratio should stay at or under (waiting in line: fairness, hand-over).
TARGETS_AT_MOST = {
    "contention_worst_wait_vs_fifo_bound": 2.0,
    "handoff_vs_round_trip": 3.0,
    # Issue 27: one heartbeat per interval for 100 bound locks.
    "session_heartbeat_vs_renew_each_100": 0.02,
}


# Kept in latest.json, too long for a table cell.
SKIPPED_DETAIL = ("rounds", "backend", "series_mb", "note")


def _detail(key: str, value: Any) -> str:
    if isinstance(value, dict):
        inner = " ".join(f"{k}={v}" for k, v in value.items())
        return f"{key}: ({inner})"
    return f"{key}={value}"


def target_for(name: str) -> float | None:
    matches = [prefix for prefix in TARGETS if name.startswith(prefix)]
    return TARGETS[max(matches, key=len)] if matches else None


def at_most_for(name: str) -> float | None:
    for prefix, target in TARGETS_AT_MOST.items():
        if name.startswith(prefix):
            return target
    return None


def _number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"# Lockkeeper benchmark ({report['mode']} run, {env['date']})",
        "",
        f"{env['cpus']} CPUs, load average at start "
        f"{' '.join(str(x) for x in env['load_average_at_start'])}; Python "
        f"{env['python']}, SQLite {env['sqlite']}; {report['elapsed_seconds']} s.",
        "",
        "| comparison | value | baseline | ratio | target | unit | detail |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for c in report["comparisons"]:
        target = target_for(c["name"])
        at_most = at_most_for(c["name"])
        verdict = ""
        if target is not None:
            verdict = f"{target}× {'met' if c['ratio'] >= target else 'missed'}"
        elif at_most is not None:
            verdict = f"≤ {at_most}× {'met' if c['ratio'] <= at_most else 'missed'}"
        detail = ", ".join(
            _detail(k, v)
            for k, v in c["detail"].items()
            if not k.endswith("_runs") and k not in SKIPPED_DETAIL
        )
        lines.append(
            f"| {c['name']} | {_number(c['value'])} | {_number(c['baseline'])}"
            f" ({c['baseline_name']}) | {c['ratio']:.2f} | {verdict} | {c['unit']}"
            f" | {detail} |"
        )
    if report.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"
