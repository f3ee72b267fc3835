"""SCRAM credentials in ZooKeeper: the cache, the loader following /config/changes, the writes."""

from __future__ import annotations

import asyncio
import json

from odradek.security.credential_store import CredentialCache, CredentialStore, user_of_entity_path
from odradek.security.sasl_scram import ScramClient, ScramServer
from odradek.security.scram import (
    ScramMechanism,
    generate_credential,
    scram_configs_from_add_config,
)
from odradek.security.znodes import UserConfigZNode
from odradek.zk.znodes import ConfigChangeNotificationSequenceZNode
from tests.fakes.controller_zk import FakeZooKeeper

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512


def authenticates(
    cache: CredentialCache, mechanism: ScramMechanism, user: str, password: str
) -> bool:
    server = ScramServer(mechanism, cache.lookup(mechanism))
    client = ScramClient(mechanism, user, password)
    try:
        final = client.final_message(server.evaluate(client.first_message()))
        client.verify_server_final(server.evaluate(final))
    except Exception:
        return False
    return True


def test_entity_paths() -> None:
    assert user_of_entity_path("users/alice") == "alice"
    assert user_of_entity_path("users/a%20b") == "a b"
    assert user_of_entity_path("users/alice/clients/c1") is None
    assert user_of_entity_path("topics/t") is None


def test_cache_ignores_bad_credentials() -> None:
    cache = CredentialCache()
    good = generate_credential(SHA256, "pw").to_string()
    cache.update_user("alice", {"SCRAM-SHA-256": good, "SCRAM-SHA-512": "garbage", "x": "1"})
    assert cache.get(SHA256, "alice") is not None and cache.get(SHA512, "alice") is None
    cache.remove_user("alice")
    assert cache.get(SHA256, "alice") is None


def test_load_follow_and_write() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        # A user written the way kafka-configs.sh --zookeeper writes it, before the broker starts.
        config = scram_configs_from_add_config("SCRAM-SHA-512=[iterations=8192,password=bob-pw]")
        tree.create("/config/users/bob", UserConfigZNode.encode(config), makepath=True)
        broker1 = CredentialStore(tree.client(), CredentialCache())
        broker2 = CredentialStore(tree.client(), CredentialCache())
        await broker1.start()
        await broker2.start()
        assert authenticates(broker1.cache, SHA512, "bob", "bob-pw")
        assert not authenticates(broker1.cache, SHA256, "bob", "bob-pw")

        await broker1.alter_credentials(
            "alice smith", {SHA256: generate_credential(SHA256, "alice-pw", 8192)}
        )
        data, _ = tree.get("/config/users/alice%20smith")
        stored = json.loads(data)
        assert stored["version"] == 1 and stored["config"]["SCRAM-SHA-256"].startswith("salt=")
        (change,) = [c for c in tree.get_children("/config/changes")]
        notification = ConfigChangeNotificationSequenceZNode.decode(
            tree.get(f"/config/changes/{change}")[0], 0
        )
        assert (notification.entity_type, notification.entity_name) == ("users", "alice%20smith")
        await broker2.wait_idle()
        assert authenticates(broker2.cache, SHA256, "alice smith", "alice-pw")

        await broker1.alter_credentials("alice smith", deletions=(SHA256,))
        await broker2.wait_idle()
        assert not authenticates(broker2.cache, SHA256, "alice smith", "alice-pw")

        # Someone deletes bob's znode and announces it.
        tree.delete("/config/users/bob")
        tree.create(
            "/config/changes/config_change_",
            ConfigChangeNotificationSequenceZNode.encode("users", "bob"),
            sequence=True,
        )
        await broker2.wait_idle()
        assert not authenticates(broker2.cache, SHA512, "bob", "bob-pw")
        # A topic config change is not ours and does not disturb anything.
        tree.create(
            "/config/changes/config_change_",
            ConfigChangeNotificationSequenceZNode.encode("topics", "t"),
            sequence=True,
        )
        await broker2.wait_idle()
        broker1.close()
        broker2.close()

    asyncio.run(go())


def test_writes_keep_other_user_configs() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        tree.create(
            "/config/users/carol",
            UserConfigZNode.encode({"producer_byte_rate": "1024"}),
            makepath=True,
        )
        store = CredentialStore(tree.client(), CredentialCache())
        await store.start()
        await store.alter_credentials("carol", {SHA512: generate_credential(SHA512, "pw")})
        config = json.loads(tree.get("/config/users/carol")[0])["config"]
        assert set(config) == {"producer_byte_rate", "SCRAM-SHA-512"}

    asyncio.run(go())


def test_admin_reads_see_zookeeper_not_the_cache() -> None:
    """DescribeUserScramCredentials and the deletion check read ZooKeeper (as Kafka does): a write
    made through one broker is seen through another at once, before that broker's cache has
    followed the change notification; the reads leave the cache alone."""

    async def go() -> None:
        tree = FakeZooKeeper()
        writer = CredentialStore(tree.client(), CredentialCache())
        reader = CredentialStore(tree.client(), CredentialCache())  # not started: hears nothing
        await writer.start()
        await writer.alter_credentials("carol", {SHA512: generate_credential(SHA512, "pw", 8192)})
        tree.create("/config/users/dave", UserConfigZNode.encode({"producer_byte_rate": "1"}))
        credentials = await reader.read_credentials("carol")
        assert list(credentials) == [SHA512] and credentials[SHA512].iterations == 8192
        assert await reader.read_credentials("nobody") == {}
        # dave has a quota but no credential: not listed.
        assert await reader.users_with_credentials() == ["carol"]
        assert reader.cache.get(SHA512, "carol") is None

    asyncio.run(go())
