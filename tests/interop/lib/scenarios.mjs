// Scenarios the Zero 1.9 and 1.10 suites both run, each against the deployments the calling suite made
// (zero-1.9/interop.test.mjs and zero-1.10/interop.test.mjs call them from their own numbered scenarios). What differs
// between the versions comes in as parameters: the view-syncer to use, the row ids to write (each suite keeps its own
// apart), the topology options, and what the litestream a view-syncer restores with logs.
import assert from 'node:assert/strict';
import {existsSync, readFileSync, readdirSync} from 'node:fs';
import {setTimeout as sleep} from 'node:timers/promises';
import {cmdline, environ, treePids} from './procs.mjs';
import {
  field, httpGet, reservationTimeline, sidecarEvents as sidecarEventsOf, sidecarEventsWith,
} from './util.mjs';
import {
  APP_ID, CLEANUP_DELAY_MS, Topology, eventually, progressSamples,
} from './topology.mjs';
import {ZERO_READ} from './proxy-watch.mjs';
import {
  SUBSCRIPTION_REFUSED, assertLoopbackOnly, assertTelemetryOff, clampedPage, keepWriting, literally, logLines,
  sampleEvery, trailingJSON, zeroCleanupHarmless,
} from './suite.mjs';
import {ZERO} from './zero.mjs';

/**
 * The replication-manager restarts: streaming resumes, nothing lost or duplicated. `vs`: a running view-syncer of
 * `t`; rows `first` to `first + 3` are written.
 */
export async function replicationManagerRestarts(t, {vs, first}) {
  const vsConfig = await t.viewSyncer(vs);
  const vsProc = t.procs.get(vs);
  const before = sidecarEventsOf(t.procs).length;
  await t.stopReplicationManager();

  // While it is down, upstream moves on (the replication slot keeps the changes).
  await t.upstream`INSERT INTO item (id, label, big) VALUES (${first}, 'thirty', ${first})`;
  await sleep(1000);
  const rm = t.startReplicationManager();
  // The address it writes as ownerAddress: the sidecar's (the address topology) or its own (the URI topology).
  const owner = t.discovery === 'owner' ? t.rmAddress : t.sidecarAddress;
  await rm.waitFor(new RegExp(`assumed ownership at ${literally(owner)}`), {timeout: 90_000});
  const w30 = await t.stored([first]);
  const w31 = await t.insert([[first + 1, 'thirty-one', first + 1], [first + 2, 'thirty-two', first + 2]]);
  const w33 = await t.insert([[first + 3, 'thirty-three', first + 3]]);
  assert.ok(w30 < w31 && w31 < w33);

  await eventually('the view-syncer to catch up after the restart', () => (t.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= w33,
    {timeout: 90_000});
  const upstream = await t.upstreamItems();
  assert.deepEqual(t.replicaItems(vsConfig.replica).rows, upstream, 'view-syncer replica equals upstream');
  assert.equal(t.replicaItems(vsConfig.replica).stateVersion, w33);
  // Every insert is in the change log once.
  const dup = await t.change.unsafe(
    `SELECT change->'new'->>'id' AS id, count(*)::int AS n FROM ${t.cdc}."changeLog"
      WHERE change->>'tag' = 'insert' GROUP BY 1 HAVING count(*) > 1`);
  assert.deepEqual([...dup], [], 'no insert stored twice');
  await t.waitBackedUp(w33);
  assert.deepEqual(t.replicaItems(t.rmReplica).rows, upstream, 'backup replica equals upstream');

  // The view-syncer kept running and reconnected through the sidecar.
  assert.ok(vsProc.running, 'the view-syncer kept running');
  const since = sidecarEventsOf(t.procs).slice(before);
  assert.ok(since.some(e => e.message === 'subscribed' && field(e, 'task_id') === vsConfig.taskID), 'the view-syncer resubscribed');
  assert.equal(await t.ownerAddress(), owner);
  await zeroCleanupHarmless(t);
}

/**
 * A view-syncer on a permanent volume restarts after purges: it keeps its replica (the status's minWatermark is at
 * or below it) and catches up. `keptLine`: what the litestream it restores with says of a database that exists
 * (null: nothing of its own). Rows `first` and `first + 1` are written.
 */
export async function viewSyncerRestartsAfterPurges(t, {name, first, keptLine}) {
  const vsConfig = await t.viewSyncer(name);
  const {stateVersion: at} = t.replicaItems(vsConfig.replica);
  const minBefore = (await t.changeLogWatermarks())[0];
  assert.ok(minBefore <= at, `the change log still reaches back to the view-syncer (${minBefore} <= ${at})`);
  await t.stopViewSyncer(name);
  const opened = sidecarEventsWith(t.procs, 'reservation opened', {task_id: vsConfig.taskID}).length;

  // Upstream moves on while it is down; then it starts again with the replica it has.
  const w50 = await t.insert([[first, 'fifty', first]]);
  const vs = await t.startViewSyncer(name);
  const accepted = await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 90_000});
  assert.ok(accepted.includes(`and watermark ${at} is compatible`), accepted);
  const status = trailingJSON(accepted);
  assert.ok(status.minWatermark <= at, `minWatermark ${status.minWatermark} <= ${at}`);
  assert.ok(status.minWatermark >= minBefore, 'the status names what the change log still has');
  await vs.waitFor(/restore: \S+ exists; nothing to do/, {timeout: 10_000, what: 'litestream leaving the replica alone'});
  if (keptLine) await vs.waitFor(keptLine, {timeout: 10_000, what: "litestream's own word for it"});
  assert.deepEqual(vs.matching(/Deleting local replica|restored \/|does not match expected replicaVersion|is earlier than minWatermark/), []);

  const w51 = await t.insert([[first + 1, 'fifty-one', first + 1]]);
  await eventually('the view-syncer to catch up', () => (t.tryReplicaItems(vsConfig.replica)?.stateVersion ?? '') >= w51,
    {timeout: 90_000});
  assert.ok(w50 < w51);
  assert.deepEqual(t.replicaItems(vsConfig.replica).rows, await t.upstreamItems());
  assert.equal(sidecarEventsWith(t.procs, 'reservation opened', {task_id: vsConfig.taskID}).length, opened + 1, 'one reservation for the restart');
  assert.deepEqual(vs.matching(SUBSCRIPTION_REFUSED), [], 'no WatermarkTooOld');
  assert.ok(vs.running);
  assertTelemetryOff();
  await assertLoopbackOnly({'view-syncer sync port': vsConfig.ports.sync});
  await zeroCleanupHarmless(t);
}

