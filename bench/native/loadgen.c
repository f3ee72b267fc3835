/*
 * loadgen: a native Kafka load generator on librdkafka (Debian's librdkafka-dev), for
 * bench/peers.py. It prints one JSON object on stdout and exits 0, or prints an error on stderr
 * and exits 1.
 *
 *   loadgen produce BOOTSTRAP TOPIC PARTITIONS RECORDS SIZE ACKS CODEC
 *       RECORDS records of SIZE bytes spread round-robin over PARTITIONS, acks ACKS
 *       (0, 1 or -1), compression CODEC (none, lz4, zstd, gzip, snappy); linger 5 ms, 1 MB
 *       batches. Reports records/s and MB/s from the first send to the last delivery report.
 *   loadgen consume BOOTSTRAP TOPIC PARTITIONS RECORDS
 *       reads RECORDS records from the start of every partition (assigned, no group). Reports
 *       records/s and MB/s from the first record received to the last, taking them from the
 *       consumer queue in batches (rd_kafka_consume_batch_queue).
 *   loadgen latency BOOTSTRAP TOPIC PARTITIONS RATE SECONDS SIZE ACKS
 *       produces RATE records/s for SECONDS with acks ACKS while a consumer in the same process
 *       reads them; each record carries its send time, and the end-to-end latency (send to
 *       receive) percentiles p50/p99/p999 are reported in milliseconds.
 *
 * Build: cc -O2 -o loadgen loadgen.c -lrdkafka -lpthread   (bench/peers.py does it, linking the
 * librdkafka of the confluent-kafka wheel when there is one)
 */
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *what, const char *why) {
    fprintf(stderr, "loadgen: %s: %s\n", what, why);
    exit(1);
}

static void set(rd_kafka_conf_t *conf, const char *name, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(conf, name, value, err, sizeof err) != RD_KAFKA_CONF_OK)
        die(name, err);
}

/* -- produce -------------------------------------------------------------------------------- */

static long delivered, failed;
static double last_delivery;
static char first_error[256];

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (m->err) {
        if (!failed)
            snprintf(first_error, sizeof first_error, "%s", rd_kafka_err2str(m->err));
        failed++;
    } else {
        delivered++;
    }
    last_delivery = now_s();
}

static rd_kafka_t *producer(const char *bootstrap, const char *acks, const char *codec) {
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    set(conf, "bootstrap.servers", bootstrap);
    set(conf, "acks", acks);
    set(conf, "compression.codec", codec);
    set(conf, "linger.ms", "5");
    set(conf, "batch.size", "1000000");
    set(conf, "queue.buffering.max.messages", "1000000");
    set(conf, "queue.buffering.max.kbytes", "1048576");
    set(conf, "message.timeout.ms", "60000");
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk)
        die("producer", err);
    return rk;
}

static int produce(int argc, char **argv) {
    if (argc != 9)
        die("usage", "produce BOOTSTRAP TOPIC PARTITIONS RECORDS SIZE ACKS CODEC");
    const char *topic = argv[3];
    int partitions = atoi(argv[4]);
    long records = atol(argv[5]);
    int size = atoi(argv[6]);
    rd_kafka_t *rk = producer(argv[2], argv[7], argv[8]);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    char *payload = malloc(size);
    for (int i = 0; i < size; i++)
        payload[i] = 'a' + (i * 7 + i / 13) % 26; /* compressible like text, not trivially */
    double start = now_s();
    for (long i = 0; i < records; i++) {
        while (rd_kafka_produce(rkt, (int32_t)(i % partitions), RD_KAFKA_MSG_F_COPY, payload,
                                size, NULL, 0, NULL) == -1) {
            rd_kafka_resp_err_t err = rd_kafka_last_error();
            if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
                die("produce", rd_kafka_err2str(err));
            rd_kafka_poll(rk, 10);
        }
        if ((i & 1023) == 0)
            rd_kafka_poll(rk, 0);
    }
    while (delivered + failed < records)
        rd_kafka_poll(rk, 50);
    double seconds = last_delivery - start;
    if (seconds <= 0)
        seconds = 1e-9;
    printf("{\"op\":\"produce\",\"records\":%ld,\"failed\":%ld,\"size\":%d,\"acks\":\"%s\","
           "\"codec\":\"%s\",\"seconds\":%.3f,\"records_per_s\":%.0f,\"mb_per_s\":%.1f,"
           "\"error\":\"%s\"}\n",
           delivered, failed, size, argv[7], argv[8], seconds, delivered / seconds,
           delivered * (double)size / seconds / 1e6, first_error);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    free(payload);
    return failed ? 1 : 0;
}

