"""The web console: `odradek console --bootstrap-server H:P --zookeeper H:P --port N`.

A separate process (never inside a broker, so serving pages costs the brokers nothing but the
reads it makes) that renders server-side HTML pages with Jinja2 on Starlette under uvicorn; htmx,
installed from npm by `./dev setup` (never fetched at run time), polls fragments for live updates.

Where the data comes from:

* `zk_view`: ZooKeeper, read the way Kafka-aware tools read it (brokers, controller and epoch,
  topics and partition states, topic config overrides, reassignments, ISR change notifications),
  as one `ClusterSnapshot` refreshed at most every few seconds while someone is looking;
* `kafka_client`: the cluster through the Kafka protocol (confluent-kafka's AdminClient for
  configs, consumer groups, offsets and the operator actions; a consumer for the record browser);
* `broker_metrics`: the brokers' Prometheus `/metrics` endpoints (throughput, each replica's log
  end offset and size), scraped only while pages are being viewed.
* `broker_json`: the brokers' JSON endpoints on the same listener: `/state-changes` (a
  partition's history, `history`) and `/controller-events` (the controller page,
  `controller_view`).

`views` holds the pure logic the pages are made of (health counts, paging, filtering, lag
arithmetic, record rendering), tested on its own; `app` wires the routes; `assets` finds htmx.
"""
