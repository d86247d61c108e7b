// End-to-end interop tests: the sidecar beside real Zero 1.10.0 processes, built from rocicorp/mono at 23da5f1c
// (docs/deploy-zero-1.9.md, "Zero 1.10"). Run by scripts/interop.sh 1.10 under Node 22: PostgreSQL from
// scripts/with-postgres.sh, the sidecar from SIDECAR_BIN, the real litestream 0.3.13 (LITESTREAM_BIN, through
// lib/litestream-gauge.mjs) that the replication-manager backs up with, and the real litestream 0.5.17
// (LITESTREAM_V5_BIN, through lib/litestream-v5.sh) that view-syncers restore that v0.3 backup with, as 1.10 does by
// default (ZERO_LITESTREAM_RESTORE_USING_V5).
//
// The main deployment is the URI topology (docs/deploy-zero-1.9.md) on an S3 destination (moto), with the sidecar's
// default `proxy_mode` ("clamp"); it starts from nothing, so its replication-manager runs an initial sync and waits
// behind its readiness gate for a first backup, which its litestream is slow to upload; a view-syncer started with it
// waits for a snapshot status meanwhile (the cold start). Its scenarios run in order, each relying on what the earlier
// ones left; the last ones start deployments of their own (13: the address topology). A run may hold only some of
// them (a shard of `make test`, INTEROP_ONLY: lib/selection.mjs): the main deployment starts only for scenarios 1 to 9.
// What the scenarios share with the 1.9 suite's is in lib/suite.mjs, lib/scenarios.mjs, lib/topology.mjs and
// lib/proxy-watch.mjs.
import {after, before} from 'node:test';
import assert from 'node:assert/strict';
import {existsSync} from 'node:fs';
import {setTimeout as sleep} from 'node:timers/promises';
import {cmdline, treePids} from '../lib/procs.mjs';
import {field, httpGet, reservationTimeline, sidecarEventsWith} from '../lib/util.mjs';
import {Topology, VIEW_SYNCER_RESTART_GRACE_MS, ZERO_CLI, ZERO_VERSION, eventually} from '../lib/topology.mjs';
import {selection} from '../lib/selection.mjs';
import {RawSubscriber, changesQuery, snapshotStatuses} from '../lib/clients.mjs';
import {ZERO_READ, assertProxyNeverAboveLog, watchProxy} from '../lib/proxy-watch.mjs';
import {
  SUBSCRIPTION_REFUSED, Suite, assertLoopbackOnly, assertTelemetryOff, keepWriting, literally, logLines as logLinesOf,
  trailingJSON, zeroCleanupHarmless,
} from '../lib/suite.mjs';
import {
  pairTakeover, replicationManagerRestarts, restoreAcrossSidecarKill, stockLitestream, viewSyncerRestartsAfterPurges,
} from '../lib/scenarios.mjs';

/**
 * How long the main deployment's litestream holds its first upload back (a slow first snapshot), so that the
 * view-syncer started with the stack asks for a snapshot well before any backup exists (scenario 2).
 */
const FIRST_UPLOAD_DELAY_MS = 15_000;
// Its sidecar's drills restore with what view-syncers restore with: litestream 0.5 (`backup.restore_with = "0.5"`).
// Scenario 5 stops a view-syncer, writes, and starts it again: it keeps its replica only if it is back within the
// reconnect grace, and a loaded machine took 15 s from its stop to its reservation (VIEW_SYNCER_RESTART_GRACE_MS).
const t = new Topology('main', {destination: 's3', drillLitestream: process.env.LITESTREAM_V5_BIN, restoreWith: '0.5',
  drillInterval: '5s', litestreamEnv: {INTEROP_LITESTREAM_FIRST_UPLOAD_DELAY_MS: String(FIRST_UPLOAD_DELAY_MS)},
  reconnectGraceMs: VIEW_SYNCER_RESTART_GRACE_MS});
