// Kafka 3.9.1's Java producer at its defaults, driven by tests/integration/test_idempotent_producer.py.
//
// Usage: java -cp <classes>:<kafka libs>/* IdempotentProducer BOOTSTRAP TOPIC COUNT
// The producer gets nothing but bootstrap.servers (serializers are passed to the constructor), so
// it runs with Kafka 3.x's defaults: enable.idempotence=true, acks=all, retries unbounded,
// max.in.flight.requests.per.connection=5. Each acknowledged record is printed as
// "ack PARTITION OFFSET VALUE", each failure as "error VALUE MESSAGE"; then "done".
import java.util.Properties;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class IdempotentProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        AtomicInteger failures = new AtomicInteger();
        try (KafkaProducer<String, String> producer =
                new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
            for (int i = 0; i < count; i++) {
                final String value = "j" + i;
                producer.send(new ProducerRecord<>(topic, null, value), (metadata, error) -> {
                    synchronized (System.out) {
                        if (error != null) {
                            failures.incrementAndGet();
                            System.out.println("error " + value + " " + error);
                        } else {
                            System.out.println(
                                "ack " + metadata.partition() + " " + metadata.offset() + " " + value);
                        }
                    }
                });
            }
            producer.flush();
        }
        System.out.println("done");
        System.exit(failures.get() == 0 ? 0 : 1);
    }
}
