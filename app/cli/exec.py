"""``lockkeeper exec``: the worker client's own command (``lockkeeper-exec`` of
the ``lockkeeper-client`` distribution), offered on a server install too. One
implementation: ``lockkeeper_client.exec``."""

from lockkeeper_client.exec import exec_command

COMMANDS = [exec_command]
