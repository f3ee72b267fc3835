// KafkaJS driven by the Python tests: one JSON job on stdin, one JSON answer on stdout.
//
// Job: {brokers: ["host:port"], ssl: null | {ca, cert?, key?} (PEM file paths),
//       sasl: null | {mechanism: "plain"|"scram-sha-256"|"scram-sha-512", username, password},
//       topic, partitions, replicationFactor, group, count, steps: ["admin","produce","consume"],
//       timeoutMs, idempotent (an idempotent producer: InitProducerId, sequence numbers)}
// Answer: {ok: true, created, produced, consumed: [values], topics} or
//         {ok: false, step, name, type, code, message} (KafkaJS error fields).
"use strict";

const fs = require("fs");
const { Kafka, logLevel } = require("kafkajs");

function readJob() {
  return JSON.parse(fs.readFileSync(0, "utf8"));
}

function kafkaFor(job) {
  let ssl = false;
  if (job.ssl) {
    ssl = { ca: [fs.readFileSync(job.ssl.ca, "utf8")], rejectUnauthorized: true };
    if (job.ssl.cert) ssl.cert = fs.readFileSync(job.ssl.cert, "utf8");
    if (job.ssl.key) ssl.key = fs.readFileSync(job.ssl.key, "utf8");
  }
  return new Kafka({
    clientId: "odradek-kafkajs-test",
    brokers: job.brokers,
    ssl,
    sasl: job.sasl || undefined,
    logLevel: logLevel.NOTHING,
    connectionTimeout: 5000,
    authenticationTimeout: 5000,
    retry: { retries: job.retries === undefined ? 5 : job.retries },
  });
}

async function run(job) {
  const kafka = kafkaFor(job);
  const answer = { ok: true };
  let step = "admin";
  try {
    if (job.steps.includes("admin")) {
      const admin = kafka.admin();
      await admin.connect();
      answer.created = await admin.createTopics({
        waitForLeaders: true,
        topics: [
          {
            topic: job.topic,
            numPartitions: job.partitions || 1,
            replicationFactor: job.replicationFactor || 1,
          },
        ],
      });
      answer.topics = await admin.listTopics();
      await admin.disconnect();
    }
    if (job.steps.includes("produce")) {
      step = "produce";
      const producer = kafka.producer(
        job.idempotent
          ? { allowAutoTopicCreation: false, idempotent: true, maxInFlightRequests: 1 }
          : { allowAutoTopicCreation: false },
      );
      await producer.connect();
      const messages = [];
      const values = job.values || Array.from({ length: job.count }, (_, i) => `v${i}`);
      for (const [i, value] of values.entries()) messages.push({ key: `k${i}`, value });
      await producer.send({ topic: job.topic, acks: -1, messages });
      await producer.disconnect();
      answer.produced = values.length;
    }
    if (job.steps.includes("consume")) {
      step = "consume";
      const consumer = kafka.consumer({ groupId: job.group, sessionTimeout: 10000 });
      await consumer.connect();
      await consumer.subscribe({ topic: job.topic, fromBeginning: true });
      const consumed = [];
      let done;
      const finished = new Promise((resolve) => (done = resolve));
      await consumer.run({
        eachMessage: async ({ message }) => {
          consumed.push(message.value.toString());
          if (consumed.length >= job.count) done();
        },
      });
      const timer = setTimeout(done, job.timeoutMs || 30000);
      await finished;
      clearTimeout(timer);
      await consumer.disconnect();
      answer.consumed = consumed;
    }
  } catch (e) {
    return {
      ok: false,
      step,
      name: e.name,
      type: e.type || (e.originalError && e.originalError.type) || null,
      code: e.code || (e.originalError && e.originalError.code) || null,
      message: String(e.message),
    };
  }
  return answer;
}

run(readJob()).then(
  (answer) => {
    process.stdout.write(JSON.stringify(answer) + "\n");
    process.exit(0);
  },
  (e) => {
    process.stdout.write(JSON.stringify({ ok: false, step: "setup", message: String(e) }) + "\n");
    process.exit(0);
  },
);
