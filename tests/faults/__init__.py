"""The fault harness: many app instances, killed processes, a database restart and
a skewed clock, with every grant recorded and the history checked afterwards.

- ``cluster``: a private PostgreSQL server the harness may stop and start.
- ``patroni``, ``galera``: a PostgreSQL failover cluster; a three-node MariaDB
  Galera cluster, and ``galera_proxy`` HAProxy in front of it.
- ``instances``: gunicorn app instances, one of them under libfaketime.
- ``worker``: a worker process taking locks through ``lockkeeper_client.LockClient``.
- ``faults``: the kill/restart loop and the database outage probe.
- ``checker``: the properties the recorded history must have.
- ``run``: wires it together; ``python -m tests.faults --help`` for the long mode.
"""
