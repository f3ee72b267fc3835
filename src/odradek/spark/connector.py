"""Spark's own Kafka connector (`format("kafka")`, spark-sql-kafka-0-10) against Odradek: its jars.

Odradek speaks the Kafka protocol, so Spark's built-in connector reads from and writes to it
unchanged; all it needs is the connector on the classpath. `./dev setup` fetches
`org.apache.spark:spark-sql-kafka-0-10_2.13` and its runtime dependencies from Maven Central into
a cache directory outside the repository, one per PySpark version
(`~/.cache/odradek/spark-kafka-<pyspark version>/`, or `ODRADEK_SPARK_KAFKA_LIBS`), with a file
`connector-version` naming the connector's version (PySpark's own when Maven Central has it, else
the newest release before it). `connector_jars()` lists the jars to give Spark as `spark.jars`:
the cache's jars minus those PySpark already ships (scala-library, snappy, lz4, hadoop-client...),
so that no class is on the classpath twice in two versions. Nothing is downloaded at run time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from odradek.errors import OperatorError

__all__ = ["connector_jars", "connector_libs", "connector_version"]

_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d[\w.\-]*)\.jar$")


def _pyspark() -> tuple[str, Path]:
    import pyspark

    return pyspark.__version__, Path(pyspark.__file__).parent / "jars"


def connector_libs() -> Path:
    """The cache directory of the connector's jars for the installed PySpark."""
    override = os.environ.get("ODRADEK_SPARK_KAFKA_LIBS")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "odradek" / f"spark-kafka-{_pyspark()[0]}"


def connector_version(libs: Path | None = None) -> str:
    """The version of spark-sql-kafka-0-10 in the cache; OperatorError when it is not there."""
    libs = libs or connector_libs()
    marker = libs / "connector-version"
    if not marker.is_file():
        raise OperatorError(
            f"Spark's Kafka connector is not in {libs}: run ./dev setup (or ./dev spark-kafka)"
        )
    return marker.read_text().strip()


def _artifact(jar_name: str) -> str:
    match = _VERSIONED_JAR.match(jar_name)
    return match.group("artifact") if match else jar_name


def connector_jars(libs: Path | None = None) -> list[str]:
    """The jars to pass as `spark.jars` (paths, sorted); OperatorError when they are missing."""
    libs = libs or connector_libs()
    connector_version(libs)
    shipped = {_artifact(jar.name) for jar in _pyspark()[1].glob("*.jar")}
    return sorted(str(jar) for jar in libs.glob("*.jar") if _artifact(jar.name) not in shipped)


if __name__ == "__main__":  # `spark-submit --jars $(python -m odradek.spark.connector)`
    print(",".join(connector_jars()))
