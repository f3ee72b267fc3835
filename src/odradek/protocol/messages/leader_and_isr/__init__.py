"""LeaderAndIsr (api key 4): the controller's instruction to lead or follow partitions.

One package per version, as in kio: ``v5`` holds a ``request`` and a ``response`` module. It is the
only version Odradek's controller sends and its brokers accept (v6 adds the KRaft-era leader
recovery state). ``LeaderAndIsrType`` names the values of the request's ``type`` field.
"""

import enum


class LeaderAndIsrType(enum.IntEnum):
    """Values of ``LeaderAndIsrRequest.type`` (KIP-516), an int8 on the wire.

    UNKNOWN is what a ZooKeeper-mode controller sends. FULL promises that the request lists every
    partition the receiving broker should host, so the broker may delete any other local partition.
    """

    UNKNOWN = 0
    INCREMENTAL = 1
    FULL = 2
