"""Client quotas (KIP-13, KIP-55, KIP-124, KIP-219, KIP-257) and replication throttles (KIP-73).

* `rate`: Kafka's windowed rate (`Rate`/`SimpleRate` over `SampledStat` samples) and the throttle
  time that brings an observed rate back to its bound (`QuotaUtils.throttleTime`); pure.
* `entities`: quota entities (user, client id, user+client id, and their `<default>`s) and Kafka's
  eight levels of precedence; pure.
* `manager`: `ClientQuotaManager` per quota type (produce bytes, fetch bytes, request time) and
  `ClientQuotas`, what the request handlers ask; event-loop thread only.
* `store`: the quotas in ZooKeeper (`/config/users`, `/config/clients`, change notifications under
  `/config/changes`), kept applied to the managers, and the reads and writes behind
  DescribeClientQuotas and AlterClientQuotas.
* `replication`: the broker's side of replication throttles: the throttled rates from
  `/config/brokers/<id>` and `<default>`, the throttled replicas from the topic configs.
"""
