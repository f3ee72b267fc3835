"""The local-cluster harness: a private ZooKeeper and N real broker processes on one machine.

`LocalCluster` (`local_cluster`) is what `odradek cluster ...`, the integration and fault tests,
the benchmarks and the demos start clusters with; `cluster_files` holds the records of
`cluster.json` and the development defaults, `processes` finds and signals the child processes,
and `cluster_status` reads the status report from ZooKeeper. The names tests use most are
re-exported here.
"""

from odradek.testing.cluster_files import CLUSTER_FILE, LocalBroker, development_defaults, tail
from odradek.testing.cluster_status import read_status
from odradek.testing.local_cluster import LocalCluster
from odradek.testing.processes import ProcessState

__all__ = [
    "CLUSTER_FILE",
    "LocalBroker",
    "LocalCluster",
    "ProcessState",
    "development_defaults",
    "read_status",
    "tail",
]
