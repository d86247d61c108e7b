// End-to-end interop tests: the sidecar in the recommended deployment (docs/deploy-zero-0.20.md, "Recommended deployment with Zero 0.20") with real Zero 0.20
// processes. Run by `make test` (scripts/interop.sh 0.20): PostgreSQL from scripts/with-postgres.sh, the sidecar binary
// from SIDECAR_BIN, the real litestream from LITESTREAM_BIN (through lib/litestream-gauge.mjs). The scenarios share
// one deployment and run in order; each one's assertions stand alone, but a later scenario relies on the state an
// earlier one left (rows, subscribers, processes). The last one starts a second, fresh deployment beside the first,
// backing up to S3 (its replication-manager's initial sync drops the first one's replication slot, which ends the
// first replication-manager: nothing after it uses the first deployment). The main deployment's sidecar runs with its
// default `proxy_mode` ("clamp"); the second one's hides the gauge from Zero. A run may hold only some of them (a
// shard of `make test`, INTEROP_ONLY: lib/selection.mjs): the main deployment starts only for scenarios 0 to 6, the
// groups lib/versions.mjs keeps together.
import {after, before, test} from 'node:test';
import assert from 'node:assert/strict';
import {setTimeout as sleep} from 'node:timers/promises';
import {listeners, connections, markedPids, tcpCounters, treePids} from '../lib/procs.mjs';
import {
  RESERVATION_ENDS, StrayLines, field, reservationTimeline, sidecarEvents as sidecarEventsOf, sidecarEventsWith,
} from '../lib/util.mjs';
import {PROFILE, Topology, ZERO_VERSION, assertGaugeNeverAhead, eventually, progressSamples} from '../lib/topology.mjs';
import {selection} from '../lib/selection.mjs';
import {Pump, RawSubscriber, changesQuery, zeroClient} from '../lib/clients.mjs';
import {
  assertProxyNeverAboveLog, assertProxyShowsBackupSoonAfter, assertZeroCleanupHarmless, describeWatch, watchProxy,
} from '../lib/proxy-watch.mjs';

/** The one view-syncer of each deployment here, and the task IDs of Zero's processes (the same in every one). */
const VS = 'view-syncer';
const RM_TASK_ID = PROFILE.rmTaskID('main');
const VS_TASK_ID = PROFILE.vsTaskID('main', VS);
/** The settings of a deployment's view-syncer (its replica file, its ports), fixed by `prepare` below. */
const vsOf = topo => topo.viewSyncers.get(VS);

const t = new Topology();
const extra = []; // further deployments (the cold start), stopped and closed with the main one
const everyTopology = [t]; // every deployment started, closed or not
const clientLog = [];
let client;
let failed = false;
let replicaVersion;
const pumps = [];
/** The main deployment's proxy page as Zero reads it, with the change log beside it, from the sidecar's start. */
let mainWatch;

/** Every JSON log event of the sidecar, over all its runs, and those with a message and fields. */
const sidecarEvents = () => sidecarEventsOf(t.procs);
const events = (message, fields = {}) => sidecarEventsWith(t.procs, message, fields);

/** Reservations the sidecar has opened and not closed, by task ID. */
function openReservations() {
  const open = new Map();
  for (const e of sidecarEvents()) {
    const task = field(e, 'task_id');
    if (e.message === 'reservation opened') open.set(task, (open.get(task) ?? 0) + 1);
    if (e.message === 'reservation closed') open.set(task, (open.get(task) ?? 0) - 1);
  }
  return new Map([...open].filter(([, n]) => n > 0));
}

/** Lines of a sidecar's output that are not log records (a panic, a stray print): none may appear. */
const strays = new StrayLines(() => everyTopology.map(topo => topo.procs));

/** The sidecar's purge records: finished, and stopped early by a change while it ran. */
const PURGES = ['change log purged', 'change log purge stopped early; the next check continues'];

/** A log record for a failure message: without `spans` and `target` (`span` still names the innermost one). */
const brief = record => JSON.stringify(record, (k, v) => (k === 'spans' || k === 'target' ? undefined : v));

/** A purge record's `reservations` field (`task=floor,...`) as a map. */
function listedReservations(record) {
  const list = field(record, 'reservations') ?? '';
  return new Map(list.split(',').filter(Boolean).map(r => [r.slice(0, r.lastIndexOf('=')), r.slice(r.lastIndexOf('=') + 1)]));
}

/**
 * What the sidecar logged about the (first) reservation of `task`: its "reservation opened" and "reservation pinned"
 * records, the record that ended it (null while open), and every purge it decided while the reservation was open,
 * with that decision: a purge whose "cleanup decision" record comes after "reservation opened" and whose own record
 * comes before the reservation's end. The floor in effect for each is the one opened with until the pinned one.
 */
function purgesDuring(task) {
  const all = sidecarEvents();
  const ofTask = (i, messages) => messages.includes(all[i].message) && field(all[i], 'task_id') === task;
  const opened = all.findIndex((_, i) => ofTask(i, ['reservation opened']));
  if (opened < 0) return {opened: null, pinned: null, ended: null, purges: []};
  const pinned = all.findIndex((_, i) => i > opened && ofTask(i, ['reservation pinned']));
  const ended = all.findIndex((_, i) => i > opened && ofTask(i, RESERVATION_ENDS));
  const end = ended < 0 ? all.length : ended;
  const purges = [];
  let decision = -1;
  for (let i = opened + 1; i < end; i++) {
    if (all[i].message === 'cleanup decision') decision = i;
    if (!PURGES.includes(all[i].message) || decision < 0) continue;
    const floor = pinned >= 0 && decision > pinned ? field(all[pinned], 'floor') : field(all[opened], 'floor');
    purges.push({record: all[i], decision: all[decision], floor});
  }
  return {opened: all[opened], pinned: pinned < 0 ? null : all[pinned], ended: ended < 0 ? null : all[ended], purges};
}

