// kafkajs's admin client and a transactional producer against an nvmq broker, driven by
// tools/tests/suite/admin_clients.rs. Prints what it checked; exits non-zero with the reason on any
// failure. Usage: node admin.mjs <kafkajs-dir> <bootstrap>
import { createRequire } from 'node:module';

const [dir, boot] = process.argv.slice(2);
const { Kafka, logLevel } = createRequire(`${dir}/`)('kafkajs');
const kafka = new Kafka({ clientId: 'kafkajs-admin', brokers: [boot], logLevel: logLevel.NOTHING });

function fail(msg) {
  console.log(`FAIL: ${msg}`);
  process.exit(1);
}

const admin = kafka.admin();
await admin.connect();
await admin.createTopics({ topics: [{ topic: 'js', numPartitions: 2 }] });
const producer = kafka.producer();
await producer.connect();
await producer.send({ topic: 'js', messages: [0, 1, 2].map((i) => ({ value: `v${i}`, partition: 0 })) });
await producer.disconnect();

const offsets = await admin.fetchTopicOffsets('js');
const p0 = offsets.find((o) => o.partition === 0);
if (p0.high !== '3' || p0.low !== '0') fail(`fetchTopicOffsets: ${JSON.stringify(offsets)}`);
console.log(`ok: fetchTopicOffsets ${JSON.stringify(offsets)}`);

// A live group (a joined consumer) and one holding offsets only.
const consumer = kafka.consumer({ groupId: 'js-live', sessionTimeout: 30000 });
await consumer.connect();
const joined = new Promise((resolve) => consumer.on(consumer.events.GROUP_JOIN, resolve));
await consumer.subscribe({ topics: ['js'], fromBeginning: true });
await consumer.run({ eachMessage: async () => {} });
await joined;
await admin.setOffsets({ groupId: 'js-idle', topic: 'js', partitions: [{ partition: 0, offset: '2' }] });

const listed = (await admin.listGroups()).groups.map((g) => g.groupId).sort();
if (!listed.includes('js-live') || !listed.includes('js-idle')) fail(`listGroups: ${listed}`);
console.log(`ok: listGroups ${listed}`);

const described = (await admin.describeGroups(['js-live', 'js-idle'])).groups;
const live = described.find((g) => g.groupId === 'js-live');
const idle = described.find((g) => g.groupId === 'js-idle');
if (live.state !== 'Stable' || live.members.length !== 1 || live.protocolType !== 'consumer'
    || idle.state !== 'Empty' || idle.members.length !== 0) {
  fail(`describeGroups: ${JSON.stringify(described)}`);
}
console.log(`ok: describeGroups js-live ${live.state} (${live.protocol}), js-idle ${idle.state}`);

try {
  await admin.deleteGroups(['js-live']);
  fail('a group with a member was deleted');
} catch (e) {
  const code = e.groups?.[0]?.error?.type;
  if (code !== 'NON_EMPTY_GROUP') fail(`deleting a live group: ${e} ${code}`);
}
await consumer.disconnect();
const deleted = await admin.deleteGroups(['js-live', 'js-idle']);
if (deleted.some((d) => d.errorCode !== 0)) fail(`deleteGroups: ${JSON.stringify(deleted)}`);
const after = (await admin.listGroups()).groups.map((g) => g.groupId);
if (after.includes('js-live') || after.includes('js-idle')) fail(`still listed: ${after}`);
console.log('ok: deleteGroups (NON_EMPTY_GROUP while a member was in)');

const cluster = await admin.describeCluster();
if (cluster.clusterId !== 'nvmq' || cluster.controller !== 0 || cluster.brokers.length !== 1) {
  fail(`describeCluster: ${JSON.stringify(cluster)}`);
}
console.log(`ok: describeCluster ${JSON.stringify(cluster)}`);
await admin.disconnect();

// A transactional producer is refused on its first request, not after its retries: kafkajs
// asks for the transaction coordinator once and gives up (its broker pool reports the refusal
// as "Failed to find group coordinator", dropping the broker's error code).
const tx = kafka.producer({ transactionalId: 'js-tx', idempotent: true, maxInFlightRequests: 1 });
let asked = 0;
tx.on(tx.events.REQUEST, (e) => { if (e.payload.apiName === 'GroupCoordinator') asked += 1; });
try {
  await tx.connect();
  await tx.transaction();
  fail('a transaction started');
} catch (e) {
  if (e.name !== 'KafkaJSGroupCoordinatorNotFound' || asked !== 1) {
    fail(`transactional producer: ${e.name} ${e.type} ${e.message} after ${asked} requests`);
  }
  console.log(`ok: transactional producer refused at its first request: ${e.name}`);
}
await tx.disconnect();
