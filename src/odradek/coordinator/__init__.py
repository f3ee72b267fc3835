"""Coordinators: the broker-side state machines that clients talk to through one elected broker
per key. `group/` is the consumer-group coordinator; `transaction/` is reserved for the
transaction coordinator. Coordinators sit beside `cluster/`: they may use the protocol, network,
ZooKeeper and log layers, never the controller or the server that wires them in.
"""