t.discovery = 'owner';
const suite = new Suite([t]); // every deployment started and not yet closed
const track = topo => suite.topologies.push(topo);
const untrack = topo => suite.topologies.splice(suite.topologies.indexOf(topo), 1);
/** The scenarios this run registers (lib/selection.mjs: its shard, INTEROP_ONLY). */
const selected = selection(ZERO_VERSION);
const scenario = (name, ...rest) => {
  if (selected.take(name)) suite.scenario(name, ...rest);
};
const events = (message, fields = {}, topo = t) => sidecarEventsWith(topo.procs, message, fields);
const logLines = (name, pattern, topo = t) => logLinesOf(topo, name, pattern);
/** The view-syncer of the main deployment: started with the stack (`before`), it streams through scenario 9. */
const VS = 'vs1';
let mainWatch;
let rmStartedAt;
/** The replication-manager's /keepalive, sampled from its start until it answered 200 (scenario 1). */
let keepalive;

/** The replication-manager's own change-streamer's `path`: `{status}` (0 while it does not answer within 1 s). */
async function rmGet(topo, path) {
  return httpGet(`http://${topo.rmAddress}${path}`, {timeout: 1000}).catch(() => ({status: 0, body: ''}));
}

/** Samples `GET /keepalive` of the replication-manager every 250 ms until it answers 200. */
function sampleKeepalive(topo) {
  const samples = [];
  const done = (async () => {
    for (;;) {
      const at = Date.now();
      const {status} = await rmGet(topo, '/keepalive');
      samples.push({at, status});
      if (status === 200) return;
      await sleep(250);
    }
  })();
  return {samples, done};
}

const RESTORED_WITH_V5 = /selected v0\.3\.x snapshot/;

// The main deployment, for the scenarios that use it (scenarios 1 to 9; the others start their own).
before(async () => {
  // Node runs this as it is declared, before the scenarios below are: they are, once it yields to the event loop.
  await sleep(0);
  if (!selected.main) return;
  try {
    await t.prepare();
    await t.startSidecar();
    mainWatch = watchProxy(t);
    rmStartedAt = Date.now();
    t.startReplicationManager();
    t.litestreamEnv = {}; // only the first start's upload is late: the restarts of scenario 3 back up at once
    keepalive = sampleKeepalive(t);
    // A view-syncer started with the stack, in the URI topology: it asks the sidecar for a snapshot before any backup
    // exists (scenario 2).
    const vs = await t.viewSyncer(VS, {uri: `ws://${t.sidecarAddress}/`});
    assert.ok(!existsSync(vs.replica), 'the view-syncer starts with no replica');
    await t.startViewSyncer(VS);
  } catch (e) {
    suite.failed = true;
    throw e;
  }
});

after(async () => {
  await mainWatch?.stop();
  await suite.finish('interop-1.10');
});

scenario("1. a fresh stack behind the clamp: the replication-manager is ready only after its initial backup is confirmed, then takes over the change log", async ctx => {
  const rm = t.procs.get('replication-manager');
  await rm.waitFor(/awaiting initial backup/, {timeout: 120_000, what: 'the readiness gate'});
  const confirmed = await rm.waitFor(/initial backup confirmed after/, {timeout: 120_000, what: 'the first backup confirmed'});
  await eventually("the replication-manager's /keepalive to answer", async () => {
    await Promise.race([keepalive.done, sleep(200)]);
    return keepalive.samples.at(-1)?.status === 200;
  }, {timeout: 30_000});
  const readyAt = keepalive.samples.at(-1).at;
  const firstUpload = t.gaugeServed()[0];
  assert.ok(firstUpload, 'litestream backed up the replica');
  // Not ready until the first backup: /keepalive did not answer before litestream's first upload was proven.
  const early = keepalive.samples.filter(s => s.status === 200 && s.at < Date.parse(firstUpload.at));
  assert.deepEqual(early, [], `/keepalive answered before the first backup (${firstUpload.at})`);
  assert.ok(keepalive.samples.filter(s => s.status !== 200).length >= 4, 'the gate held for a while');
  // The watermark it confirmed is the clamped one: the change log's oldest, seeded at the replica version.
  const {replicaVersion} = await t.replicationState();
  assert.ok(logLines('replication-manager', ZERO_READ).some(l => ZERO_READ.exec(l)[1] >= replicaVersion),
    "Zero read a backed-up watermark from the sidecar's proxy");
  // It takes over the change log (ownership) after its startup delay.
  await rm.waitFor(new RegExp(`assumed ownership at ${literally(t.rmAddress)}`), {timeout: 90_000});
  assert.equal(await t.ownerAddress(), t.rmAddress);
  await eventually('the sidecar to find the replication-manager it relays to', async () =>
    (await t.sidecarStatus()).upstream?.protocols?.max === 6, {timeout: 30_000});
  const status = await t.sidecarStatus();
  assert.deepEqual([status.upstream.protocols.min, status.upstream.protocols.max], [4, 6], JSON.stringify(status.upstream));

  assert.match(rm.text, /starting server@1\.10\.0/);
  assert.doesNotMatch(rm.text, /telemetry: starting/);
  assert.ok(cmdline(rm.pid).includes(ZERO_CLI));
  assertTelemetryOff();
  await assertLoopbackOnly({
    sidecar: t.ports.sidecar,
    'metrics proxy': t.ports.proxy,
    'litestream (its gauge exporter)': t.ports.litestream,
    'change-streamer': t.ports.rmChangeStreamer,
    'the S3 server (moto)': t.ports.moto,
  });
  const since = at => `+${((at - rmStartedAt) / 1000).toFixed(1)} s`;
  ctx.diagnostic(`first upload proven at ${since(Date.parse(firstUpload.at))} (${firstUpload.watermark}); ` +
    `${confirmed.slice(confirmed.indexOf('initial backup confirmed'))}; /keepalive 200 at ${since(readyAt)} after ` +
    `${keepalive.samples.length - 1} refusals`);
});

