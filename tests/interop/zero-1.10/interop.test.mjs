// End-to-end interop tests: the sidecar beside real Zero 1.10.0 processes, built from rocicorp/mono at 23da5f1c
// (docs/deploy-zero-1.9.md, "Zero 1.10"). Run by scripts/interop.sh 1.10 under Node 22: PostgreSQL from
// scripts/with-postgres.sh, the sidecar from SIDECAR_BIN, the real litestream 0.3.13 (LITESTREAM_BIN, through
// lib/litestream-gauge.mjs) that the replication-manager backs up with, and the real litestream 0.5.17
// (LITESTREAM_V5_BIN, through lib/litestream-v5.sh) that view-syncers restore that v0.3 backup with, as 1.10 does by
// default (ZERO_LITESTREAM_RESTORE_USING_V5).
//
// The main deployment is the URI topology (docs/deploy-zero-1.9.md) on an S3 destination (moto), with the sidecar's
// default `proxy_mode` ("clamp"); it starts from nothing, so its replication-manager runs an initial sync and waits
// behind its readiness gate for a first backup. Its scenarios run in order, each relying on what the earlier ones
// left; the last ones start deployments of their own. What the scenarios share with the 1.9 suite's is in
// lib/suite.mjs, lib/topology.mjs and lib/proxy-watch.mjs.
import {after, before} from 'node:test';
import assert from 'node:assert/strict';
import {existsSync, readFileSync} from 'node:fs';
import {setTimeout as sleep} from 'node:timers/promises';
import {cmdline, treePids} from '../lib/procs.mjs';
import {field, httpGet, reservationTimeline, sidecarEventsWith} from '../lib/util.mjs';
import {CDC, CLEANUP_DELAY_MS, RECONNECT_GRACE_MS, Topology, ZERO_CLI, eventually, progressSamples} from '../lib/topology.mjs';
import {RawSubscriber, changesQuery} from '../lib/clients.mjs';
import {ZERO_READ, assertProxyNeverAboveLog, watchProxy} from '../lib/proxy-watch.mjs';
import {
  SUBSCRIPTION_REFUSED, Suite, assertLoopbackOnly, assertTelemetryOff, keepWriting, literally, logLines as logLinesOf,
  sampleEvery, trailingJSON, zeroCleanupHarmless,
} from '../lib/suite.mjs';

const t = new Topology('main', {destination: 's3'});
t.discovery = 'owner';
const suite = new Suite([t]);
const scenario = (...args) => suite.scenario(...args);
const events = (message, fields = {}, topo = t) => sidecarEventsWith(topo.procs, message, fields);
const logLines = (name, pattern, topo = t) => logLinesOf(topo, name, pattern);
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

before(async () => {
  try {
    await t.prepare();
    await t.startSidecar();
    mainWatch = watchProxy(t);
    rmStartedAt = Date.now();
    t.startReplicationManager();
    keepalive = sampleKeepalive(t);
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

const VS = 'vs1';

scenario('2. a view-syncer reserves at the sidecar, restores the v0.3 backup with litestream 0.5 and streams', async () => {
  const uri = `ws://${t.sidecarAddress}/`;
  const cfg = await t.viewSyncer(VS, {uri});
  assert.ok(!existsSync(cfg.replica), 'the view-syncer starts with no replica');
  const vs = await t.startViewSyncer(VS);
  const accepted = await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 120_000});
  const status = trailingJSON(accepted);
  assert.equal(status.backupURL, t.backupURL);
  assert.equal(status.replicaVersion, (await t.replicationState()).replicaVersion);
  assert.ok(status.replicaSize > 0, accepted);
  assert.ok(vs.matching(new RegExp(`connecting to change-streamer@ws://${literally(t.sidecarAddress)}/replication/v6/snapshot`)).length >= 1);
  // The restore ran litestream 0.5 (ZERO_LITESTREAM_EXECUTABLE_V5), which read the v0.3 layout.
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
