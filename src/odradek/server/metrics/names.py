"""Kafka's metric names in the form the Prometheus JMX exporter gives them.

Kafka registers Yammer metrics as MBeans `kafka.<domain>:type=<Type>,name=<Name>[,key=value...]`,
each with attributes (`Count` for meters, `Value` for gauges; `Count`, `Mean`, `Max`, ... for
histograms). The JMX exporter's Kafka example rules, with `lowercaseOutputName: true`, turn
`kafka.<domain><type=(.+), name=(.+)><>(Count|Value|Mean|Max)` into `kafka_<domain>_$1_$2_$3`, and
the MBean's other keys into labels. So

    kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec,topic=t  attribute Count
    -> kafka_server_brokertopicmetrics_messagesinpersec_count{topic="t"}

Characters Prometheus does not allow in a name (`-` in `socket-server-metrics`) become `_`, as the
exporter does.
"""

from __future__ import annotations

import re
from functools import cache

from odradek.protocol.codec import ApiKey

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


# Memoized (a scrape asks for the same few hundred names every time); the arguments come from
# the code and Kafka's API keys, a bounded set.
@cache
def jmx_metric_name(mbean_domain: str, mbean_type: str, name: str | None, attribute: str) -> str:
    """`("kafka.server", "BrokerTopicMetrics", "MessagesInPerSec", "Count")` ->
    `kafka_server_brokertopicmetrics_messagesinpersec_count`; `name` is None for MBeans that
    have none (`socket-server-metrics`)."""
    parts = [mbean_domain, mbean_type] + ([name] if name else []) + [attribute]
    return _INVALID.sub("_", "_".join(parts)).lower()


@cache
def request_name(api_key: int) -> str:
    """The `request` key Kafka's RequestMetrics MBeans carry: the API's name in CamelCase."""
    try:
        words = ApiKey(api_key).name.split("_")
    except ValueError:
        return f"Unknown{api_key}"
    return "".join(w.capitalize() for w in words)
