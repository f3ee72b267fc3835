"""What the request handlers see of the broker: `BrokerServices`, a Protocol that `Broker` satisfies.

Handlers take this rather than the `Broker` class, so that the request routing (`apis`) and the
handlers (`handlers_*`) import nothing that imports them back: `broker` imports `apis`, `apis`
imports the handlers, and the handlers import only this module (for typing) and the components
they call. A test may hand a handler any object with these members.

Concurrency: every member is used on the broker's event loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ReplicaManager
    from odradek.controller.controller import KafkaController
    from odradek.coordinator.group.coordinator import GroupCoordinator
    from odradek.coordinator.group.txn_offsets import PendingTxnOffsets
    from odradek.coordinator.transaction.coordinator import TransactionCoordinator
    from odradek.coordinator.transaction.producer_id_manager import ProducerIdManager
    from odradek.security.acl_store import AclStore
    from odradek.security.controller_requests import ControllerEpochValidator
    from odradek.security.credential_store import CredentialStore
    from odradek.server.admin.manager import AdminManager
    from odradek.server.admin.topic_configs import TopicConfigs
    from odradek.server.authorization import RequestAuthorizer
    from odradek.server.config import KafkaConfig
    from odradek.server.dynamic_config import DynamicBrokerConfig
    from odradek.server.fetch_session import FetchManager
    from odradek.server.metadata_cache import MetadataCache
    from odradek.server.quota.broker_quotas import BrokerQuotas


class BrokerServices(Protocol):
    """The broker's components and hooks that request handlers use."""

    config: KafkaConfig
    broker_id: int
    cluster_id: str
    broker_epoch: int
    """The czxid of our registration; -1 until registered (controller requests wait for it)."""
    registered: asyncio.Event
    latest_controller_epoch: int
    """The newest controller epoch seen in a controller request; older ones are refused."""
    metadata_cache: MetadataCache
    replica_manager: ReplicaManager
    controller: KafkaController
    admin: AdminManager
    topic_configs: TopicConfigs
    group_coordinator: GroupCoordinator
    transaction_coordinator: TransactionCoordinator
    producer_id_manager: ProducerIdManager
    """Producer ids for InitProducerId, in blocks reserved in ZooKeeper."""
    txn_offsets: PendingTxnOffsets
    """Transactional offset commits waiting for their transaction's marker."""
    authorizer: RequestAuthorizer
    """Every handler's authorization question (`odradek.server.authorization`)."""
    controller_validator: ControllerEpochValidator
    """Checks a controller request's controller and broker epochs against ZooKeeper."""
    live_broker_epochs: dict[int, int]
    """Every live broker's epoch (czxid of its registration), from a `/brokers/ids` watch."""
    acl_store: AclStore | None
    """ACLs in ZooKeeper (CreateAcls, DeleteAcls); None without an authorizer."""
    credential_store: CredentialStore
    """SCRAM credentials in ZooKeeper (Describe/AlterUserScramCredentials)."""
    fetch_manager: FetchManager
    """Incremental fetch sessions (KIP-227)."""
    quotas: BrokerQuotas
    """Client quotas (`quotas.client`: produce, fetch, request; `quotas.store`: ZooKeeper) and
    replication throttles (`quotas.replication`), `odradek.server.quota`."""
    dynamic_config: DynamicBrokerConfig
    """Dynamic broker configs (KIP-226): their levels, validation and synonyms."""

    def refresh_live_broker_epochs(self) -> None:
        """Re-read `live_broker_epochs` from ZooKeeper soon (rate-limited)."""

    def maybe_auto_create_topic(self, topic: str) -> None: ...

    def ensure_offsets_topic(self) -> None: ...

    def ensure_transaction_topic(self) -> None: ...

    async def wait_for_metadata(self, condition: Callable[[], bool], timeout: float) -> bool: ...

    def on_metadata_updated(self) -> None: ...

    def forget_topic(self, topic: str) -> None: ...

    def log_config_for(self, topic: str) -> Any: ...
