"""Produce page-view events into a topic: seeded, bounded in count, at a fixed rate.

    .venv/bin/python pipelines/pageviews/generate.py --bootstrap 127.0.0.1:9092 \\
        --topic pageviews --count 20000 --rate 2000 --seed 7

Events are as `pageviews.py` describes them. Given the same seed and arguments the generator
produces the same events in the same order (only the produce timing varies): users pick pages by
a Zipf-like popularity, sessions hop between related pages, and event time advances with the
site's traffic (`--event-rate` views per second of event time; `--rate` is how fast they are
produced), starting at `--start` (default 2026-01-01T12:00:00Z). A fraction of events is out of
order (a small jitter) and a smaller fraction late (up to `--max-lateness-s`, which must stay below
the job's watermark delay so that none is dropped); the last record is the end-of-stream marker,
sent only once every view is acknowledged. Records are keyed by user id and produced with
acks=all; the topic is created if missing. Prints a JSON summary (with `last_view_time`, the
latest event time of any view).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pageviews import END_OF_STREAM, VIEW

SECTIONS = ["products", "blog", "docs", "pricing", "careers", "support"]
REFERRERS = ["search", "direct", "social", "email", "ads", "partner"]
DEVICES = ["desktop", "mobile", "tablet"]


def iso(moment: dt.datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def events(
    count: int,
    event_rate: float,
    seed: int,
    start: dt.datetime,
    users: int,
    pages: int,
    out_of_order: float,
    late: float,
    max_lateness_s: float,
    stop: Callable[[], bool] = lambda: False,
) -> Iterator[dict[str, Any]]:
    """`count` view events (fewer if `stop()` turns true before), then the end-of-stream marker."""
    rng = random.Random(seed)
    catalogue = ["/"] + [f"/{SECTIONS[i % len(SECTIONS)]}/{i}" for i in range(max(1, pages - 1))]
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(catalogue))]  # Zipf-like popularity
    current_page: dict[str, str] = {}
    latest = start
    views = 0
    for i in range(count):
        if stop():
            break
        views += 1
        clock = start + dt.timedelta(seconds=i / event_rate)
        user = f"u{rng.randrange(users):04d}"
        previous = current_page.get(user)
        if previous is not None and rng.random() < 0.6:
            # Within a session: a neighbouring page of the same catalogue.
            index = catalogue.index(previous) + rng.choice((-2, -1, 1, 2))
            page = catalogue[index % len(catalogue)]
        else:
            page = rng.choices(catalogue, weights)[0]
        current_page[user] = page
        event_time = clock
        draw = rng.random()
        if draw < late:
            event_time = clock - dt.timedelta(seconds=rng.uniform(1.0, max_lateness_s))
        elif draw < late + out_of_order:
            event_time = clock - dt.timedelta(milliseconds=rng.uniform(10, 900))
        latest = max(latest, event_time)
        yield {
            "event_id": f"e-{i:07d}",
            "event_type": VIEW,
            "user_id": user,
            "page": page,
            "referrer": rng.choice(REFERRERS),
            "device": rng.choices(DEVICES, (6, 5, 1))[0],
            "dwell_ms": int(rng.lognormvariate(8.5, 0.8)),
            "event_time": iso(event_time),
        }
    yield {
        "event_id": f"e-{views:07d}",
        "event_type": END_OF_STREAM,
        "user_id": "generator",
        "page": None,
        "referrer": None,
        "device": None,
        "dwell_ms": 0,
        "event_time": iso(latest + dt.timedelta(hours=1)),
    }


def ensure_topic(bootstrap: str, topic: str, partitions: int, replication: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=30).topics:
        return
    futures = admin.create_topics([NewTopic(topic, partitions, replication)], operation_timeout=60)
    for future in futures.values():
        try:
            future.result(timeout=120)
        except Exception as e:  # created concurrently by someone else: fine
            error = e.args[0] if e.args else None
            if not (
                isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
            ):
                raise


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", default="pageviews")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=2000, help="records produced per second")
    parser.add_argument(
        "--event-rate",
        type=float,
        default=50,
        help="views per second of event time (the site's traffic, independent of --rate)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--start", default="2026-01-01T12:00:00Z", help="event time of the first view"
    )
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument("--out-of-order", type=float, default=0.10)
    parser.add_argument("--late", type=float, default=0.02)
    parser.add_argument("--max-lateness-s", type=float, default=20.0)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument(
        "--stop-file",
        type=Path,
        help="stop producing views once this file exists (at most --count), then send the marker",
    )
    args = parser.parse_args()

    start = dt.datetime.fromisoformat(args.start.replace("Z", "+00:00"))
    ensure_topic(args.bootstrap, args.topic, args.partitions, args.replication_factor)
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 5,
        }
    )
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    started = time.monotonic()
    produced = 0
    views = 0
    last_view_time = None
    for event in events(
        args.count,
        args.event_rate,
        args.seed,
        start,
        args.users,
        args.pages,
        args.out_of_order,
        args.late,
        args.max_lateness_s,
        stop=args.stop_file.exists if args.stop_file is not None else (lambda: False),
    ):
        # Keep to the rate: the event clock and the wall clock advance together.
        ahead = produced / args.rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
        if event["event_type"] == VIEW:
            views += 1
            last_view_time = max(last_view_time or event["event_time"], event["event_time"])
        else:
            # The end-of-stream marker moves the job's watermark past every window: it must not
            # be readable before every view is. Views still in flight in another partition
            # could otherwise reach the job after the watermark passed their window and be
            # dropped as late. Once flushed, every view is acknowledged (acks=all), so it is
            # below its partition's high watermark before the marker is even sent.
            producer.flush(120)
        while True:
            try:
                producer.produce(
                    args.topic,
                    key=event["user_id"].encode(),
                    value=json.dumps(event, separators=(",", ":")).encode(),
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.05)
        produced += 1
        producer.poll(0)
    unacknowledged = producer.flush(120)
    elapsed = time.monotonic() - started
    print(
        json.dumps(
            {
                "generator": "pageviews",
                "topic": args.topic,
                "produced": produced,
                "views": views,
                "failed": len(failures),
                "unacknowledged": unacknowledged,
                "seconds": round(elapsed, 2),
                "seed": args.seed,
                "last_view_time": last_view_time,
            }
        ),
        flush=True,
    )
    return 1 if failures or unacknowledged else 0


if __name__ == "__main__":
    sys.exit(main())
