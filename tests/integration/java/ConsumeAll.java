// Reads a topic from the beginning with Kafka's own Java consumer (kafka-clients 3.9.1) and prints
// each record's value, one per line, until it has COUNT records or TIMEOUT_MS passes.
// Usage: java -cp 'libs/*:DIR' ConsumeAll BOOTSTRAP TOPIC COUNT TIMEOUT_MS [key=value ...]
// The extra key=value pairs are consumer properties. Compiled by the tests with javac.

import java.time.Duration;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class ConsumeAll {
    public static void main(String[] args) {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("group.id", "consume-all-" + System.nanoTime());
        props.put("auto.offset.reset", "earliest");
        props.put("enable.auto.commit", "false");
        for (int i = 4; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
        long count = Long.parseLong(args[2]);
        long deadline = System.currentTimeMillis() + Long.parseLong(args[3]);
        long seen = 0;
        try (KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(List.of(args[1]));
            while (seen < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(500))) {
                    System.out.println(new String(record.value()));
                    seen++;
                }
            }
        }
        System.out.flush();
    }
}