/**
 * No purge the sidecar decided while `task`'s reservation was open went above the floor the sidecar logged for it,
 * and each one lists the reservation, at that floor, in its `reservations` field.
 */
function assertPurgesKeptTheFloor(task) {
  const {opened, pinned, ended, purges} = purgesDuring(task);
  const floorRecord = pinned ?? opened;
  const where = `reservation ${task} (sidecar records: opened ${brief(opened)}; pinned ${brief(pinned)}; ` +
    `ended ${brief(ended)})`;
  assert.ok(opened && pinned, `expected the sidecar to log "reservation opened" and "reservation pinned" for ${where}`);
  assert.ok(field(floorRecord, 'floor'), `expected a floor in the sidecar's "reservation pinned" record of ${where}`);
  for (const {record, decision, floor} of purges) {
    const seen = `purge ${brief(record)}, decided in ${brief(decision)}`;
    assert.ok(field(record, 'before') <= floor,
      `expected every purge decided while ${task} was open to delete only below its floor, before <= ${floor}; ` +
      `saw before=${field(record, 'before')} in the ${seen}; ${where}`);
    const listed = listedReservations(record);
    assert.equal(listed.get(task), floor,
      `expected every purge decided while ${task} was open to list it as ${task}=${floor} in its reservations; ` +
      `saw reservations="${field(record, 'reservations') ?? ''}" in the ${seen}; ${where}`);
  }
  return {floor: field(floorRecord, 'floor'), purges};
}

/**
 * Reads litestream's page (the exporter's gauge) every `interval` ms until `stop()`: its backed-up watermarks, [{at, watermark, value}]
 * (`at`: ms since the start), and the reads that failed, [{at, error}].
 */
function sampleGauge(interval = 250) {
  const started = Date.now();
  const samples = [];
  const failures = [];
  let stopping = false;
  const done = (async () => {
    while (!stopping) {
      try {
        const page = await t.litestreamPage();
        for (const p of progressSamples(page)) samples.push({at: Date.now() - started, watermark: p.watermark, value: p.value});
      } catch (e) {
        failures.push({at: Date.now() - started, error: e.message});
      }
      await sleep(interval);
    }
  })();
  return {samples, failures, stop: async () => {
    stopping = true;
    await done;
  }};
}

/** Consecutive samples with the same watermark, as one run each: [{watermark, from, to, value}]. */
function watermarkRuns(samples) {
  const runs = [];
  for (const s of samples) {
    if (runs.at(-1)?.watermark === s.watermark) runs.at(-1).to = s.at;
    else runs.push({watermark: s.watermark, from: s.at, to: s.at, value: s.value});
  }
  return runs;
}

/** The sampled watermarks, each with when it was seen (seconds from the start) and its gauge value. */
function history({samples, failures}) {
  return watermarkRuns(samples)
    .map(r => `${r.watermark} (+${(r.from / 1000).toFixed(1)}..${(r.to / 1000).toFixed(1)} s, time ${r.value})`)
    .join(', ') + (failures.length ? `; failed reads: ${JSON.stringify(failures.slice(0, 5))}` : '');
}

/** The gauge's backed-up watermark never went back while sampled: each change of it was an increase. */
function assertOnlyIncreasing(sampled) {
  const {samples} = sampled;
  assert.ok(samples.length >= 20,
    `expected litestream's page sampled over the scenario; saw ${samples.length} samples: ${history(sampled)}`);
  const runs = watermarkRuns(samples);
  for (let i = 1; i < runs.length; i++) {
    assert.ok(runs[i].watermark > runs[i - 1].watermark,
      `expected the gauge's backed-up watermark only to increase; saw ${runs[i - 1].watermark} then ` +
      `${runs[i].watermark} at +${(runs[i].from / 1000).toFixed(1)} s. Every watermark sampled: ${history(sampled)}`);
  }
}

/**
 * Lines of Zero's replication-manager log showing that Zero itself scheduled or ran a change-log cleanup. Only a
 * proxy that hides the gauge (scenario 7) keeps them all away; behind the default clamp Zero reads a watermark and
 * purges from it, which `zeroCleanupHarmless` checks.
 */
const ZERO_CLEANUP = /replicated watermark=|Purged \d+ changes|behind backup|No subscribers to confirm cleanup|pausing change-log cleanup|snapshot initialized by|increased cleanup delay/;

/**
 * Zero's own cleanup behind the clamped proxy did no harm (lib/proxy-watch.mjs): every purge of its own deleted
 * 0 rows, every watermark it read is at or below the change log's oldest row, and it never distrusted the backup.
 */
function zeroCleanupHarmless(opts = {}) {
  return assertZeroCleanupHarmless(t, t.procs.get('replication-manager').lines(), opts);
}

/**
 * The proxy page and the change log's oldest watermark, read until the log read before the page and the one
 * after it agree (no purge in between): `{page, samples, min}`.
 */
