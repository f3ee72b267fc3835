// Kafka 3.9.1's idempotent Java producer, driven line by line by
// tests/integration/test_idempotent_duplicate_differential.py (the Java side of its scenario).
//
// Usage: java -cp <classes>:<kafka libs>/* EpochBumpProducer BOOTSTRAP REQUEST_TIMEOUT_MS DELIVERY_TIMEOUT_MS
// Commands on stdin, one a line: "send TOPIC VALUE" (to partition 0), "flush", "close".
// Printed on stdout: "ack VALUE" or "error VALUE EXCEPTION" for each record, "flushed" after each
// flush, "closed" at the end; the client's own log lines go to stdout too (log4j, configured by
// the caller), which is how the test sees the request timeouts and the epoch bump.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class EpochBumpProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("enable.idempotence", "true");
        props.put("acks", "all");
        props.put("request.timeout.ms", args[1]);
        props.put("delivery.timeout.ms", args[2]);
        props.put("linger.ms", "1");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        try (KafkaProducer<String, String> producer =
                new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
            String line;
            while ((line = in.readLine()) != null && !line.equals("close")) {
                String[] command = line.split(" ");
                if (command[0].equals("send")) {
                    final String value = command[2];
                    producer.send(new ProducerRecord<>(command[1], 0, null, value), (metadata, error) -> {
                        synchronized (System.out) {
                            System.out.println(error == null
                                ? "ack " + value
                                : "error " + value + " " + error.getClass().getSimpleName());
                            System.out.flush();
                        }
                    });
                } else if (command[0].equals("flush")) {
                    producer.flush();
                    synchronized (System.out) {
                        System.out.println("flushed");
                        System.out.flush();
                    }
                }
            }
        }
        System.out.println("closed");
    }
}
