"""The consumer-group coordinator (Kafka's classic group protocol) on `__consumer_offsets`, in
layers (Kafka's coordinator/group/):

* `handlers`, `handlers_offsets` -- the group APIs (FindCoordinator, JoinGroup, SyncGroup,
  Heartbeat, LeaveGroup, ListGroups, DescribeGroups, DeleteGroups; OffsetCommit, OffsetFetch,
  OffsetDelete): wire versions in and out;
* `coordinator` -- `GroupCoordinator`, the API-facing half: validation, one method per API;
* `rebalance` -- `GroupRebalancer`, the membership half: joins, the join barrier, generations,
  session and sync deadlines, persisting each new generation;
* `metadata_manager` -- `GroupMetadataManager`, the store: appends to the offsets topic, loads a
  partition when this broker becomes its leader, unloads it when it stops, expires offsets;
  `zk_import` imports the offsets earlier Odradek versions kept in ZooKeeper (`zk_offsets`);
* `log_records` -- record batches of the offsets topic, replaying a partition, a group as a record;
* `metadata`, `offsets` -- the data: group states and their valid previous states, members,
  groups, committed offsets and their expiry rules, timers, requests and results;
* `schemas`, `placement` -- Kafka's on-disk key and value schemas, and which partition holds a group.

The broker wires the coordinator in through narrow interfaces (`metadata_manager.OffsetsLog` to
the replica manager, `handlers.GroupServices`); nothing here imports `odradek.server`.
"""
