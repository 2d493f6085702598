"""``lockkeeper events``: export the audit log, prune old events."""

from __future__ import annotations

from datetime import datetime

import click
from flask.cli import with_appcontext
from lockkeeper_core.state import Action

from app.cli.params import older_than_option, refusals_reported
from app.timestamps import parse_rfc3339

events = click.Group("events", help="The audit log of every ownership change.")


class Timestamp(click.ParamType):
    """RFC 3339 with its offset (``2026-11-30T09:00:00Z``): see ``parse_rfc3339``."""

    name = "timestamp"

    def convert(self, value, param, ctx) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_rfc3339(value)
        except ValueError as exc:
            self.fail(f"{value!r} {exc}", param, ctx)


@events.command("export")
@click.option(
    "--format",
    "export_format",
    type=click.Choice(["csv", "jsonl"]),
    required=True,
    help="CSV with a header row, or one JSON object per line.",
)
@click.option("--resource", help="Exactly this resource.")
@click.option("--prefix", help="Resources starting with this.")
@click.option("--owner")
@click.option("--action", type=click.Choice([a.value for a in Action]))
@click.option("--actor", help="API token name, operator username or cli:<user>.")
@click.option("--since", type=Timestamp(), help="At or after (2026-11-30T09:00:00Z).")
@click.option("--until", type=Timestamp(), help="Before (2026-11-30T09:00:00Z).")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    help="File to write; standard output by default.",
)
@with_appcontext
def events_export(export_format, output, **filters) -> None:
    """Write the matching events, newest first, as the /audit page lists them."""
    from lockkeeper_core.errors import InvalidInput

    from app.audit.export import ExportFormat, chunks
    from app.audit.service import EventFilter, iter_events

    event_filter = EventFilter(**filters)
    with refusals_reported(InvalidInput):
        event_filter.validate()
    rows = chunks(iter_events(event_filter), ExportFormat(export_format))
    # newline="": the CSV writer already ends rows with CRLF (RFC 4180).
    if output == "-":
        for chunk in rows:
            click.echo(chunk, nl=False)
        return
    with open(output, "w", encoding="utf-8", newline="") as handle:
        for chunk in rows:
            handle.write(chunk)


@events.command("prune")
@older_than_option("Delete events that occurred longer ago than this (e.g. 90d).")
@with_appcontext
def events_prune(older_than) -> None:
    """Delete old events in batches of 1000, each its own short transaction."""
    from lockkeeper_core.errors import InvalidInput

    from app.audit.service import prune_events

    with refusals_reported(InvalidInput):
        pruned = prune_events(older_than)
    click.echo(f"Pruned {pruned} event(s).")


COMMANDS = [events]