function clampedPage(topo = t) {
  return eventually("the proxy page between two equal reads of the change log's oldest watermark", async () => {
    const before = await topo.changeLogMin();
    const page = await topo.proxyPage();
    const after = await topo.changeLogMin();
    assert.equal(page.status, 200, page.body);
    return before === after ? {page: page.body, samples: progressSamples(page.body), min: after} : null;
  });
}

/** Every listener of every process of the deployment is on loopback. */
function assertLoopbackOnly(expectedPorts) {
  const ours = new Set([...markedPids(), t.procs.get('sidecar').pid]);
  const mine = listeners().filter(l => l.pids.some(p => ours.has(p)));
  for (const l of mine) {
    assert.match(l.host, /^(127\.\d+\.\d+\.\d+|\[::1\])$/, `listener not on loopback: ${l.line}`);
  }
  const ports = new Set(mine.map(l => l.port));
  for (const [name, port] of Object.entries(expectedPorts)) {
    assert.ok(ports.has(port), `${name} (port ${port}) is not listening: ${mine.map(l => l.line).join('\n')}`);
  }
}

async function changeLogWatermarks() {
  return (await t.changeLog()).map(r => r.watermark);
}

/** The scenarios this run registers (lib/selection.mjs: its shard, INTEROP_ONLY). */
const selected = selection(ZERO_VERSION);

function scenario(name, fn, timeout = 180_000) {
  if (!selected.take(name)) return;
  test(name, {timeout}, async ctx => {
    strays.mark();
    try {
      await fn(ctx);
      strays.assertNoneSince('during this scenario');
    } catch (e) {
      failed = true;
      throw e;
    }
  });
}

// The main deployment, for the scenarios that use it (every other one starts its own).
before(async () => {
  // Node runs this as it is declared, before the scenarios below are: they are, once it yields to the event loop.
  await sleep(0);
  if (!selected.main) return;
  try {
    await t.prepare();
    await t.viewSyncer(VS);
    // The sidecar first: Zero's view-syncers exit when their reservation is refused, and the replication-manager's
    // backup replicator discovers the sidecar as its change-streamer.
    await t.startSidecar();
    mainWatch = watchProxy(t);
    t.startReplicationManager();
    await eventually('Zero to advertise the sidecar as ownerAddress', async () => (await t.ownerAddress()) === t.sidecarAddress,
      {timeout: 90_000});
    await eventually('the sidecar to verify its registration', () => events('registered as the change-streamer').length > 0,
      {timeout: 20_000});
    // The backup replicator subscribes through the sidecar; only once it is ready does Zero spawn litestream.
    await eventually('litestream to back up the replica', () => t.backedUp(), {timeout: 60_000});
    replicaVersion = (await t.replicationState()).replicaVersion;
    client = zeroClient(t, clientLog);
  } catch (e) {
    failed = true;
    throw e;
  }
});

after(async () => {
  for (const p of pumps) p.cancel();
  await mainWatch?.stop();
  // Everything stopped first, so that the check below sees all the sidecars wrote, their shutdown included.
  for (const topo of [...extra, t]) await topo.procs.stopAll();
  let stray = null;
  try {
    strays.assertNone('over the whole run');
  } catch (e) {
    stray = e;
  }
  if (failed || stray) {
    const what = failed ? 'a scenario failed' : 'a sidecar wrote lines that are not log records';
    for (const topo of [t, ...extra]) {
      process.stderr.write(`\n# interop: ${what}; logs of every process of "${topo.name}" follow (also in ${topo.logDir})\n`);
      topo.procs.dump();
    }
    process.stderr.write(`\n===== log of Zero's client in the tests =====\n${clientLog.join('\n')}\n`);
  }
  for (const topo of [...extra, t]) await topo.close({keep: failed || stray !== null});
  const left = markedPids();
  if (stray) {
    if (left.length > 0) stray.message += `\nand processes left running: ${left}`;
    throw stray;
  }
  assert.deepEqual(left, [], `processes left running: ${left}`);
});

scenario('0. every process listens on loopback only, and Zero reaches its change-streamer only through the sidecar', async () => {
  assertLoopbackOnly({
    sidecar: t.ports.sidecar,
    'metrics proxy': t.ports.proxy,
    'litestream (its gauge exporter)': t.ports.litestream,
    'change-streamer': t.ports.rmChangeStreamer,
    'zero sync port': t.ports.rmSync,
  });
  // The backup replicator subscribed through the sidecar, not to the change-streamer directly.
  const backup = events('subscribed', {mode: 'backup', task_id: RM_TASK_ID});
  assert.ok(backup.length >= 1, 'the backup replicator subscribed through the sidecar');
  const sidecarPid = t.procs.get('sidecar').pid;
  const toChangeStreamer = connections().filter(c => c.peerPort === t.ports.rmChangeStreamer);
  assert.ok(toChangeStreamer.length >= 1, 'someone is connected to the change-streamer');
  for (const c of toChangeStreamer) assert.deepEqual(c.pids, [sidecarPid], `direct connection to the change-streamer: ${c.line}`);
});

const S1_TASK = 'interop-task-1';
let reservation1;

