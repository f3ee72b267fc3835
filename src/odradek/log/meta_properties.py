"""`meta.properties`: which broker and cluster a log directory belongs to.

Java properties text, as Kafka's ZooKeeper-mode brokers write it::

    version=0
    broker.id=1
    cluster.id=<22-character base64 cluster id>

Checked for every log directory at start-up, once the cluster id is known (`check_meta_properties`):

* missing, or empty (a write torn before any byte reached the disk): written afresh; a last line
  without its newline (torn) is ignored, and what it held written again (the whole file when
  that was the first line);
* a different broker.id or cluster.id: the broker refuses to start (`OperatorError`), as Kafka
  does — the directory belongs to another broker or cluster and must not be mixed in;
* unreadable (an I/O error) or malformed (no or unknown `version`, a `broker.id` that is not an
  integer): the directory is an error directory, offline from the start (Kafka 3.9's
  MetaPropertiesEnsemble puts it in `errorLogDirs`), and the broker serves its other directories;
* without `cluster.id` (written by an older broker): the cluster id is added.

Written atomically (temp file, fsync, rename, fsync the directory), so a crash leaves the old file
or the new one, never a torn mix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from odradek.errors import KafkaStorageError, OperatorError
from odradek.log.checkpoints import write_atomically

META_PROPERTIES = "meta.properties"
SUPPORTED_VERSIONS = ("0", "1")


@dataclass(frozen=True, slots=True)
class MetaProperties:
    broker_id: int | None
    cluster_id: str | None


def _parse(text: str, path: Path) -> MetaProperties | None:
    values: dict[str, str] = {}
    lines = text.split("\n")
    # Every line we write ends in a newline: an unterminated last line is a torn write, and may
    # be a prefix of the real one ("cluster.id=ab" of "cluster.id=abcd"). It is ignored, so the
    # value it held is written again (regression: test_torn_writes, meta.properties cut inside
    # the cluster id made the broker refuse to start, taking the cut id for another cluster's).
    torn = lines.pop() != ""
    for raw in lines:
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        values[key.strip()] = value.strip()
    version = values.get("version")
    if version is None and torn:
        return None  # torn before the first line was complete: as good as empty
    if version not in SUPPORTED_VERSIONS:
        raise KafkaStorageError(f"malformed {path}: version {version!r}")
    broker_id: int | None = None
    if "broker.id" in values:
        try:
            broker_id = int(values["broker.id"])
        except ValueError:
            raise KafkaStorageError(
                f"malformed {path}: broker.id {values['broker.id']!r}"
            ) from None
    return MetaProperties(broker_id, values.get("cluster.id") or None)


def read_meta_properties(log_dir: Path) -> MetaProperties | None:
    """The directory's meta.properties; None when missing or empty. KafkaStorageError when it
    cannot be read or parsed (the directory is then an error directory)."""
    path = log_dir / META_PROPERTIES
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise KafkaStorageError(f"cannot read {path}: {e}") from e
    if not text.strip():
        return None
    return _parse(text, path)  # None when torn inside the first line


def write_meta_properties(log_dir: Path, broker_id: int, cluster_id: str) -> None:
    write_atomically(
        log_dir / META_PROPERTIES, f"version=0\nbroker.id={broker_id}\ncluster.id={cluster_id}\n"
    )


def check_meta_properties(log_dir: Path, broker_id: int, cluster_id: str) -> None:
    """Check (or write) one directory's meta.properties (rules in the module docstring).

    Raises OperatorError when the directory belongs to another broker or cluster, and
    KafkaStorageError when it cannot be read, parsed or written."""
    found = read_meta_properties(log_dir)
    if found is not None:
        if found.broker_id is not None and found.broker_id != broker_id:
            raise OperatorError(
                f"log dir {log_dir} belongs to broker.id={found.broker_id}, not {broker_id}"
            )
        if found.cluster_id is not None and found.cluster_id != cluster_id:
            raise OperatorError(
                f"log dir {log_dir} belongs to cluster {found.cluster_id}, "
                f"but ZooKeeper holds cluster {cluster_id}"
            )
        if found.broker_id is not None and found.cluster_id is not None:
            return
    write_meta_properties(log_dir, broker_id, cluster_id)