/* -- consume -------------------------------------------------------------------------------- */

static rd_kafka_t *consumer(const char *bootstrap, const char *topic, int partitions) {
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    set(conf, "bootstrap.servers", bootstrap);
    char group[64];
    snprintf(group, sizeof group, "loadgen-%ld", (long)now_ns());
    set(conf, "group.id", group);
    set(conf, "enable.auto.commit", "false");
    set(conf, "enable.partition.eof", "false");
    set(conf, "fetch.wait.max.ms", "100");
    /* librdkafka stops fetching a partition for fetch.queue.backoff.ms (1 s by default) whenever
       its local queue holds more than queued.min.messages (100,000): with 100-byte records one
       fetch round of 12 partitions fills it, so the default measures that pause (every broker
       read 1M records in ~3.5 s, Kafka 3.9 and Odradek alike), not the broker. */
    set(conf, "fetch.queue.backoff.ms", "10");
    /* noida-db answers a fetch with everything it has, whatever fetch.max.bytes says (807 MB
       for 8M records of 100 B); librdkafka refuses a response above receive.message.max.bytes
       (100 MB) and fetches the same again until the deadline. The other systems keep to
       fetch.max.bytes (50 MB), so for them this changes nothing. */
    set(conf, "receive.message.max.bytes", "2147483647");
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk)
        die("consumer", err);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; p++)
        rd_kafka_topic_partition_list_add(list, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    if (rd_kafka_assign(rk, list))
        die("assign", "failed");
    rd_kafka_topic_partition_list_destroy(list);
    return rk;
}

static int consume(int argc, char **argv) {
    if (argc != 6)
        die("usage", "consume BOOTSTRAP TOPIC PARTITIONS RECORDS");
    int partitions = atoi(argv[4]);
    long records = atol(argv[5]);
    rd_kafka_t *rk = consumer(argv[2], argv[3], partitions);
    long got = 0;
    double bytes = 0, first = 0, last = 0, deadline = now_s() + 300;
    /* Messages are taken from the consumer's queue in batches of up to 8,192: one call per
       message (rd_kafka_consumer_poll) costs the generator more than reading costs a broker. */
    rd_kafka_queue_t *queue = rd_kafka_queue_get_consumer(rk);
    static rd_kafka_message_t *batch[8192];
    while (got < records && now_s() < deadline) {
        ssize_t n = rd_kafka_consume_batch_queue(queue, 100, batch, 8192);
        if (n < 0)
            die("consume", rd_kafka_err2str(rd_kafka_last_error()));
        for (ssize_t i = 0; i < n; i++) {
            rd_kafka_message_t *m = batch[i];
            if (m->err) {
                if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                    die("consume", rd_kafka_message_errstr(m));
            } else {
                if (!got)
                    first = now_s();
                got++;
                bytes += m->len;
            }
            rd_kafka_message_destroy(m);
        }
        if (n > 0)
            last = now_s();
    }
    rd_kafka_queue_destroy(queue);
    double seconds = last - first;
    if (seconds <= 0)
        seconds = 1e-9;
    printf("{\"op\":\"consume\",\"records\":%ld,\"seconds\":%.3f,\"records_per_s\":%.0f,"
           "\"mb_per_s\":%.1f}\n",
           got, seconds, got / seconds, bytes / seconds / 1e6);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return got < records ? 1 : 0;
}

/* -- end-to-end latency --------------------------------------------------------------------- */

struct latency_run {
    const char *bootstrap, *topic;
    int partitions;
    long expected;
    double *samples;
    long received;
    volatile int ready; /* the consumer has received a record: it is fetching */
    volatile int stop;
};