scenario("1. Zero's client discovers the sidecar and reserves a snapshot", async () => {
  reservation1 = new Pump(await client.reserveSnapshot(S1_TASK), 'reservation 1');
  pumps.push(reservation1);
  const [status] = await reservation1.waitFor('the status', ms => ms.length > 0 && ms);
  assert.equal(status[0], 'status');
  assert.equal(status[1].tag, 'status');
  assert.equal(status[1].backupURL, t.backupURL, 'the configured backup URL');
  // Zero's client connected to the address it discovered: the sidecar.
  assert.ok(clientLog.some(l => l.includes(`connecting to change-streamer@http://${t.sidecarAddress}/replication/v3/snapshot`)),
    'discovered the sidecar');
  await eventually('the sidecar to log the reservation', () => openReservations().has(S1_TASK));
  assert.deepEqual([...openReservations()], [[S1_TASK, 1]], 'exactly one open reservation');
  // Still open a moment later: nothing ends a reservation but its subscription, its socket or a retry.
  await sleep(1500);
  assert.equal(reservation1.done, false, 'the reservation stays open');
  assert.equal(reservation1.messages.length, 1, 'one status message only');
});

let sub2;
let w2;

scenario('2. a subscription through the sidecar: status, then begin/data/commit as Zero sends them', async () => {
  const {lastWatermark: w0} = await t.replicationState();
  // Zero's client through the sidecar, ending the reservation of scenario 1.
  sub2 = new Pump(await client.subscribe({
    protocolVersion: 3, taskID: S1_TASK, id: 'interop-subscriber-2', mode: 'serving',
    watermark: w0, replicaVersion, initial: true,
  }), 'subscription 2');
  pumps.push(sub2);
  // Raw frames through the sidecar and straight from the change-streamer, same request, for a byte comparison.
  const query = changesQuery({id: 'interop-raw-2', watermark: w0, replicaVersion});
  const relayed = new RawSubscriber(`ws://${t.sidecarAddress}/replication/v3/changes?${query}`, 'relayed raw');
  const direct = new RawSubscriber(`ws://127.0.0.1:${t.ports.rmChangeStreamer}/replication/v3/changes?${query}`, 'direct raw');
  try {
    await Promise.all([relayed.opened, direct.opened]);
    await sub2.waitFor('the status', ms => ms.length > 0);
    assert.deepEqual(sub2.messages[0], ['status', {tag: 'status'}]);
    await relayed.waitFrames('status', ms => ms.length > 0);
    await direct.waitFrames('status', ms => ms.length > 0);

    // The reservation of scenario 1 ends with this subscription (initial=true, same taskID).
    await reservation1.waitEnded();
    assert.equal(reservation1.error, null);
    await eventually('the sidecar to close reservation 1', () => !openReservations().has(S1_TASK));
    assert.equal(events('reservation ended by its subscription', {task_id: S1_TASK}).length, 1);

    w2 = await t.insert([[20, 'twenty', '9007199254740993'], [21, 'twenty-one', -1], [22, 'twenty-two \u{1F600} "quoted"']]);
    await sub2.waitForCommit(w2);
    const msgs = sub2.messages;
    assert.deepEqual(msgs.map(m => m[0]), ['status', 'begin', 'data', 'data', 'data', 'commit']);
    assert.equal(msgs[1][2].commitWatermark, w2);
    assert.deepEqual(msgs.slice(2, 5).map(m => [m[1].tag, m[1].relation.name, m[1].new.id]),
      [['insert', 'item', 20], ['insert', 'item', 21], ['insert', 'item', 22]]);
    assert.equal(msgs[2][1].new.big, 9007199254740993n, 'int8 beyond 2^53 intact');
    assert.equal(msgs[4][1].new.label, 'twenty-two \u{1F600} "quoted"');
    assert.equal(msgs[5][2].watermark, w2);

    const viaSidecar = await relayed.untilCommit(w2);
    const straight = await direct.untilCommit(w2);
    assert.equal(viaSidecar.length, 6);
    assert.deepEqual(viaSidecar, straight, 'frames through the sidecar are byte-identical to the direct ones');
    assert.ok(viaSidecar[2].includes('9007199254740993'), 'number text kept as sent');
    relayed.ackAll();
    direct.ackAll();

    // The sidecar tracks the subscriber it relays.
    assert.equal(events('subscribed', {id: 'interop-subscriber-2', task_id: S1_TASK, mode: 'serving', watermark: w0}).length, 1);
  } finally {
    await relayed.close();
    await direct.close();
  }
});

scenario("3. cleanup on the real change log: reservations, backups, the cleanup delay and subscriber acks; Zero's own purges delete nothing", async () => {
  // The gauge's backups, read over the whole scenario: they only move forward.
  const gaugeWatermarks = sampleGauge();
  try {
    await scenario3();
  } catch (e) {
    await gaugeWatermarks.stop();
    process.stderr.write(`\n# scenario 3 failed; the gauge's backed-up watermarks over it: ${history(gaugeWatermarks)}\n`);
    throw e;
  }
  await gaugeWatermarks.stop();
  assertOnlyIncreasing(gaugeWatermarks);
}, 240_000);

