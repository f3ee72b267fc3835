"""A Spark driver for the exactly-once sink test, run as its own process so it can be SIGKILLed.

    python tests/spark/eos_driver.py BOOTSTRAP INPUT OUTPUT CHECKPOINT [STALL_VALUE]

Streams INPUT (earliest, 100 offsets per trigger, `Trigger.AvailableNow`) into OUTPUT through the
`odradek` sink with `exactlyOnce=true`, and exits when the input is drained. With STALL_VALUE, the
task holding the row of that value stops there (sleeps) -- the test then kills the process while
the other task of that micro-batch has committed.
"""

from __future__ import annotations

import sys
import time

from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from odradek.spark.session import local_session

STALL_S = 600  # bounded: the test kills the driver long before


def main() -> None:
    bootstrap, source, sink, checkpoint = sys.argv[1:5]
    stall_value = sys.argv[5].encode() if len(sys.argv) > 5 else None

    def passthrough(value: bytes) -> bytes:
        if value == stall_value:
            print(f"stalling at {value!r}", flush=True)
            time.sleep(STALL_S)
        return value

    spark = local_session("odradek-eos-driver", master="local[2]")
    stalling = F.udf(passthrough, BinaryType())
    query = (
        spark.readStream.format("odradek")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "100")
        .load()
        .select(F.col("value").alias("key"), stalling("value").alias("value"))
        .writeStream.format("odradek")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("exactlyOnce", "true")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    print(f"query {query.id} started", flush=True)
    query.awaitTermination()
    for progress in query.recentProgress:
        print(f"batch {progress['batchId']}: {progress['numInputRows']} rows", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
