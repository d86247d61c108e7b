// Records what a real Zero 1.9.0 change-streamer sends a v6 `/changes` subscriber, frame by frame, into
// examples/bench/zero-1.9-stream.jsonl (the relay benchmark replays it: examples/bench/zero_stream.rs). Rerun it
// from the repository's root with:
//
//   scripts/with-postgres.sh bash -c 'NODE=$(scripts/install-interop.sh 1.9) &&
//     PATH="$(dirname "$NODE"):$PATH" INTEROP_ZERO=1.9 ZERO_ENABLE_TELEMETRY=false DO_NOT_TRACK=1 \
//     LITESTREAM_BIN=$(scripts/install-litestream.sh) "$NODE" tests/interop/lib/record-stream.mjs'
//
// (the setup of `scripts/interop.sh 1.9`: Zero 1.9's packages and Node 22, the real litestream, telemetry off; a
// path given as the script's argument is written instead of the fixture). It takes under a minute.
//
// It starts one deployment of the interop harness (lib/topology.mjs) with a replication-manager and nothing else (no
// sidecar, no view-syncer; backups to a directory) and connects a raw subscriber (lib/clients.mjs `RawSubscriber`)
// straight to the replication-manager's change-streamer at ws://127.0.0.1:{port}/replication/v6/changes, from the
// replica version, before anything is written. It acks every message as soon as it arrives, as a view-syncer's client
// does (Zero's streamIn acks each message it takes), so Zero keeps streaming. Then, upstream: 500 transactions each
// inserting one row of `item (id, label, big)`, 500 each updating one of those rows, and one inserting BULK_ROWS rows.
// The file gets every text frame, byte for byte, from the first (the status) through the commit of the bulk
// transaction: one line each (Zero's JSON has no raw newline). Everything listens on and connects to loopback only,
// with Zero's telemetry off (checked at the end, as the interop suites check it). Every process started is stopped
// at the end, also on failure or interruption (Procs kills whatever still carries this run's marker when node
// exits), and the deployment's databases and temp directory are removed.
import assert from 'node:assert/strict';
import {rmSync, writeFileSync} from 'node:fs';
import {dirname, resolve} from 'node:path';
import {fileURLToPath} from 'node:url';
import {setTimeout as sleep} from 'node:timers/promises';
import {RawSubscriber, changesQuery} from './clients.mjs';
import {assertLoopbackOnly, assertTelemetryOff} from './suite.mjs';
import {Topology, eventually} from './topology.mjs';

// The Topology insists on a sidecar binary; none is started here, so any existing file does when none is named.
process.env.SIDECAR_BIN ||= process.execPath;

const here = dirname(fileURLToPath(import.meta.url));
const OUT = resolve(process.argv[2] ?? resolve(here, '../../../examples/bench/zero-1.9-stream.jsonl'));
const SINGLE_INSERTS = 500;
const SINGLE_UPDATES = 500;
const BULK_ROWS = 3_000;
/** The first id of each phase's rows (the harness's `item` starts with rows 1 to 3). */
const SINGLE_FIRST = 1_001;
const BULK_FIRST = 10_001;