async function scenario3() {
  const S3_TASK = 'interop-restore-3';
  // Zero's BackupMonitor polls the sidecar's proxy: it gets litestream's page with the gauge clamped to the change
  // log's oldest watermark (Zero 0.20 does not seed the log: the replica version while it is empty).
  const page = await t.litestreamPage();
  assert.ok(progressSamples(page).length === 1, 'litestream reports a backed-up watermark');
  const clamped = await clampedPage();
  assert.match(clamped.page, /litestream_db_size/);
  assert.equal(clamped.samples.length, 1, clamped.page);
  assert.deepEqual({db: clamped.samples[0].db, name: clamped.samples[0].name, watermark: clamped.samples[0].watermark},
    {db: t.rmReplica, name: 'file', watermark: clamped.min ?? replicaVersion},
    "the proxy shows the change log's oldest watermark, in litestream's own sample");

  await t.waitBackedUp(w2);
  // A restore starts: reservation R. The newest backup the sidecar knows at that moment is its floor, as it logs.
  const reservation = new Pump(await client.reserveSnapshot(S3_TASK), 'reservation 3');
  pumps.push(reservation);
  await reservation.waitFor('the status', ms => ms.length > 0);
  const gaugeFloor = await t.backedUp();
  assert.ok(gaugeFloor >= w2, `expected scenario 2 (${w2}) backed up by litestream; its gauge reports ${gaugeFloor}`);
  // The record is written before the status, but its line may reach this process after the status does.
  await eventually(`the sidecar to log the floor of ${S3_TASK}`, () => purgesDuring(S3_TASK).pinned);
  const {floor} = assertPurgesKeptTheFloor(S3_TASK);
  assert.ok(floor <= gaugeFloor,
    `expected the sidecar's floor for ${S3_TASK} to be a backup the gauge reported (<= ${gaugeFloor}); saw ${floor}`);

  // Three transactions, each backed up on its own.
  const w = [];
  for (const id of [31, 32, 33]) {
    w.push(await t.insert([[id, `row ${id}`]]));
    await eventually(`litestream to back up exactly ${w.at(-1)}`, async () => (await t.backedUp()) === w.at(-1));
    // Let the sidecar's scrape (every 1s) see this one before the next one replaces it.
    await sleep(1500);
  }
  const [w1, w2b, w3] = w;
  // A subscriber that lags: it is at w1 and acknowledges nothing it receives.
  const laggard = new RawSubscriber(`ws://${t.sidecarAddress}/replication/v3/changes?${changesQuery({
    id: 'interop-laggard', watermark: w1, replicaVersion})}`, 'laggard');
  await laggard.opened;
  await laggard.untilCommit(w3);
  const protectedRows = (await t.changeLog()).filter(r => r.watermark >= floor);
  const backedUpAt = Date.now();

  // The backups age past the 30 s cleanup delay while R is open.
  await sleep(34_000);
  const afterWait = await t.changeLog();
  for (const r of protectedRows) {
    assert.ok(afterWait.some(a => a.watermark === r.watermark && a.rows === r.rows),
      `row ${r.watermark} (at or above the reservation's floor ${floor}) must not be purged while it is open: ` +
      `expected ${r.rows} rows there, the change log has ${JSON.stringify(afterWait)}; purges: ` +
      `${JSON.stringify(events('change log purged'))}`);
  }
  assertPurgesKeptTheFloor(S3_TASK);
  const holds = events('cleanup held').map(e => field(e, 'reason'));
  assert.ok(holds.includes('backup above a reservation floor'), `held for the reservation: ${holds}`);
  // Zero scheduled its own cleanup from the proxy's watermark, which leaves the reservation's rows alone.
  await zeroCleanupHarmless();
  assert.equal(reservation.done, false);

  // The restore is done: the restored task subscribes from the backup it restored (w3), ending R.
  const restored = new Pump(await client.subscribe({
    protocolVersion: 3, taskID: S3_TASK, id: 'interop-restored-3', mode: 'serving',
    watermark: w3, replicaVersion, initial: true,
  }), 'restored subscriber');
  pumps.push(restored);
  await restored.waitFor('the status', ms => ms.length > 0);
  await reservation.waitEnded();
  await eventually(`the sidecar to log the end of ${S3_TASK}`, () => purgesDuring(S3_TASK).ended);
  assertPurgesKeptTheFloor(S3_TASK);

  // Now rows below w1 may go (w1's backup aged, every subscriber is at or past w1), and only those: the laggard
  // still needs what follows w1.
  await eventually('the sidecar to purge below the laggard', async () => (await changeLogWatermarks())[0] === w1,
    {timeout: 60_000, interval: 500});
  const purges = events('change log purged');
  assert.equal(field(purges.at(-1), 'before'), w1);
  assert.deepEqual((await changeLogWatermarks()).filter(x => x >= w1), [w1, w2b, w3], 'rows a subscriber needs are kept');
  // The newer backups (w2, w3) have aged too: what holds them back now is the laggard alone.
  await eventually('the sidecar to hold cleanup for the laggard',
    () => events('cleanup held').at(-1) && field(events('cleanup held').at(-1), 'reason') === 'subscriber behind backup');
  assert.deepEqual(await changeLogWatermarks(), [w1, w2b, w3]);

  // The laggard reconnects from its last watermark with Zero's client and catches up.
  await laggard.close();
  const caughtUp = new Pump(await client.subscribe({
    protocolVersion: 3, taskID: '', id: 'interop-laggard', mode: 'serving', watermark: w1, replicaVersion, initial: false,
  }), 'laggard (reconnected)');
  pumps.push(caughtUp);
  await caughtUp.waitForCommit(w3);
  assert.deepEqual(caughtUp.messages.map(m => m[0]), ['status', 'begin', 'data', 'commit', 'begin', 'data', 'commit']);
  assert.deepEqual(caughtUp.messages.filter(m => m[0] === 'commit').map(m => m[2].watermark), [w2b, w3]);
  assert.equal(caughtUp.error, null);

  // Its acks (and everyone else's) reach the sidecar's policy: the purge moves on to w3.
  await eventually('the sidecar to purge below w3 once every subscriber acked it',
    async () => (await changeLogWatermarks())[0] === w3, {timeout: 60_000, interval: 500});
  assert.equal(field(events('change log purged').at(-1), 'before'), w3);
  assert.ok(Date.now() - backedUpAt >= 30_000);

  // Zero's own cleanup, behind the clamped proxy, purged nothing: its BackupMonitor (every 60 s) can only have read
  // the change log's oldest watermark (now w3, the one row left), and its purge-on-subscribe signal never reached it.
  const atEnd = await clampedPage();
  assert.equal(atEnd.min, w3);
  assert.deepEqual(atEnd.samples.map(x => x.watermark), [w3], 'the proxy shows the oldest row left');
  await zeroCleanupHarmless();
  assertProxyNeverAboveLog(mainWatch);
  caughtUp.cancel();
  restored.cancel();
}