/**
 * A view-syncer mid-restore across a sidecar SIGKILL and restart catches up without WatermarkTooOld. `t`: a
 * deployment whose view-syncers `others` stream through its sidecar; `name`: the restoring view-syncer (URI
 * topology, its restore held back by the gauge exporter); rows from `first` on are written during it, and
 * `first - 1` after. Returns the last row's watermark, `w`.
 */
export async function restoreAcrossSidecarKill(t, {name, others, first}) {
  // The restarted sidecar may purge once it has been up for the cleanup delay and registered (discovery checks
  // every second) for the reconnect grace plus that delay: with a 5 s grace some 36 s after the restart, 56 s into
  // the restore. The
  // restore lasts 20 s more, with cleanup checked every second and the backups and the other view-syncers' acks
  // past the restore all along: time enough for a sidecar that forgot the reservation to purge past it (it does
  // within a second of its waits), on a busy machine too.
  const KILL_AFTER_MS = 20_000;
  const RESTORE_MS = KILL_AFTER_MS + t.reconnectGraceMs + CLEANUP_DELAY_MS + 20_000;
  const cfg = await t.viewSyncer(name, {uri: `ws://${t.sidecarAddress}/`,
    litestreamEnv: {INTEROP_LITESTREAM_RESTORE_DELAY_MS: String(RESTORE_MS)}});
  assert.ok(!existsSync(cfg.replica), 'the view-syncer starts with no replica');
  const otherTasks = await Promise.all(others.map(async n => (await t.viewSyncer(n)).taskID));
  assert.ok(others.every(n => t.procs.get(n).running), 'the other view-syncers are running');
  const writes = keepWriting(t, first);
  const samplers = [];
  try {
    const vs = await t.startViewSyncer(name);
    // Zero passes litestream's output on only once it has exited: the restore's start is Zero's own line.
    await vs.waitFor(/starting litestream restore/, {timeout: 90_000, what: 'its restore starting'});
    const restoreStarted = Date.now();
    assert.equal(sidecarEventsWith(t.procs, 'reservation opened', {task_id: cfg.taskID}).length, 1, 'the restore runs under a reservation');
    const changeLogMin = sampleEvery(500, async () =>
      (await t.change.unsafe(`SELECT min(watermark) AS min FROM ${t.cdc}."changeLog"`))[0].min);
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
      const rejected = logLines(t, 'replication-manager', /rejecting subscriber at watermark/)
        .map(l => l.slice(l.indexOf('rejecting')));
      const purges = sidecarEventsWith(t.procs, 'change log purged').filter(e => Date.parse(e.timestamp) >= killedAt)
        .map(e => `below ${field(e, 'before')} at ${e.timestamp}`);
      return Object.assign(new Error(`${name} ${vs.running ? 'runs' : `exited (${vs.exitCode ?? vs.exitSignal})`}, ` +
        `restored to ${w0}: ${JSON.stringify(refused)}; Zero: ${JSON.stringify(rejected)}; the restarted sidecar ` +
        `purged ${purges.length} times, first ${purges[0] ?? '-'}, last ${purges.at(-1) ?? '-'}`), {fatal: true});
    };
    const subscribed = await eventually('the restored view-syncer to subscribe through the restarted sidecar', () => {
      const found = sidecarEventsWith(t.procs, 'subscribed', {task_id: cfg.taskID, mode: 'serving'})[0];
      if (!found && !vs.running) throw stuck();
      return found;
    }, {timeout: 60_000});
    await changeLogMin.stop();
    assert.equal(field(subscribed, 'watermark'), w0, 'it subscribed from the watermark it restored');

    // Rows written after the restart, and one more now, reach its replica.
    await writes.stop();
    const sinceRestart = writes.rows.filter(r => r.at > killedAt).map(r => r.id);
    const w = await t.insert([[first - 1, 'ninety-nine', first - 1]]);
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
    await t.stopViewSyncer(name);
    return {w};
  } finally {
    await writes.stop().catch(() => {});
    for (const s of samplers) await s.stop();
  }
}