scenario('2. a view-syncer started with the stack waits for the late first backup, then restores it once with litestream 0.5 and streams', async () => {
  const cfg = await t.viewSyncer(VS);
  const vs = t.procs.get(VS);
  const rm = t.procs.get('replication-manager');
  await rm.waitFor(/holding the first upload back/, {timeout: 10_000, what: "litestream's late first upload"});
  const accepted = await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 180_000});
  // It asked before the first backup and got its status only after it: nothing to restore from until then.
  const firstUpload = t.gaugeServed()[0];
  assert.ok(firstUpload, 'litestream backed up the replica');
  const timeline = reservationTimeline(t.procs, cfg.taskID);
  assert.ok(timeline.opened && Date.parse(timeline.opened.timestamp) < Date.parse(firstUpload.at),
    `the reservation opened before the first upload (${firstUpload.at}): ${JSON.stringify(timeline.opened)}`);
  assert.ok(timeline.withheld, 'its status was withheld');
  assert.ok(Date.parse(timeline.pinned.timestamp) >= Date.parse(firstUpload.at),
    `its status went out after the first upload (${firstUpload.at}): ${JSON.stringify(timeline.pinned)}`);
  assert.equal(sidecarEventsWith(t.procs, 'reservation opened', {task_id: cfg.taskID}).length, 1, 'one reservation');
  assert.deepEqual(vs.matching(/replica not found|Unable to reserve snapshot/), []);
  const status = trailingJSON(accepted);
  assert.equal(status.backupURL, t.backupURL);
  assert.equal(status.replicaVersion, (await t.replicationState()).replicaVersion);
  // The optional replicaSize goes out only once litestream reports the replica's size, which it may not have yet
  // when the first backup is read: never 0 or made up.
  assert.ok(status.replicaSize === undefined || (Number.isSafeInteger(status.replicaSize) && status.replicaSize > 0),
    accepted);
  assert.ok(vs.matching(new RegExp(`connecting to change-streamer@ws://${literally(t.sidecarAddress)}/replication/v6/snapshot`)).length >= 1);
  // The restore ran litestream 0.5 (ZERO_LITESTREAM_EXECUTABLE_V5), which read the v0.3 layout, once.
  const restore = vs.matching(/\[litestream-gauge \d+\] argv: \["restore"/);
  assert.equal(restore.length, 1, 'one restore');
  assert.ok(restore[0].endsWith(`,"${cfg.replica}"]`), restore[0]);
  await vs.waitFor(RESTORED_WITH_V5, {timeout: 10_000, what: "litestream 0.5's v0.3 restore"});

  await eventually('the view-syncer to subscribe through the sidecar',
    () => events('subscribed', {task_id: cfg.taskID, mode: 'serving'}).length > 0, {timeout: 90_000});
  await eventually("its subscription to end its reservation",
    () => events('reservation ended by its subscription', {task_id: cfg.taskID}).length === 1);
  const w = await t.insert([[20, 'twenty', '9007199254740993'], [21, 'twenty-one', -1]]);
  await eventually('the rows to reach the view-syncer', () => (t.tryReplicaItems(cfg.replica)?.stateVersion ?? '') >= w,
    {timeout: 60_000});
  assert.deepEqual(t.replicaItems(cfg.replica).rows, await t.upstreamItems());
  assert.deepEqual(vs.matching(SUBSCRIPTION_REFUSED), []);
  assertTelemetryOff();
  await assertLoopbackOnly({'view-syncer sync port': cfg.ports.sync});
}, {timeout: 240_000});