scenario('4. a view-syncer restores from the backup the sidecar hands it and streams through the sidecar', async () => {
  assert.ok(!(await import('node:fs')).existsSync(vsOf(t).replica), 'the view-syncer starts with no replica');
  const vs = await t.startViewSyncer(VS);
  // Reservation, restore from the URL the sidecar gave, then its subscription ends the reservation.
  const restoring = await vs.waitFor(/restoring backup from /, {timeout: 60_000});
  assert.ok(restoring.includes(`restoring backup from ${t.backupURL}`), restoring);
  await vs.waitFor(/\[litestream-gauge \d+\] restored /, {timeout: 30_000});
  await eventually('the view-syncer to subscribe through the sidecar',
    () => events('subscribed', {task_id: VS_TASK_ID, mode: 'serving'}).length > 0, {timeout: 60_000});
  assert.equal(events('reservation opened', {task_id: VS_TASK_ID}).length, 1);
  await eventually("the view-syncer's subscription to end its reservation",
    () => events('reservation ended by its subscription', {task_id: VS_TASK_ID}).length === 1);
  // The reservation's own task logs its close once its socket has gone: a moment after the relay ends it.
  await eventually('the reservation to close', () => !openReservations().has(VS_TASK_ID));

  const w4 = await t.insert([[40, 'forty', 40], [41, 'forty-one', null]]);
  await eventually('the rows to reach the view-syncer replica', () => {
    const {stateVersion} = t.replicaItems(vsOf(t).replica);
    return stateVersion >= w4;
  }, {timeout: 30_000});
  assert.deepEqual(t.replicaItems(vsOf(t).replica).rows, await t.upstreamItems());

  // The replication-manager's backup replicator streams through the sidecar too, and the backup follows.
  await t.waitBackedUp(w4);
  assert.deepEqual(t.replicaItems(t.rmReplica).rows, await t.upstreamItems());
  assertLoopbackOnly({'view-syncer sync port': vsOf(t).ports.sync});
  const sidecarPid = t.procs.get('sidecar').pid;
  for (const c of connections().filter(c => c.peerPort === t.ports.rmChangeStreamer)) {
    assert.deepEqual(c.pids, [sidecarPid], `direct connection to the change-streamer: ${c.line}`);
  }
  // Zero's BackupMonitor polls the proxy every 60 s: it always found a healthy litestream (and no watermark).
  assert.deepEqual(t.procs.get('replication-manager').matching(/unable to fetch metrics/), [],
    "Zero's BackupMonitor could read the proxy");
  const viaSidecar = connections().filter(c => c.peerPort === t.ports.sidecar);
  assert.ok(viaSidecar.length >= 2, 'the backup replicator and the view-syncer are connected to the sidecar');
  // The proxy page Zero reads: from the sidecar's next checks after litestream's first backup on, a sample on every
  // page (until now: scenario 5 restarts the sidecar), never above the change log's oldest row.
  const shown = assertProxyShowsBackupSoonAfter(mainWatch, Date.parse(t.gaugeServed()[0].at));
  assert.ok(shown.reads >= 20, describeWatch(mainWatch));
  assertProxyNeverAboveLog(mainWatch);
}, 180_000);

scenario('5. the sidecar restarts under both Zero processes; streaming resumes, nothing lost or duplicated', async () => {
  const vs = t.procs.get('view-syncer');
  const rm = t.procs.get('replication-manager');
  const before = sidecarEvents().length;
  const {code, signal} = await t.stopSidecar();
  assert.equal(code, 0, `the sidecar exits cleanly on SIGTERM (signal ${signal})`);

  // While it is down, upstream moves on.
  const w5 = await t.insert([[50, 'fifty', 5]]);
  await sleep(1000);
  await t.startSidecar();
  const w6 = await t.insert([[60, 'sixty', 6], [61, 'sixty-one', 7]]);
  const w7 = await t.insert([[70, 'seventy', 8]]);

  await eventually('the view-syncer to catch up after the restart', () => t.replicaItems(vsOf(t).replica).stateVersion >= w7,
    {timeout: 60_000});
  const upstream = await t.upstreamItems();
  assert.deepEqual(t.replicaItems(vsOf(t).replica).rows, upstream, 'view-syncer replica equals upstream');
  assert.equal(t.replicaItems(vsOf(t).replica).stateVersion, w7);
  await t.waitBackedUp(w7);
  assert.deepEqual(t.replicaItems(t.rmReplica).rows, upstream, 'backup replica equals upstream');

  // Both reconnected through the new sidecar.
  const since = sidecarEvents().slice(before);
  assert.ok(since.some(e => e.message === 'subscribed' && field(e, 'mode') === 'backup'), 'the backup replicator reconnected');
  assert.ok(since.some(e => e.message === 'subscribed' && field(e, 'task_id') === VS_TASK_ID), 'the view-syncer reconnected');
  assert.ok(w5 < w6 && w6 < w7);
  assert.ok(vs.running && rm.running, 'both Zero processes kept running');
  await zeroCleanupHarmless({minReads: 1});
  // Across the sidecar's restart too, the proxy never showed Zero a watermark above the change log's oldest row.
  await mainWatch.stop();
  assert.ok(assertProxyNeverAboveLog(mainWatch) > 100, describeWatch(mainWatch));

  // Every backup litestream's gauge claimed so far is in the destination: a fresh restore reaches it.
  const check = await assertGaugeNeverAhead(t, {min: 5});
  assert.ok(check.latest >= w7, `a restore of the destination reaches ${w7}: ${JSON.stringify(check)}`);
}, 180_000);

