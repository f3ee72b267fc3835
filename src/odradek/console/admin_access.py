"""The console's ACLs and transactions through the project's own admin clients (`odradek.admin`:
the same requests `odradek acls` and `odradek transactions` send; confluent-kafka has no
ListTransactions, DescribeTransactions, DescribeProducers or WriteTxnMarkers).

Each call opens its connections (authenticated with the `--command-config` security settings),
asks, and closes them: these pages are visited rarely, and a connection kept between visits would
have to survive broker restarts. Calls run on the app's event loop (the clients are asyncio).

Errors reach the pages as `ConsoleError` with Kafka's error name first (`SECURITY_DISABLED: ...`,
`CLUSTER_AUTHORIZATION_FAILED`), translated here so that the pages never see the clients' types.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.admin.acls import AclAdmin, delete_filter
from odradek.admin.client import KafkaResponseError, parse_bootstrap
from odradek.admin.groups import LATEST, GroupAdminClient
from odradek.admin.transactions import (
    ActiveProducer,
    TransactionDescription,
    TransactionListing,
    TransactionsAdmin,
)
from odradek.console.kafka_client import ConsoleError
from odradek.errors import OdradekError
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity
from odradek.security.acl import AclBinding

TIMEOUT_S = 10.0
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


@dataclass(frozen=True, slots=True)
class TransactionRow:
    """A listed transactional id with its description, or why it could not be described."""

    listing: TransactionListing
    description: TransactionDescription | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionTransactions:
    """One partition's side of transactions: its last stable offset (read_committed's end), high
    watermark, and active producers (or the error that kept them from us)."""

    topic: str
    partition: int
    last_stable_offset: int | None
    high_watermark: int | None
    producers: tuple[ActiveProducer, ...]
    error: str | None = None


def is_security_disabled(error: ConsoleError) -> bool:
    """The cluster has no authorizer: DescribeAcls and its kin answer SECURITY_DISABLED."""
    return str(error).startswith(ErrorCode.security_disabled.name.upper())


@asynccontextmanager
async def _translated() -> AsyncIterator[None]:
    try:
        yield
    except OdradekError as e:  # KafkaResponseError, OperatorError, NetworkError
        raise ConsoleError(str(e)) from None


class AdminAccess:
    """ACLs and transactions of the cluster at `bootstrap_servers`. Stateless between calls."""

    def __init__(self, bootstrap_servers: str, security: ClientSecurity = PLAINTEXT_CLIENT) -> None:
        self.servers = parse_bootstrap(bootstrap_servers)
        self.security = security

    @asynccontextmanager
    async def _acl_admin(self) -> AsyncIterator[AclAdmin]:
        async with _translated():
            client = await AclAdmin.connect(self.servers, TIMEOUT_S, self.security)
            try:
                yield client
            finally:
                client.close()

    @asynccontextmanager
    async def _transactions(self) -> AsyncIterator[TransactionsAdmin]:
        async with _translated():
            client = await GroupAdminClient.connect(self.servers, TIMEOUT_S, self.security)
            try:
                yield TransactionsAdmin(client)
            finally:
                client.close()

    # -- ACLs -------------------------------------------------------------------------------

    async def acls(self) -> list[AclBinding] | None:
        """Every binding (DescribeAcls with a match-any filter), sorted; None when the cluster
        has no authorizer (SECURITY_DISABLED)."""
        try:
            async with self._acl_admin() as admin:
                found = await admin.describe()
        except ConsoleError as e:
            if is_security_disabled(e):
                return None
            raise
        return sorted(AclBinding(p, e) for p, entries in found.items() for e in entries)

    async def create_acl(self, binding: AclBinding) -> None:
        async with self._acl_admin() as admin:
            await admin.create([binding])

    async def delete_acl(self, binding: AclBinding) -> int:
        """Delete exactly `binding` (a DeleteAcls filter matching only it); how many went."""
        async with self._acl_admin() as admin:
            return await admin.delete([delete_filter(binding.pattern, binding.entry)])

    # -- transactions -----------------------------------------------------------------------

    async def transactions(self, states: Sequence[str] = ()) -> list[TransactionRow]:
        """Every transactional id (in `states` when given) with its description: one
        ListTransactions per broker, then one DescribeTransactions per coordinator."""
        async with self._transactions() as admin:
            listed = await admin.list_transactions(states)
            by_coordinator: dict[int, list[TransactionListing]] = {}
            for listing in listed:
                by_coordinator.setdefault(listing.coordinator, []).append(listing)
            rows = []
            for coordinator, listings in sorted(by_coordinator.items()):
                try:
                    described = await admin.describe_at(
                        coordinator, [t.transactional_id for t in listings]
                    )
                except OdradekError as e:
                    rows += [TransactionRow(t, None, str(e)) for t in listings]
                    continue
                for listing, answer in zip(listings, described, strict=True):
                    if isinstance(answer, KafkaResponseError):
                        rows.append(TransactionRow(listing, None, str(answer)))
                    else:
                        rows.append(TransactionRow(listing, answer))
        return sorted(rows, key=lambda r: r.listing.transactional_id)

    async def transaction(self, transactional_id: str) -> TransactionDescription:
        async with self._transactions() as admin:
            return await admin.describe(transactional_id)

    async def partitions(
        self, partitions: Sequence[tuple[str, int]]
    ) -> list[PartitionTransactions]:
        """Each partition's LSO, HW and active producers (DescribeProducers at its leader)."""
        wanted = sorted(set(partitions))
        if not wanted:
            return []
        async with self._transactions() as admin:
            try:
                stable = await admin.client.list_offsets(wanted, LATEST, READ_COMMITTED)
                high = await admin.client.list_offsets(wanted, LATEST, READ_UNCOMMITTED)
                offsets_error = None
            except OdradekError as e:
                stable, high, offsets_error = {}, {}, str(e)
            rows = []
            for topic, partition in wanted:
                try:
                    producers = tuple(await admin.producers(topic, partition))
                    error = offsets_error
                except OdradekError as e:
                    producers, error = (), str(e)
                rows.append(
                    PartitionTransactions(
                        topic,
                        partition,
                        stable.get((topic, partition)),
                        high.get((topic, partition)),
                        producers,
                        error,
                    )
                )
        return rows

    async def abort(
        self, topic: str, partition: int, start_offset: int, producer_id: int | None
    ) -> tuple[int, int, int]:
        """`odradek transactions abort --start-offset`: an ABORT marker (WriteTxnMarkers) for the
        producer whose open transaction starts there. (producer id, epoch, coordinator epoch)."""
        async with self._transactions() as admin:
            return await admin.abort_hanging(topic, partition, start_offset, producer_id)


def admin_access(state: Any) -> AdminAccess:
    """The `AdminAccess` of the console whose `ConsoleState` is `state` (its bootstrap servers
    and `--command-config` security)."""
    return AdminAccess(state.settings.bootstrap_servers, state.settings.security)
