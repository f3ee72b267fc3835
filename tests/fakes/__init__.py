"""Test doubles for pure-logic tests of the controller.

`controller_zk` holds the project's only in-memory ZooKeeper (a znode tree with ZooKeeper's
versions, transactions and one-shot watches, and `FakeControllerZk`, the controller's facade over
it); `channel` holds `RecordingChannelManager`, which records the controller's requests per broker
instead of sending them. Both are stricter than production: they raise or record what a real
ZooKeeper or broker would refuse, so a test sees a mistake the moment it happens.

Integration tests use a real ZooKeeper (`tests/fixtures/zookeeper.py`), never these.
"""