scenario("6. Zero 0.20's own purge, from the watermark the proxy shows, deletes nothing", async () => {
  // The main deployment has run for minutes: its sidecar has purged everything below the last row (every subscriber
  // acked it, its backup aged), and the proxy shows that row. Zero 0.20's BackupMonitor reads
  // it, schedules a purge below it once its backup time is older than the cleanup delay, and 30 s later runs
  // `DELETE … WHERE watermark < W` (no row kept, no owner checked): it deletes nothing.
  await eventually('the sidecar to purge all but the last transaction', async () => (await t.changeLog()).length === 1,
    {timeout: 90_000, interval: 500});
  const [last] = [...await t.changeLog()];
  const clamped = await clampedPage();
  assert.deepEqual(clamped.samples.map(x => x.watermark), [last.watermark], 'the proxy shows the one row left');
  const rm = t.procs.get('replication-manager');
  const purged = await rm.waitFor(new RegExp(`Purged \\d+ changes before ${last.watermark}\\b`), {timeout: 240_000,
    what: `Zero's purge below ${last.watermark}`});
  assert.match(purged, /Purged 0 changes before /, purged);
  assert.deepEqual([...await t.changeLog()], [last], "Zero's purge deleted no row");
  const zero = await zeroCleanupHarmless({minReads: 1});
  assert.ok(zero.purges.length >= 1);
  assert.ok(rm.running && t.procs.get(VS).running, "Zero's processes keep running");
}, 300_000);

