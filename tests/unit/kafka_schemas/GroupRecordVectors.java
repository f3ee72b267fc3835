// Writes the test vectors of `group_record_vectors.json` with Kafka's own generated classes.
//
//   java -cp "$(./dev kafka)/*" tests/unit/kafka_schemas/GroupRecordVectors.java \
//       > tests/unit/kafka_schemas/group_record_vectors.json
//
// (or any directory holding kafka-clients and kafka-group-coordinator 3.9.x). Each vector is one
// record key or value of the `__consumer_offsets` topic in every version Kafka 3.9 reads,
// serialized as Kafka's coordinator writes it: a big-endian int16 version, then the message.
// tests/unit/test_group_schemas.py decodes every vector with Odradek's codec and encodes it again,
// byte for byte.

import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;

import org.apache.kafka.common.protocol.Message;
import org.apache.kafka.common.protocol.MessageUtil;
import org.apache.kafka.coordinator.group.generated.GroupMetadataKey;
import org.apache.kafka.coordinator.group.generated.GroupMetadataValue;
import org.apache.kafka.coordinator.group.generated.OffsetCommitKey;
import org.apache.kafka.coordinator.group.generated.OffsetCommitValue;

public class GroupRecordVectors {
    private static final List<String> lines = new ArrayList<>();

    private static void vector(String name, int version, Message message) {
        byte[] bytes = MessageUtil.toVersionPrefixedBytes((short) version, message);
        lines.add(String.format("  {\"name\": \"%s\", \"version\": %d, \"hex\": \"%s\"}",
            name, version, HexFormat.of().formatHex(bytes)));
    }

    private static GroupMetadataValue group(int version) {
        GroupMetadataValue value = new GroupMetadataValue()
            .setProtocolType("consumer")
            .setGeneration(42)
            .setProtocol("range")
            .setLeader("consumer-1-4f1c")
            .setCurrentStateTimestamp(version >= 2 ? 1700000000123L : -1L);
        GroupMetadataValue.MemberMetadata dynamic = new GroupMetadataValue.MemberMetadata()
            .setMemberId("consumer-1-4f1c")
            .setClientId("consumer-1")
            .setClientHost("/127.0.0.1")
            .setRebalanceTimeout(version >= 1 ? 300000 : -1)
            .setSessionTimeout(45000)
            .setSubscription(new byte[] {0, 1, 0, 0, 0, 1, 0, 6, 't', 'o', 'p', 'i', 'c', 'a', -1, -1, -1, -1})
            .setAssignment(new byte[] {0, 1, 0, 0, 0, 0, -1, -1, -1, -1});
        GroupMetadataValue.MemberMetadata fixed = new GroupMetadataValue.MemberMetadata()
            .setMemberId("instance-2-9a7e")
            .setGroupInstanceId(version >= 3 ? "instance-2" : null)
            .setClientId("consümer-2")
            .setClientHost("/10.0.0.2")
            .setRebalanceTimeout(version >= 1 ? 60000 : -1)
            .setSessionTimeout(10000)
            .setSubscription(new byte[0])
            .setAssignment(new byte[] {1, 2, 3});
        value.setMembers(List.of(dynamic, fixed));
        return value;
    }

    public static void main(String[] args) {
        for (int version = 0; version <= 1; version++) {
            vector("OffsetCommitKey", version, new OffsetCommitKey()
                .setGroup("group-1").setTopic("orders").setPartition(7));
        }
        vector("OffsetCommitKey", 1, new OffsetCommitKey()
            .setGroup("grüppe-€-𝄞").setTopic("t").setPartition(2147483647));
        for (int version = 0; version <= 4; version++) {
            vector("OffsetCommitValue", version, new OffsetCommitValue()
                .setOffset(1234567890123L)
                .setLeaderEpoch(version >= 3 ? 9 : -1)
                .setMetadata("checkpoint ✓")
                .setCommitTimestamp(1700000000456L)
                .setExpireTimestamp(version == 1 ? 1700604800456L : -1L));
        }
        vector("OffsetCommitValue", 3, new OffsetCommitValue()
            .setOffset(0).setLeaderEpoch(-1).setMetadata("").setCommitTimestamp(0));
        vector("GroupMetadataKey", 2, new GroupMetadataKey().setGroup("group-1"));
        for (int version = 0; version <= 4; version++) {
            vector("GroupMetadataValue", version, group(version));
        }
        for (int version = 0; version <= 4; version++) {
            vector("GroupMetadataValue", version, new GroupMetadataValue()
                .setProtocolType("")
                .setGeneration(3)
                .setProtocol(null)
                .setLeader(null)
                .setCurrentStateTimestamp(version >= 2 ? 1700000000999L : -1L)
                .setMembers(new ArrayList<>()));
        }
        System.out.println("[");
        System.out.println(String.join(",\n", lines));
        System.out.println("]");
    }
}