const t = new Topology('record', {destination: 'file'});
// Interrupted: every process of this run killed, the deployment's directory removed (its databases go with the
// cluster of scripts/with-postgres.sh).
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    t.procs.killAllSync({everyDeployment: true});
    rmSync(t.dir, {recursive: true, force: true});
    process.exit(signal === 'SIGINT' ? 130 : 143);
  });
}
// The replication-manager advertises its own change-streamer (there is no sidecar to advertise).
t.discovery = 'owner';
let sub;
try {
  await t.prepare();
  t.startReplicationManager();
  const rm = t.procs.get('replication-manager');
  await eventually('the replication-manager to advertise its change-streamer', async () => {
    if (!rm.running) {
      const last = rm.lines().slice(-5).join(' | ');
      throw Object.assign(new Error(`the replication-manager exited: ${last}`), {fatal: true});
    }
    return (await t.ownerAddress()) === t.rmAddress;
  }, {timeout: 120_000});
  const {replicaVersion} = await t.replicationState();
  // The change log may hold the initial sync's own entries at the replica version, which a subscriber from there
  // does not get; nothing above it is there yet.
  const before = await t.changeLogWatermarks();
  assert.deepEqual(before.filter(w => w > replicaVersion), [], `the change log before the workload: ${before}`);

  sub = new RawSubscriber(`ws://${t.rmAddress}/replication/v6/changes?${changesQuery({
    taskID: 'record-stream', id: 'record-stream', watermark: replicaVersion, replicaVersion})}`, 'recorder');
  // Ack each message as it arrives, in order (after RawSubscriber's own listener has kept its text).
  sub.ws.on('message', (data, isBinary) => {
    if (!isBinary) sub.ack(JSON.parse(data.toString('utf8')).id);
  });
  await sub.opened;
  await sub.waitFrames('the status', ms => ms.length > 0, 60_000);
  assert.equal(sub.messages()[0].msg[0], 'status', `the first message: ${sub.frames[0]}`);

  const id = i => SINGLE_FIRST + i;
  for (let i = 0; i < SINGLE_INSERTS; i++) {
    await t.upstream.begin(tx => tx`INSERT INTO item (id, label, big) VALUES (${id(i)}, ${`r${id(i)}`}, ${id(i)})`);
  }
  for (let i = 0; i < SINGLE_UPDATES; i++) {
    await t.upstream.begin(tx => tx`UPDATE item SET label = ${`u${id(i)}`}, big = ${id(i) * 2} WHERE id = ${id(i)}`);
  }
  await t.upstream.begin(tx => tx`
    INSERT INTO item (id, label, big)
    SELECT g, 'b' || g, g FROM generate_series(${BULK_FIRST}::int, ${BULK_FIRST + BULK_ROWS - 1}::int) AS g`);

  const commits = SINGLE_INSERTS + SINGLE_UPDATES + 1;
  const upTo = await sub.waitFrames(`${commits} commits`, ms => {
    let seen = 0;
    for (let i = 0; i < ms.length; i++) if (ms[i].msg[0] === 'commit' && ++seen === commits) return i + 1;
    return null;
  }, 300_000);
  // Anything more within a moment would be a transaction this script did not write.
  await sleep(2_000);
  const frames = sub.frames.slice(0, upTo);
  const extra = sub.messages().slice(upTo).filter(m => m.msg[0] !== 'status');
  assert.deepEqual(extra.map(m => m.msg[0]), [], 'nothing but statuses after the last commit');
  assert.ok(frames.every(f => typeof f === 'string' && !f.includes('\n')), 'text frames without raw newlines');
  // Every listener and connection of Zero's processes was on loopback, and telemetry was off in each.
  await assertLoopbackOnly({"the replication-manager's change-streamer": t.ports.rmChangeStreamer});
  assertTelemetryOff();

  // What the workload should have produced: begin, data, commit for each transaction (statuses may come between).
  const kinds = frames.map(f => {
    const {msg} = JSON.parse(f);
    return msg[0] === 'data' ? `data/${msg[1].tag}` : msg[0];
  });
  const count = k => kinds.filter(x => x === k).length;
  assert.equal(count('begin'), commits);
  assert.equal(count('data/insert'), SINGLE_INSERTS + BULK_ROWS);
  assert.equal(count('data/update'), SINGLE_UPDATES);
  writeFileSync(OUT, frames.map(f => `${f}\n`).join(''));
  const tally = {};
  for (const k of kinds) tally[k] = (tally[k] ?? 0) + 1;
  console.log(`wrote ${frames.length} messages (${frames.reduce((n, f) => n + Buffer.byteLength(f) + 1, 0)} bytes) ` +
    `to ${OUT}: ${JSON.stringify(tally)}`);
} catch (e) {
  console.error(e);
  t.procs.dump(s => process.stderr.write(s), 200);
  process.exitCode = 1;
} finally {
  await sub?.close();
  await t.close();
}
