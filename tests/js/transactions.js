// KafkaJS's transactional producer driven by tests/integration/test_transactions.py: one JSON
// job on stdin ({brokers, topic, transactionalId, timeoutMs}), one JSON answer on stdout.
// It commits a transaction of 5 records ("commit-0".."commit-4") and aborts one of 3
// ("abort-0".."abort-2"), all on partition 0.
"use strict";

const fs = require("fs");
const { Kafka, logLevel } = require("kafkajs");

async function run(job) {
  const kafka = new Kafka({
    clientId: "odradek-kafkajs-txn-test",
    brokers: job.brokers,
    logLevel: logLevel.NOTHING,
    connectionTimeout: 5000,
    retry: { retries: 10 },
  });
  const producer = kafka.producer({
    transactionalId: job.transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
  });
  await producer.connect();
  try {
    const committed = await producer.transaction();
    await committed.send({
      topic: job.topic,
      messages: [0, 1, 2, 3, 4].map((i) => ({ value: `commit-${i}`, partition: 0 })),
    });
    await committed.commit();
    const aborted = await producer.transaction();
    await aborted.send({
      topic: job.topic,
      messages: [0, 1, 2].map((i) => ({ value: `abort-${i}`, partition: 0 })),
    });
    await aborted.abort();
  } finally {
    await producer.disconnect();
  }
  return { ok: true };
}

const job = JSON.parse(fs.readFileSync(0, "utf8"));
const timer = setTimeout(() => {
  process.stdout.write(JSON.stringify({ ok: false, message: "timed out" }));
  process.exit(1);
}, job.timeoutMs || 60000);
run(job)
  .then((answer) => {
    clearTimeout(timer);
    process.stdout.write(JSON.stringify(answer));
  })
  .catch((e) => {
    clearTimeout(timer);
    process.stdout.write(
      JSON.stringify({ ok: false, name: e.name, type: e.type, code: e.code, message: e.message }),
    );
  });
