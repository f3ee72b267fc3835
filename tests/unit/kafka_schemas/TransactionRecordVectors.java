// Writes the test vectors of `transaction_record_vectors.json` with Kafka's own classes.
//
//   java -cp "$(./dev kafka)/*" tests/unit/kafka_schemas/TransactionRecordVectors.java \
//       > tests/unit/kafka_schemas/transaction_record_vectors.json
//
// Each vector is a record key or value of `__transaction_state` in every version Kafka 3.9 reads
// (a big-endian int16 version, then the message), or an end-transaction marker (control record
// key and value) as Kafka's EndTransactionMarker writes it. tests/unit/test_transaction_records.py
// decodes every vector with Odradek's codec and encodes it again, byte for byte.

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;

import org.apache.kafka.common.protocol.Message;
import org.apache.kafka.common.protocol.MessageUtil;
import org.apache.kafka.common.record.ControlRecordType;
import org.apache.kafka.common.record.EndTransactionMarker;
import org.apache.kafka.coordinator.transaction.generated.TransactionLogKey;
import org.apache.kafka.coordinator.transaction.generated.TransactionLogValue;

public class TransactionRecordVectors {
    private static final List<String> lines = new ArrayList<>();

    private static void vector(String name, int version, byte[] bytes) {
        lines.add(String.format("  {\"name\": \"%s\", \"version\": %d, \"hex\": \"%s\"}",
            name, version, HexFormat.of().formatHex(bytes)));
    }

    private static void message(String name, int version, Message message) {
        vector(name, version, MessageUtil.toVersionPrefixedBytes((short) version, message));
    }

    private static byte[] bytes(ByteBuffer buffer) {
        byte[] out = new byte[buffer.remaining()];
        buffer.get(out);
        return out;
    }

    public static void main(String[] args) {
        message("TransactionLogKey", 0, new TransactionLogKey().setTransactionalId("txn-€-𝄞"));
        for (int version = 0; version <= 1; version++) {
            List<TransactionLogValue.PartitionsSchema> partitions = new ArrayList<>();
            partitions.add(new TransactionLogValue.PartitionsSchema()
                .setTopic("orders").setPartitionIds(List.of(0, 3, 2147483647)));
            partitions.add(new TransactionLogValue.PartitionsSchema()
                .setTopic("__consumer_offsets").setPartitionIds(List.of(17)));
            message("TransactionLogValue", version, new TransactionLogValue()
                .setProducerId(123456789012L)
                .setProducerEpoch((short) 7)
                .setTransactionTimeoutMs(60000)
                .setTransactionStatus((byte) 1)
                .setTransactionPartitions(partitions)
                .setTransactionLastUpdateTimestampMs(1700000000123L)
                .setTransactionStartTimestampMs(1700000000001L));
            message("TransactionLogValue", version, new TransactionLogValue()
                .setProducerId(5L)
                .setProducerEpoch((short) 0)
                .setTransactionTimeoutMs(900000)
                .setTransactionStatus((byte) 0)
                .setTransactionPartitions(null)
                .setTransactionLastUpdateTimestampMs(1700000000999L)
                .setTransactionStartTimestampMs(-1L));
        }
        EndTransactionMarker commit = new EndTransactionMarker(ControlRecordType.COMMIT, 42);
        EndTransactionMarker abort = new EndTransactionMarker(ControlRecordType.ABORT, 7);
        vector("MarkerValueCommit", 0, bytes(commit.serializeValue()));
        vector("MarkerValueAbort", 0, bytes(abort.serializeValue()));
        System.out.println("[");
        System.out.println(String.join(",\n", lines));
        System.out.println("]");
    }
}