scenario('7. cold start with the first backup late, the gauge hidden from Zero: the view-syncer waits on one open, pinged reservation, then restores once', async ctx => {
  // Long enough that the wait outlasts Zero 0.20's own liveness limit on the socket (30 s + 3 s, docs/protocol.md, "Liveness").
  const FIRST_UPLOAD_DELAY_MS = 45_000;
  const PING_INTERVAL_MS = 5_000; // the sidecar's server.ping_interval in the Topology's config
  // This deployment backs up to S3 (moto on loopback), with the endpoint the exporter adds to Zero 0.20's config.
  const cold = new Topology('cold', {
    destination: 's3',
    litestreamEnv: {INTEROP_LITESTREAM_FIRST_UPLOAD_DELAY_MS: String(FIRST_UPLOAD_DELAY_MS)},
  });
  // The other proxy mode: the gauge hidden from Zero, whose own cleanup then never starts.
  cold.proxyMode = 'hide';
  extra.push(cold);
  everyTopology.push(cold);
  await cold.prepare();
  await cold.viewSyncer(VS);
  await cold.startSidecar();
  const rm = cold.startReplicationManager();
  await eventually('Zero to advertise the sidecar', async () => (await cold.ownerAddress()) === cold.sidecarAddress,
    {timeout: 90_000});
  await rm.waitFor(/holding the first upload back/, {timeout: 60_000});
  assert.equal(await cold.backedUp(), null, 'no backup yet');

  const vs = await cold.startViewSyncer(VS);
  const timeline = () => reservationTimeline(cold.procs, VS_TASK_ID);
  await eventually('the view-syncer to reserve a snapshot', () => timeline().opened, {timeout: 60_000, interval: 100});
  // Until the sidecar sends the status: the view-syncer's socket to the sidecar as the kernel counts it, whether
  // litestream's gauge reports a backup, and the view-syncer's restore lines. Read in that order, a restore line
  // seen before a look that still finds no backup came while no status could have been sent.
  const RESTORE = /restoring backup from|replica not found|\[litestream-gauge \d+\] restor/;
  const samples = [];
  const early = [];
  await eventually('the sidecar to send the status', async () => {
    if (timeline().pinned) return true;
    // (Zero runs the restore in a worker of the process started; only this deployment's processes use its port.)
    const vsPids = treePids('view-syncer');
    const sockets = tcpCounters(cold.ports.sidecar).filter(s => s.pids.some(p => vsPids.includes(p)));
    const restoreLines = vs.matching(RESTORE);
    const backedUp = await cold.backedUp();
    if (backedUp === null) early.push(...restoreLines);
    samples.push({at: Date.now(), sockets, backedUp});
    assert.ok(vs.running, 'the view-syncer keeps running');
    return false;
  }, {timeout: FIRST_UPLOAD_DELAY_MS + 60_000, interval: 500});
  const {opened, withheld, pinned, waitMs} = timeline();
  assert.deepEqual(early, [], 'no status and no restore attempt before the first backup');
  assert.equal(withheld?.message, 'snapshot status withheld until litestream reports a first backup');

  // The one reservation socket, from just after it opened until just before its status went out.
  const openedAt = Date.parse(opened.timestamp);
  const pinnedAt = Date.parse(pinned.timestamp);
  const waiting = samples.filter(s => s.at < pinnedAt);
  const [first, last] = [waiting[0], waiting.at(-1)];
  assert.ok(first, 'a look at the socket while the reservation waited');
  // The socket the reservation opened on, as the sidecar logged its peer: however late the first look came on a
  // loaded machine, a socket reopened since would show another port.
  const openedOn = field(opened, 'peer');
  for (const s of waiting) {
    assert.equal(s.sockets.length, 1, `one connection to the sidecar while waiting: ${JSON.stringify(s.sockets)}`);
    assert.equal(s.sockets[0].local, openedOn, 'the socket the reservation opened on, all along (never reopened)');
  }
  // The status follows the first backup (the sidecar's next check, then a listing of the destination).
  const backupSeen = samples.find(s => s.backedUp !== null);
  const noBackup = waiting.filter(s => s.backedUp === null);
  assert.ok(noBackup.length > 0 && noBackup.at(-1).at - openedAt >= 20_000,
    'the reservation stayed open, with no status, for at least 20 s with no backup');
  // When the gauge first showed a backup, as the exporter logged it (the samples above, taken every 500 ms on a
  // busy machine, may see it late).
  const firstGauge = cold.gaugeServed()[0];
  assert.ok(firstGauge, 'the gauge showed a backup');
  assert.ok(pinnedAt >= Date.parse(firstGauge.at) - 1_000, 'no status before the gauge reported a backup');
  assert.ok(!backupSeen || Date.parse(firstGauge.at) <= backupSeen.at, 'the exporter logged the gauge as it served it');
  const received = last.sockets[0].bytesReceived - first.sockets[0].bytesReceived;
  const sent = last.sockets[0].bytesAcked - first.sockets[0].bytesAcked;
  assert.equal(received % 2, 0, `only 2-byte pings reached the view-syncer before its status (${received} bytes)`);
  assert.equal(sent % 6, 0, `only 6-byte pongs left it (${sent} bytes)`);
  const [pings, pongs] = [received / 2, sent / 6];
  // The pings due between the first look and the last.
  const due = Math.floor((last.at - openedAt) / PING_INTERVAL_MS) - Math.floor((first.at - openedAt) / PING_INTERVAL_MS);
  assert.ok(Math.abs(pings - due) <= 1, `a ping every ${PING_INTERVAL_MS} ms: ${pings} in ${last.at - first.at} ms`);
  assert.ok(pongs >= pings - 1 && pongs <= pings, `the view-syncer answered them (${pongs} pongs to ${pings} pings)`);
  const measured = `reservation open ${(waitMs / 1000).toFixed(1)} s before its status (first upload held back ` +
    `${FIRST_UPLOAD_DELAY_MS / 1000} s); ${pings} pings sent and ${pongs} pongs answered from ` +
    `${((first.at - openedAt) / 1000).toFixed(1)} s to ${((last.at - openedAt) / 1000).toFixed(1)} s of it, on one socket; no restore attempted meanwhile; status ` +
    `${backupSeen ? `${((pinnedAt - backupSeen.at) / 1000).toFixed(1)} s after the gauge's first backup was seen` : 'sent'}`;
  ctx.diagnostic(`cold start: ${measured}`);

  // Then it restores once from the backup the status names, and subscribes and streams through the sidecar.
  const restoring = await vs.waitFor(/restoring backup from /, {timeout: 60_000});
  assert.ok(restoring.includes(`restoring backup from ${cold.backupURL}`), restoring);
  await vs.waitFor(/\[litestream-gauge \d+\] restored /, {timeout: 30_000});
  await eventually('the view-syncer to subscribe through the sidecar',
    () => sidecarEventsWith(cold.procs, 'subscribed', {task_id: VS_TASK_ID, mode: 'serving'}).length > 0, {timeout: 60_000});
  await eventually("the view-syncer's subscription to end its reservation", () => timeline().ended);
  assert.equal(timeline().ended.message, 'reservation ended by its subscription');
  const w = await cold.insert([[90, 'ninety', 90]]);
  await eventually('the row to reach the view-syncer replica', () => {
    try {
      return cold.replicaItems(vsOf(cold).replica).stateVersion >= w;
    } catch {
      return false;
    }
  }, {timeout: 60_000});
  assert.deepEqual(cold.replicaItems(vsOf(cold).replica).rows, await cold.upstreamItems());
  assert.equal(sidecarEventsWith(cold.procs, 'reservation opened', {task_id: VS_TASK_ID}).length, 1, 'exactly one reservation');
  assert.equal(vs.matching(/restoring backup from /).length, 1, 'one restore');
  assert.equal(vs.matching(/\[litestream-gauge \d+\] restored /).length, 1, 'one restore');
  assert.deepEqual(vs.matching(/replica not found|max attempts exceeded/), []);
  const proxied = await cold.proxyPage();
  assert.equal(proxied.status, 200);
  assert.match(proxied.body, /litestream_db_size/);
  assert.doesNotMatch(proxied.body, /litestream_replica_progress/, 'the proxy hides the watermark from Zero');
  assert.deepEqual(rm.matching(ZERO_CLEANUP), [], 'Zero scheduled no cleanup of its own');
  await cold.waitBackedUp(w);
  await assertGaugeNeverAhead(cold, {min: 2});
  await cold.close();
  extra.splice(extra.indexOf(cold), 1);
}, 240_000);
