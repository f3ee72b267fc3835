// Kafka 3.9.1's Java client against a broker, driven by tests/integration/test_transactions_kafka.py:
//
//   java -cp "$(./dev kafka)/*" tests/integration/TransactionalJavaClient.java BOOTSTRAP TOPIC TXN_ID
//
// A KafkaProducer with transactional.id commits a transaction of 5 records ("java-commit-N") and
// aborts one of 3 ("java-abort-N") on partition 0; a KafkaConsumer with
// isolation.level=read_committed reads the partition; the Admin client describes the producers
// of the partition and the transactional id, and lists transactions. Prints one JSON line.

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TransactionalJavaClient {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], txnId = args[2];
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("transactional.id", txnId);
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            producer.beginTransaction();
            for (int i = 0; i < 5; i++) {
                producer.send(new ProducerRecord<>(topic, 0, null, "java-commit-" + i));
            }
            producer.commitTransaction();
            producer.beginTransaction();
            for (int i = 0; i < 3; i++) {
                producer.send(new ProducerRecord<>(topic, 0, null, "java-abort-" + i));
            }
            producer.flush();
            producer.abortTransaction();
        }
        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("isolation.level", "read_committed");
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        List<String> values = new ArrayList<>();
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long deadline = System.currentTimeMillis() + 30000;
            while (System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    values.add(r.value());
                }
                if (consumer.position(tp) >= consumer.endOffsets(List.of(tp)).get(tp) && values.size() >= 5) {
                    break;
                }
            }
        }
        Properties a = new Properties();
        a.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(a)) {
            List<ProducerState> producers = admin.describeProducers(List.of(tp)).partitionResult(tp).get().activeProducers();
            TransactionDescription description = admin.describeTransactions(List.of(txnId)).description(txnId).get();
            Collection<TransactionListing> listings = admin.listTransactions().all().get();
            boolean listed = listings.stream().anyMatch(l -> l.transactionalId().equals(txnId));
            StringBuilder json = new StringBuilder("{\"values\": [");
            for (int i = 0; i < values.size(); i++) {
                json.append(i > 0 ? ", " : "").append('"').append(values.get(i)).append('"');
            }
            json.append("], \"producers\": ").append(producers.size())
                .append(", \"open_txn\": ").append(producers.stream().anyMatch(s -> s.currentTransactionStartOffset().isPresent()))
                .append(", \"state\": \"").append(description.state()).append('"')
                .append(", \"coordinator\": ").append(description.coordinatorId())
                .append(", \"listed\": ").append(listed).append("}");
            System.out.println(json);
        }
    }
}