scenario('3. the replication-manager restarts: streaming resumes, nothing lost or duplicated', async () => {
  // Its replica is there: no initial sync, so no wait for a backup before it is ready (lib/scenarios.mjs).
  await replicationManagerRestarts(t, {vs: VS, first: 40});
  const rm = t.procs.get('replication-manager');
  assert.deepEqual(rm.matching(/awaiting initial backup/), [], 'a restart with its replica does not wait for a backup');
}, {timeout: 240_000});

scenario("4. the sidecar purges below an aged backup, its drills restore with litestream 0.5; Zero reads the clamped watermark and its purges delete nothing", async ctx => {
  const cfg = await t.viewSyncer(VS);
  const w = await t.insert([[30, 'thirty', 30]]);
  await t.waitBackedUp(w);
  await eventually(`the sidecar to purge below ${w}`, () => events('change log purged').some(e => field(e, 'before') === w),
    {timeout: 120_000, interval: 500});
  assert.equal((await t.changeLogWatermarks())[0], w, "the backup's own rows are kept");
  assert.ok((t.tryReplicaItems(cfg.replica)?.stateVersion ?? '') >= w, 'the view-syncer is past the purge');
  // The drills ran litestream 0.5 and proved the backup; 0.5 named the generation it restored (at debug level).
  const drills = await eventually('a drill to prove the backup at or past the purge', async () => {
    const {drills: d} = await t.sidecarStatus();
    return d.last_proof && d.last_proof.proven_watermark >= w ? d : null;
  }, {timeout: 60_000});
  assert.equal(drills.failures, 0, JSON.stringify(drills));
  assert.match(drills.last_proof.generation ?? '', /^[0-9a-f]{16}$/, JSON.stringify(drills));
  const {generations} = await t.listDestination();
  assert.ok(generations.some(g => g.generation === drills.last_proof.generation), JSON.stringify(generations));
  // Zero 1.10's poller reads the proxy every 10 s and purges 30 s after a new watermark: below the sidecar's.
  const rm = t.procs.get('replication-manager');
  await rm.waitFor(new RegExp(`replicated watermark=${w} `), {timeout: 120_000, what: `Zero to read ${w}`});
  // (1.10.0 says "PG changes": it can also keep a change log in SQLite, off by default.)
  const purged = await rm.waitFor(new RegExp(`Purged \\d+ PG changes before ${w}\\b`), {timeout: 120_000,
    what: `its purge below ${w}`});
  assert.match(purged, /Purged 0 PG changes before /, purged);
  const zero = await zeroCleanupHarmless(t, {minReads: 1});
  assertProxyNeverAboveLog(mainWatch);
  ctx.diagnostic(`drill proof ${JSON.stringify(drills.last_proof)}; Zero's purges ${zero.purges.length}`);
}, {timeout: 360_000});

scenario('5. a view-syncer on a permanent volume restarts after purges: keeps its replica, catches up', async () => {
  // litestream 0.5 leaves an existing database alone without a word of its own (-if-db-not-exists).
  await viewSyncerRestartsAfterPurges(t, {name: VS, first: 60, keptLine: null});
}, {timeout: 240_000});

