"""The consumer-group coordinator (Kafka's classic group protocol), in layers:

* `handlers` -- the group APIs (FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
  OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups): wire versions in and out;
* `coordinator` -- `GroupCoordinator`, the API-facing half: placement of groups on brokers,
  validation, one method per API;
* `rebalance` -- `GroupRebalancer`, the membership half: joins, the join barrier, generations,
  session and sync deadlines;
* `metadata` -- the data: group states and their valid previous states, members, groups, timers,
  requests and results;
* `offset_store` and `schemas` -- committed offsets and where they live in ZooKeeper.

The broker wires the coordinator in through narrow interfaces (`coordinator.LiveBrokers`,
`handlers.GroupServices`); nothing here imports `odradek.server`.
"""