/**
 * A stock litestream: restore drills prove the backups, the sidecar purges only below what they proved. A fresh
 * deployment of its own (`track`/`untrack` keep the suite's list of deployments). `options`: further Topology options
 * (the drills' litestream); `restore`: the variable naming the litestream a view-syncer restores with, that binary,
 * and a line of its restore's output.
 */
export async function stockLitestream(ctx, {track, untrack, options = {}, restore}) {
  // A fresh deployment in the URI topology of scenario 6 where Zero runs the real litestream 0.3.13 itself
  // (ZERO_LITESTREAM_EXECUTABLE is the binary: no gauge exporter, so litestream's page has no
  // litestream_replica_progress), and the sidecar, with cleanup.requires = "restore", goes by what its restore
  // drills (the same binary, every 2 s) restored and checked. The proxy clamps (the default): Zero's backup monitor
  // is shown a made-up gauge at the change log's oldest watermark (docs/operations.md, "Backups you can restore").
  const startedAt = Date.now();
  const stock = new Topology('stock', {zeroLitestream: 'stock', requires: 'restore', drillInterval: '2s', ...options});
  stock.discovery = 'owner';
  track(stock);
  const ev = (message, fields) => sidecarEventsWith(stock.procs, message, fields);
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
  const writes = keepWriting(stock, 200, 1_000);
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
    const accepted = await vs.waitFor(/Local replica at version \S+ and watermark \S+ is compatible/, {timeout: 90_000});
    assert.ok(vs.matching(new RegExp(`connecting to change-streamer@ws://${literally(stock.sidecarAddress)}/replication/v6/snapshot`))
      .length >= 1, 'it reserved at the sidecar');
    assert.equal(trailingJSON(accepted).backupURL, stock.backupURL);
    assert.equal(vs.matching(/starting litestream restore/).length, 1, 'one restore');
    assert.equal(environ(vs.pid).get(restore.env), restore.bin);
    // (Zero passes the restore's output on once it has exited: litestream's own lines.)
    await vs.waitFor(restore.line, {timeout: 10_000, what: "litestream's restore"});
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
    if (ZERO.readinessGate) {
      // Zero 1.10 after its initial sync: ready only once it read a backed-up watermark, which a stock litestream
      // has none of; the clamped proxy shows one once a drill proved the backup.
      const confirmed = await rm.waitFor(/initial backup confirmed after/, {timeout: 60_000, what: 'its readiness gate'});
      assert.ok(rm.matching(/awaiting initial backup/).length === 1, confirmed);
    }
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
    const purges = () => sidecarEventsOf(stock.procs).filter(e => e.message.startsWith('change log purge') && field(e, 'before'))
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
      logLines(stock, 'replication-manager', ZERO_READ)[0], {timeout: 130_000, interval: 500});
    const zeroReadAt = Date.now();
    const zeroSaw = ZERO_READ.exec(replicated);
    assert.equal(zeroSaw[2], 'file', replicated);
    // Right after the read Zero checks the upload with the stock `litestream snapshots` and `wal`; a check that
    // failed would say so within moments.
    await sleep(3_000);
    await zeroCleanupHarmless(stock, {minReads: 1});
    assert.deepEqual(logLines(stock, 'replication-manager', /unable to fetch metrics|error scheduling cleanup/), [],
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
      assert.deepEqual(logLines(stock, name, /litestream-gauge/), [], `${name} ran no gauge exporter`);
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
  untrack(stock);
}

/** The purger lock's key halves as pg_locks shows them (docs/operations.md, "Two sidecars for one shard"). */
const PURGER_LOCK_CLASS = 0x6c747363; // "ltsc"
function purgerLockObjid(schema) {
  let hash = 0x811c9dc5;
  for (const byte of Buffer.from(schema, 'utf8')) hash = Math.imul(hash ^ byte, 0x01000193) >>> 0;
  return hash;
}

/**
 * Two sidecars behind one health-checked address (haproxy): a view-syncer restoring through the purger keeps its
 * rows across a takeover and that sidecar's shutdown, subscribes through the other and catches up with every row.
 * A fresh deployment of its own (`track`/`untrack`; `options`: further Topology options).
 */
export async function pairTakeover(ctx, {track, untrack, options = {}}) {
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
  const pair = new Topology('pair', {sidecars: 2, ...options});
  pair.discovery = 'owner';
  track(pair);
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
  const writes = keepWriting(pair, 300, 1_000);
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
        [PURGER_LOCK_CLASS, purgerLockObjid(`${APP_ID}_${pair.shardNum}/cdc`)]);
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
  untrack(pair);
}