/** An upgrade the sidecar refuses before it: `{status, body}` of its HTTP answer. */
function refusedUpgrade(url) {
  return new Promise((resolve, reject) => {
    const sub = new RawSubscriber(url, 'refused');
    sub.opened.catch(() => {}); // refused: answered below
    const {ws} = sub;
    ws.once('unexpected-response', (_req, res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', c => (body += c));
      res.on('end', () => resolve({status: res.statusCode, body}));
    });
    ws.once('open', () => reject(new Error(`${url} was upgraded`)));
    ws.on('error', () => {});
  });
}

scenario("6. a v3 client is refused with Zero's own text, before any status and without a reservation", async () => {
  const {replicaVersion} = await t.replicationState();
  // Zero 1.10's own answer to a v3 subscriber: a close after the upgrade.
  const direct = new RawSubscriber(`ws://${t.rmAddress}/replication/v3/changes?${changesQuery({
    taskID: 'interop110-v3-direct', id: 'v3-direct', watermark: replicaVersion, replicaVersion})}`, 'v3 direct');
  await direct.opened;
  const closed = await direct.closedP;
  assert.equal(closed.code, 1002, JSON.stringify(closed));
  assert.equal(closed.reason, 'Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]');
  // The sidecar's: the same text as an HTTP 400 before the upgrade, on both routes.
  const snapshot = await refusedUpgrade(`ws://${t.sidecarAddress}/replication/v3/snapshot?taskID=interop110-v3`);
  assert.deepEqual({status: snapshot.status, body: snapshot.body.trim()}, {status: 400, body: closed.reason});
  const changes = await refusedUpgrade(`ws://${t.sidecarAddress}/replication/v3/changes?${changesQuery({
    taskID: 'interop110-v3', id: 'v3', watermark: replicaVersion, replicaVersion})}`);
  assert.deepEqual({status: changes.status, body: changes.body.trim()}, {status: 400, body: closed.reason});
  assert.deepEqual(events('reservation opened', {task_id: 'interop110-v3'}), [], 'no reservation, so no status');
});

/** The real litestream replicate the replication-manager's gauge exporter runs (its pid). */
function litestreamReplicate(topo) {
  for (const pid of treePids('replication-manager', topo.procs.deployment)) {
    try {
      const argv = cmdline(pid);
      if (argv[0] === topo.litestreamBin && argv[1] === 'replicate') return pid;
    } catch {
      // gone meanwhile
    }
  }
  return null;
}

scenario('7. statuses wait while the change log starts past the backup; the view-syncer that gets one catches up', async ctx => {
  const pid = await eventually("the replication-manager's litestream", () => litestreamReplicate(t), {timeout: 30_000});
  const name = 'vs-wait';
  const cfg = await t.viewSyncer(name, {uri: `ws://${t.sidecarAddress}/`});
  // Uploads stop (litestream's page stops answering too: the sidecar and Zero keep what they read last).
  const backup = await t.backedUp();
  process.kill(pid, 'SIGSTOP');
  let stopped = true;
  try {
    const w1 = await t.insert([[50, 'fifty', 50]]);
    const w2 = await t.insert([[51, 'fifty-one', 51]]);
    assert.ok(backup < w1 && w1 < w2);
    // Rows below w2 leave the change log (another purger, or one that trusted a backup that is gone): the log now
    // starts past every backup there is.
    await t.change.unsafe(`DELETE FROM ${t.cdc}."changeLog" WHERE watermark < $1`, [w2]);
    assert.equal(await t.changeLogMin(), w2);
    const vs = await t.startViewSyncer(name);
    const timeline = () => reservationTimeline(t.procs, cfg.taskID);
    await eventually('the reservation and its withheld status', () => timeline().withheld, {timeout: 60_000});
    assert.match(timeline().withheld.message, /the change log's oldest watermark is past the newest backup/);
    await sleep(8_000);
    assert.equal(timeline().pinned, null, 'no status while the log starts past the backup');
    assert.deepEqual(vs.matching(/starting litestream restore|restoring backup from/), [], 'nothing restored');
    process.kill(pid, 'SIGCONT');
    stopped = false;
    await t.waitBackedUp(w2);
    await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 90_000});
    await eventually(`${name} to subscribe through the sidecar`,
      () => events('subscribed', {task_id: cfg.taskID, mode: 'serving'}).length > 0, {timeout: 60_000});
    const w3 = await t.insert([[52, 'fifty-two', 52]]);
    await eventually(`${name} to catch up to ${w3}`, () => (t.tryReplicaItems(cfg.replica)?.stateVersion ?? '') >= w3,
      {timeout: 60_000});
    assert.deepEqual(t.replicaItems(cfg.replica).rows, await t.upstreamItems());
    assert.deepEqual(vs.matching(SUBSCRIPTION_REFUSED), []);
    assert.equal(vs.matching(/\[litestream-gauge \d+\] argv: \["restore"/).length, 1, 'one restore');
    ctx.diagnostic(`status withheld for ${(timeline().waitMs / 1000).toFixed(1)} s`);
  } finally {
    if (stopped) process.kill(pid, 'SIGCONT');
  }
  await t.stopViewSyncer(name);
}, {timeout: 240_000});

