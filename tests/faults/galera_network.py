"""A network namespace per Galera node, so that a node can be cut off from the
others (a partition) while its clients still reach it.

The harness runs in a network namespace of its own (``unshare --net``:
``python -m tests.faults`` starts itself so when a run asks for partitions):
nothing here touches the machine's own network. In it a bridge, ``lkbr``, at
``10.77.0.254`` (the harness: app instances, HAProxy, the checks); each node in
a namespace of its own, held open by an ``unshare --net sleep`` process, joined
to the bridge by a veth pair, at ``10.77.0.<n + 1>``. Its mariadbd, and the
rsync of its state transfers, run there (``nsenter --net``).

``cut(n)`` adds a blackhole route to every other node in node n's namespace,
and one to node n in theirs: packets between them are dropped without a word,
both ways, as a partition drops them (a node learns it only when its peers
stop answering). ``heal(n)`` takes the routes away. The harness's address is
never blackholed: clients see the cut-off node refuse (1047) once it knows it
is out of the primary component.
"""

from __future__ import annotations

import os
import subprocess
import time

from tests.faults.cluster import ClusterError

SUBNET = "10.77.0"
HARNESS_ADDRESS = f"{SUBNET}.254"
BRIDGE = "lkbr"


def in_own_network_namespace(table: str = "/proc/self/net/dev") -> bool:
    """Whether this process's network namespace holds nothing but a loopback
    and what this module makes: one ``unshare --net`` made (the machine's
    has its own interfaces). ``table``: the kernel's list of them."""
    with open(table, encoding="ascii") as lines:
        names = {line.split(":")[0].strip() for line in lines if ":" in line}
    return all(
        name in ("lo", BRIDGE) or (name.startswith("lkn") and name.endswith("b"))
        for name in names
    )


def _ip(*arguments: str, namespace: str | None = None) -> None:
    command = ["ip", *arguments]
    if namespace is not None:
        command = ["nsenter", f"--net={namespace}", "--", *command]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"{' '.join(command)}: {result.stderr.strip()}")


class NodeNetworks:
    """``address(n)``, ``command(n, argv)``, ``cut(n)``, ``heal(n)``;
    ``close()`` ends the namespaces (their links go with them)."""

    def __init__(self, count: int):
        if not in_own_network_namespace():
            raise ClusterError(
                "a network namespace per node needs the harness in one of its own"
                " (unshare --net): the bridge would be the machine's"
            )
        self.count = count
        self.holders: list[subprocess.Popen] = []
        try:
            _ip("link", "set", "lo", "up")
            _ip("link", "add", BRIDGE, "type", "bridge")
            _ip("addr", "add", f"{HARNESS_ADDRESS}/24", "dev", BRIDGE)
            _ip("link", "set", BRIDGE, "up")
            for n in range(count):
                self._add_node(n)
        except BaseException:
            self.close()
            raise

    def _add_node(self, n: int) -> None:
        own = os.stat("/proc/self/ns/net").st_ino
        holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
        self.holders.append(holder)
        deadline = time.monotonic() + 10
        # unshare runs sleep once the namespace is made: until then the
        # process is in ours.
        while os.stat(f"/proc/{holder.pid}/ns/net").st_ino == own:
            if holder.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"unshare --net for node {n} failed")
            time.sleep(0.01)
        inside, outside = f"lkn{n}", f"lkn{n}b"
        _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
        _ip("link", "set", inside, "netns", str(holder.pid))
        _ip("link", "set", outside, "master", BRIDGE, "up")
        namespace = self.namespace(n)
        _ip("link", "set", "lo", "up", namespace=namespace)
        _ip("addr", "add", f"{self.address(n)}/24", "dev", inside, namespace=namespace)
        _ip("link", "set", inside, "up", namespace=namespace)

    def namespace(self, n: int) -> str:
        return f"/proc/{self.holders[n].pid}/ns/net"

    def address(self, n: int) -> str:
        return f"{SUBNET}.{n + 1}"

    def command(self, n: int, argv: list[str]) -> list[str]:
        """``argv`` run in node n's namespace (nsenter execs it: same pid)."""
        return ["nsenter", f"--net={self.namespace(n)}", "--", *argv]

    def _routes(self, action: str, n: int) -> None:
        for other in range(self.count):
            if other == n:
                continue
            _ip(
                "route",
                action,
                "blackhole",
                f"{self.address(other)}/32",
                namespace=self.namespace(n),
            )
            _ip(
                "route",
                action,
                "blackhole",
                f"{self.address(n)}/32",
                namespace=self.namespace(other),
            )

    def cut(self, n: int) -> None:
        self._routes("add", n)

    def heal(self, n: int) -> None:
        self._routes("del", n)

    def close(self) -> None:
        for holder in self.holders:
            holder.kill()
            holder.wait()
        self.holders = []
        subprocess.run(
            ["ip", "link", "del", BRIDGE], capture_output=True, timeout=30, check=False
        )