static void *latency_consumer(void *arg) {
    struct latency_run *run = arg;
    rd_kafka_t *rk = consumer(run->bootstrap, run->topic, run->partitions);
    while (!run->stop && run->received < run->expected) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 50);
        if (!m)
            continue;
        if (!m->err && m->len >= 8) {
            int64_t sent;
            run->ready = 1;
            memcpy(&sent, m->payload, 8);
            if (sent > 0 && run->received < run->expected)
                run->samples[run->received++] = (now_ns() - sent) / 1e6;
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return NULL;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(double *sorted, long n, double q) {
    if (n == 0)
        return -1;
    long index = (long)(q * (n - 1) + 0.5);
    return sorted[index];
}

/* Sleep until DUE, serving delivery reports meanwhile. The generator shares the machine with
   the brokers it measures, so it must not spin: a busy wait took a whole core of this 2-core
   machine away from them and the latency it reported was the brokers' CPU starvation. */
static void wait_until(rd_kafka_t *rk, double due) {
    for (;;) {
        double wait = due - now_s();
        if (wait <= 0)
            return;
        if (wait >= 0.002) {
            rd_kafka_poll(rk, (int)(wait * 1000) - 1);
        } else {
            rd_kafka_poll(rk, 0);
            struct timespec pause = {0, (long)(wait * 1e9)};
            nanosleep(&pause, NULL);
        }
    }
}

static int latency(int argc, char **argv) {
    if (argc != 9)
        die("usage", "latency BOOTSTRAP TOPIC PARTITIONS RATE SECONDS SIZE ACKS");
    struct latency_run run = {argv[2], argv[3], atoi(argv[4]), 0, NULL, 0, 0, 0};
    long rate = atol(argv[5]);
    double seconds = atof(argv[6]);
    int size = atoi(argv[7]);
    if (size < 8)
        size = 8;
    run.expected = (long)(rate * seconds);
    run.samples = calloc(run.expected, sizeof(double));
    pthread_t thread;
    pthread_create(&thread, NULL, latency_consumer, &run);
    rd_kafka_t *rk = producer(run.bootstrap, argv[8], "none");
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, run.topic, NULL);
    char *payload = calloc(1, size);
    /* Warm up: until the consumer has received something, send unmeasured records (send time
       -1) to every partition, so that its assignment, offset lookups and first fetches are
       done before the clock starts. */
    double warm_deadline = now_s() + 60;
    int64_t unmeasured = -1;
    memcpy(payload, &unmeasured, 8);
    while (!run.ready && now_s() < warm_deadline) {
        for (int p = 0; p < run.partitions; p++)
            rd_kafka_produce(rkt, p, RD_KAFKA_MSG_F_COPY, payload, size, NULL, 0, NULL);
        rd_kafka_poll(rk, 200);
    }
    /* ... and a little longer, so that every partition has been fetched at least once. */
    double settle = now_s() + 2;
    while (now_s() < settle) {
        for (int p = 0; p < run.partitions; p++)
            rd_kafka_produce(rkt, p, RD_KAFKA_MSG_F_COPY, payload, size, NULL, 0, NULL);
        rd_kafka_poll(rk, 100);
    }
    double start = now_s();
    for (long i = 0; i < run.expected; i++) {
        double due = start + (double)i / rate;
        wait_until(rk, due);
        int64_t sent = now_ns();
        memcpy(payload, &sent, 8);
        if (rd_kafka_produce(rkt, (int32_t)(i % run.partitions), RD_KAFKA_MSG_F_COPY, payload,
                             size, NULL, 0, NULL) == -1)
            die("produce", rd_kafka_err2str(rd_kafka_last_error()));
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_flush(rk, 30000);
    double deadline = now_s() + 30;
    while (run.received < run.expected && now_s() < deadline)
        rd_kafka_poll(rk, 50);
    run.stop = 1;
    pthread_join(thread, NULL);
    qsort(run.samples, run.received, sizeof(double), compare);
    printf("{\"op\":\"latency\",\"rate\":%ld,\"records\":%ld,\"received\":%ld,\"size\":%d,"
           "\"acks\":\"%s\",\"p50_ms\":%.2f,\"p99_ms\":%.2f,\"p999_ms\":%.2f,\"max_ms\":%.2f}\n",
           rate, run.expected, run.received, size, argv[8],
           percentile(run.samples, run.received, 0.50),
           percentile(run.samples, run.received, 0.99),
           percentile(run.samples, run.received, 0.999),
           run.received ? run.samples[run.received - 1] : -1);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return run.received < run.expected ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "produce"))
        return produce(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "consume"))
        return consume(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "latency"))
        return latency(argc, argv);
    die("usage", "loadgen produce|consume|latency ... (see the source)");
    return 1;
}