/** A raw subscriber that acks every message as it arrives, as a view-syncer keeping up does. */
function promptSubscriber(url, name) {
  const sub = new RawSubscriber(url, name);
  sub.ws.on('message', data => {
    try {
      sub.ack(JSON.parse(data.toString('utf8')).id);
    } catch {
      // not a message with an id
    }
  });
  return sub;
}

scenario('8. under load, subscribers relayed by the sidecar are not dropped as too far behind (StreamTooFarBehind) beside direct ones', async ctx => {
  // Zero 1.10 times a subscriber's acks once more than half of its subscribers have acked, from three on: two direct
  // and two relayed subscribers, beside the view-syncer, all keeping up, for longer than its 30 s grace period.
  const {replicaVersion} = await t.replicationState();
  const [{max: from}] = await t.change.unsafe(`SELECT max(watermark) AS max FROM ${t.cdc}."changeLog"`);
  const subs = [];
  for (const [via, n] of [['direct', 1], ['direct', 2], ['relayed', 1], ['relayed', 2]]) {
    const host = via === 'direct' ? t.rmAddress : t.sidecarAddress;
    const id = `${via}-${n}`;
    subs.push(promptSubscriber(`ws://${host}/replication/v6/changes?${changesQuery({
      taskID: `interop110-load-${id}`, id, watermark: from, replicaVersion})}`, id));
  }
  await Promise.all(subs.map(s => s.opened));
  const writes = keepWriting(t, 1000, 20);
  let last;
  try {
    await sleep(45_000);
  } finally {
    await writes.stop();
  }
  last = await t.stored([writes.rows.at(-1).id]);
  for (const s of subs) await s.untilCommit(last, 60_000);
  const errors = subs.flatMap(s => s.messages().filter(m => m.msg?.[0] === 'error').map(m => `${s.name}: ${JSON.stringify(m.msg)}`));
  assert.deepEqual(errors, [], 'no subscriber was sent an error');
  assert.deepEqual(subs.filter(s => s.closed).map(s => `${s.name}: ${JSON.stringify(s.closed)}`), [], 'none was closed');
  assert.deepEqual(logLines('replication-manager', /StreamTooFarBehind|too far behind/i), []);
  const vs = t.procs.get(VS);
  assert.ok(vs.running && vs.matching(SUBSCRIPTION_REFUSED).length === 0, 'the view-syncer kept up too');
  const commits = subs.map(s => `${s.name} ${s.messages().filter(m => m.msg?.[0] === 'commit').length}`);
  ctx.diagnostic(`${writes.rows.length} transactions in 45 s; commits received: ${commits.join(', ')}`);
  for (const s of subs) await s.close();
}, {timeout: 240_000});

scenario('9. a view-syncer mid-restore across a sidecar SIGKILL and restart catches up without WatermarkTooOld', async () => {
  // As in the 1.9 suite (lib/scenarios.mjs), the restore with litestream 0.5 held back by the gauge exporter.
  const {w} = await restoreAcrossSidecarKill(t, {name: 'vs-restore', others: [VS], first: 100});
  await t.waitBackedUp(w);
  assertProxyNeverAboveLog(mainWatch);
  await zeroCleanupHarmless(t);
}, {timeout: 360_000});

