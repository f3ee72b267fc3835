"""The broker's Prometheus metrics, with Kafka's MBean names as the JMX exporter renders them.

`names`: the naming convention (pure); `request_metrics`: per-API counts and times, bumped on the
event loop; `snapshot`: every other value, computed from the broker's components at scrape time on
the loop thread; `exporter`: the `/metrics` HTTP server on its own thread (`metrics.listener`).
"""
