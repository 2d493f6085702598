"""Parameter types shared by the command groups."""

from __future__ import annotations

from datetime import timedelta

import click

from app.timestamps import parse_duration


class Duration(click.ParamType):
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or plain seconds."""

    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