scenario('10. proxy_mode = "hide": the replication-manager never becomes ready after its initial sync; the sidecar says why, and refuses to start once it can know', async ctx => {
  const hide = new Topology('hide', {});
  hide.discovery = 'owner';
  hide.proxyMode = 'hide';
  track(hide);
  await hide.prepare();
  await hide.startSidecar();
  const rm = hide.startReplicationManager();
  await rm.waitFor(/awaiting initial backup/, {timeout: 120_000, what: 'the readiness gate'});
  await eventually('the first backup', () => hide.backedUp(), {timeout: 90_000});
  const warning = await eventually("the sidecar's /status to say why", async () =>
    (await hide.sidecarStatus()).upstream?.readiness_warning, {timeout: 30_000});
  assert.match(warning, /proxy_mode = "hide"/);
  assert.match(warning, /v4\.\.v6/);
  assert.equal(sidecarEventsWith(hide.procs, 'the replication-manager will not become ready').length, 1, 'logged once');
  // Three of its backup checks (every 10 s) after the first upload: still not ready.
  await sleep(35_000);
  assert.equal((await rmGet(hide, '/keepalive')).status, 0, '/keepalive does not answer');
  assert.equal((await rmGet(hide, '/')).status, 0, '/ does not answer');
  assert.deepEqual(rm.matching(/initial backup confirmed/), []);
  assert.doesNotMatch((await hide.proxyPage()).body, /litestream_replica_progress/);
  assert.ok(rm.running, 'it runs, unready');
  // The clamping sidecar beside it, where this run has the main deployment (a shard may not), says nothing of the kind.
  if (selected.main) assert.equal((await t.sidecarStatus()).upstream.readiness_warning ?? null, null);
  // Started again, now that the replication-manager answers its probe, the sidecar knows before it serves: it
  // refuses to start, with why, and exits as on a config error (78: systemd's RestartPreventExitStatus).
  await hide.stopSidecar();
  const refused = await hide.startSidecar().then(() => null, e => e);
  assert.match(refused?.message ?? 'it started', /exited \(78\)/);
  const stopped = sidecarEventsWith(hide.procs, 'stopped with an error');
  assert.equal(stopped.length, 1, 'the second run refused');
  assert.match(field(stopped[0], 'error'), /^refusing to start: litestream\.proxy_mode = "hide" .* serves protocols v4\.\.v6/);
  assert.ok(rm.running, 'the replication-manager is left as it was');
  ctx.diagnostic(warning);
  await hide.close();
  untrack(hide);
}, {timeout: 300_000});

scenario('11. a stock litestream: restore drills (litestream 0.5) prove the backups, the sidecar purges only below what they proved, and the clamped gauge opens the readiness gate', async ctx => {
  // Zero runs the real litestream 0.3.13 to back up (no gauge) and the real 0.5.17 to restore; the sidecar's drills
  // run 0.5 too (lib/scenarios.mjs).
  const v5 = process.env.LITESTREAM_V5_BIN;
  await stockLitestream(ctx, {track, untrack, options: {drillLitestream: v5, restoreWith: '0.5'},
    restore: {env: 'ZERO_LITESTREAM_EXECUTABLE_V5', bin: v5, line: RESTORED_WITH_V5}});
}, {timeout: 300_000});

scenario("12. two sidecars behind one health-checked address (haproxy): a view-syncer restoring through the purger keeps its rows across a takeover and that sidecar's shutdown, subscribes through the other and catches up with every row", async ctx => {
  await pairTakeover(ctx, {track, untrack});
}, {timeout: 420_000});

scenario("13. address topology: a discover-mode view-syncer finds the sidecar through ownerAddress, gets the status Zero's change-streamer gives, restores and streams", async ctx => {
  // Zero 1.10 still writes ZERO_CHANGE_STREAMER_ADDRESS as ownerAddress (deprecated, honoured): here the sidecar's,
  // which the sidecar verifies (`discovery.mode = "verify"`).
  const addr = new Topology('addr', {});
  track(addr);
  const clientLog = [];
  try {
    await addr.prepare();
    await addr.startSidecar();
    const rm = addr.startReplicationManager();
    await rm.waitFor(new RegExp(`assumed ownership at ${literally(addr.sidecarAddress)}`), {timeout: 180_000});
    assert.equal(await addr.ownerAddress(), addr.sidecarAddress);
    await eventually('the sidecar to verify its registration',
      () => sidecarEventsWith(addr.procs, 'registered as the change-streamer').length > 0, {timeout: 20_000});
    const {replicaVersion} = await addr.replicationState();

    // The v6 snapshot status from the sidecar and from Zero's own change-streamer, which confirms it on its next
    // backup check (every 10 s). Nothing is written upstream meanwhile, so both see one change log; and the clamped
    // gauge shows Zero the change log's oldest watermark, which Zero 1.10 answers as minWatermark, as the sidecar does.
    const [ours, zeros] = await snapshotStatuses(addr, clientLog,
      {sidecarTask: 'interop110-compare-sidecar', zeroTask: 'interop110-compare-zero'});
    assert.deepEqual(Object.keys(ours[1]), ['tag', 'backupURL', 'replicaVersion', 'minWatermark', 'replicaSize']);
    const {replicaSize, ...rest} = ours[1];
    assert.ok(Number.isSafeInteger(replicaSize) && replicaSize > 0, `replicaSize ${replicaSize}`);
    assert.deepEqual(['status', rest], zeros, "the sidecar's status is the one Zero's change-streamer gives, and replicaSize");
    assert.equal(rest.replicaVersion, replicaVersion);

    // A view-syncer with ZERO_CHANGE_STREAMER_MODE=discover and no replica.
    const cfg = await addr.viewSyncer('vs-discover');
    assert.ok(!existsSync(cfg.replica), 'the view-syncer starts with no replica');
    const vs = await addr.startViewSyncer('vs-discover');
    const accepted = await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 120_000});
    const status = trailingJSON(accepted);
    assert.equal(status.backupURL, addr.backupURL);
    assert.equal(status.replicaVersion, replicaVersion);
    assert.ok(vs.matching(new RegExp(`connecting to change-streamer@ws://${literally(addr.sidecarAddress)}/replication/v6/snapshot`)).length >= 1,
      'it found the sidecar through ownerAddress');
    assert.equal(vs.matching(/\[litestream-gauge \d+\] argv: \["restore"/).length, 1, 'one restore');
    await vs.waitFor(RESTORED_WITH_V5, {timeout: 10_000, what: "litestream 0.5's v0.3 restore"});
    const subscribedTo = `connection to ws://${addr.sidecarAddress}/replication/v6/changes`;
    await vs.waitFor(new RegExp(`${literally(subscribedTo)}\\?\\S*taskID=${cfg.taskID}\\S* established`),
      {timeout: 90_000, what: 'its v6 subscription through the sidecar'});
    await eventually("its subscription to end its reservation",
      () => sidecarEventsWith(addr.procs, 'reservation ended by its subscription', {task_id: cfg.taskID}).length === 1);

    const w = await addr.insert([[20, 'twenty', 20], [21, 'twenty-one', 21]]);
    await eventually('the rows to reach the view-syncer', () => (addr.tryReplicaItems(cfg.replica)?.stateVersion ?? '') >= w,
      {timeout: 60_000});
    assert.deepEqual(addr.replicaItems(cfg.replica).rows, await addr.upstreamItems());
    assert.deepEqual(vs.matching(SUBSCRIPTION_REFUSED), []);
    // The replication-manager's own backup replicator streams from its change-streamer directly, never through the
    // address it advertises.
    assert.deepEqual(sidecarEventsWith(addr.procs, 'subscribed', {mode: 'backup'}), [], 'no backup-mode subscriber through the sidecar');
    await addr.waitBackedUp(w);
    assert.equal(await addr.ownerAddress(), addr.sidecarAddress, 'the sidecar never rewrote what Zero wrote');
    await assertLoopbackOnly({'view-syncer sync port': cfg.ports.sync, sidecar: addr.ports.sidecar});
    ctx.diagnostic(`status ${JSON.stringify(ours[1])}`);
  } catch (e) {
    process.stderr.write(`\n===== log of Zero's client in scenario 13 =====\n${clientLog.join('\n')}\n`);
    throw e;
  }
  await addr.close();
  untrack(addr);
}, {timeout: 300_000});
