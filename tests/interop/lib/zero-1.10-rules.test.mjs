// The model of Zero 1.10's backup, readiness, status and purge rules (lib/zero-1.10-rules.mjs) on its own: each
// rule against cases worked out from the tagged source, so that a model that drifted from it fails here before the
// 1.9 suite's scenario 11 trusts it. No processes and no I/O; run by scripts/interop.sh before the 1.9 suite (and by
// `node --test tests/interop/lib/zero-1.10-rules.test.mjs` anywhere).
import {test} from 'node:test';
import assert from 'node:assert/strict';
import {
  BACKUP_VERIFICATION_SLACK_MS, BackupMonitor, BackupPoller, CHECK_INTERVAL_MS, CLEANUP_DELAY_MS,
  INITIAL_BACKUP_GRACE_MS_PER_UNIT, PgPurger, WEDGED_SHUTDOWN_GRACE_MS, cleanupFloor, confirmReservation,
  rowsPurgedBy, waitsForBackupBeforeServing,
} from './zero-1.10-rules.mjs';

const T0 = Date.UTC(2026, 0, 1);
const at = s => T0 + s * 1000;
/** A page's progress sample: watermark `w`, claimed at `s` seconds after T0. */
const sample = (w, s) => ({db: '/replica.db', name: 's3', watermark: w, value: at(s) / 1000});
/** A destination whose newest object was uploaded at `s` seconds after T0. */
const upload = s => async () => at(s);
const unlisted = async () => {
  throw new Error('no snapshots or WAL segments listed');
};

test('the constants are those of the tag', () => {
  assert.equal(CHECK_INTERVAL_MS, 10_000);
  assert.equal(BACKUP_VERIFICATION_SLACK_MS, 60_000);
  assert.equal(WEDGED_SHUTDOWN_GRACE_MS, 900_000);
  assert.equal(CLEANUP_DELAY_MS, 30_000);
  assert.equal(INITIAL_BACKUP_GRACE_MS_PER_UNIT, 3_600_000);
});

test('a claim is published once the destination shows an upload at or after it, less the slack', async () => {
  const p = new BackupPoller({startedAt: at(0)});
  // Nothing on the page: nothing recorded or published.
  assert.deepEqual(await p.check({now: at(10), samples: [], verify: upload(5)}),
    {recorded: [], outcome: {kind: 'none'}, deadline: null});
  // A claim newer than the check's clock waits for the clock (maxBackupBefore(now)).
  let r = await p.check({now: at(20), samples: [sample('0a', 25)], verify: upload(25)});
  assert.deepEqual(r.recorded, [{watermark: '0a', timeMs: at(25)}]);
  assert.deepEqual(r.outcome, {kind: 'none'});
  // Claimed at 25, the newest upload at 25: published, and forgotten.
  r = await p.check({now: at(30), samples: [sample('0a', 25)], verify: upload(25)});
  assert.deepEqual(r.recorded, []);
  assert.deepEqual(r.outcome, {kind: 'published', watermark: '0a', backupTimeMs: at(25)});
  assert.equal(p.lastWatermark, '0a');
  assert.equal(p.recorded.size, 0);
  // The same watermark again, at a newer time: not recorded again (only watermarks above the last published).
  r = await p.check({now: at(40), samples: [sample('0a', 38)], verify: upload(38)});
  assert.deepEqual(r.recorded, []);
  assert.deepEqual(r.outcome, {kind: 'none'});
  // Nor one below it.
  assert.deepEqual(p.record([sample('09', 39)]), []);
});

test('a claim up to the slack after the newest upload is trusted; one past it is stale, then wedged', async () => {
  const p = new BackupPoller({startedAt: at(0)});
  let verifications = 0;
  const verify = async () => {
    verifications++;
    return at(100);
  };
  // Claimed 60 s after the newest upload: still within the slack.
  let r = await p.check({now: at(200), samples: [sample('0b', 160)], verify});
  assert.deepEqual(r.outcome, {kind: 'published', watermark: '0b', backupTimeMs: at(160)});
  assert.equal(verifications, 1);
  // Claimed 61 s after it: the cached upload does not confirm it, a new listing finds nothing newer: stale.
  r = await p.check({now: at(300), samples: [sample('0c', 161)], verify});
  assert.equal(verifications, 2);
  assert.deepEqual(r.outcome, {kind: 'stale', watermark: '0c', claimedMs: at(161), lastUploadMs: at(100), staleForMs: 0});
  r = await p.check({now: at(300) + WEDGED_SHUTDOWN_GRACE_MS - 1, samples: [], verify});
  assert.equal(r.outcome.kind, 'stale');
  assert.equal(r.outcome.staleForMs, WEDGED_SHUTDOWN_GRACE_MS - 1);
  r = await p.check({now: at(300) + WEDGED_SHUTDOWN_GRACE_MS, samples: [], verify});
  assert.equal(r.outcome.kind, 'wedged');
  assert.equal(p.failed.kind, 'wedged');
  // A poller that failed publishes nothing more (its stream ended; the process exits).
  r = await p.check({now: at(300) + WEDGED_SHUTDOWN_GRACE_MS + 1, samples: [sample('0d', 1)], verify: upload(10_000)});
  assert.equal(r.outcome.kind, 'wedged');
  assert.deepEqual(r.recorded, []);
});

test('an upload that catches up resets the stale clock', async () => {
  const p = new BackupPoller({startedAt: at(0)});
  let newest = at(100);
  const verify = async () => newest;
  assert.equal((await p.check({now: at(300), samples: [sample('0c', 200)], verify})).outcome.kind, 'stale');
  newest = at(200);
  assert.deepEqual((await p.check({now: at(310), samples: [], verify})).outcome,
    {kind: 'published', watermark: '0c', backupTimeMs: at(200)});
  assert.equal(p.staleSince, null);
});

test('a listing that fails publishes nothing and starts no stale clock', async () => {
  const p = new BackupPoller({startedAt: at(0)});
  const r = await p.check({now: at(30), samples: [sample('0a', 20)], verify: unlisted});
  assert.equal(r.outcome.kind, 'verification-failed');
  assert.equal(p.staleSince, null);
  assert.equal(p.lastWatermark, '');
  assert.ok(p.recorded.has('0a'), 'kept for the next check');
  assert.equal((await p.check({now: at(40), samples: null, verify: upload(20)})).outcome.kind, 'published',
    'published at the next check, even one whose page could not be read');
});

test('the newest claim a verified upload covers is published, and newer ones wait', async () => {
  const p = new BackupPoller({startedAt: at(0)});
  const r = await p.check({now: at(400), samples: [sample('0a', 100), sample('0b', 200), sample('0c', 300)],
    verify: upload(150)});
  // 0c (300) is past 150 + 60: it stays; 0b (200) is within.
  assert.deepEqual(r.outcome, {kind: 'published', watermark: '0b', backupTimeMs: at(200)});
  assert.deepEqual([...p.recorded.keys()], ['0c']);
});

test('no backup within the grace after start shuts the process down, scaled by the replica size', async () => {
  const p = new BackupPoller({startedAt: at(0)});
  const hour = INITIAL_BACKUP_GRACE_MS_PER_UNIT / 1000;
  assert.equal((await p.check({now: at(hour) - 1, samples: [], verify: unlisted})).deadline, null);
  // 60 GiB of replica: two hours.
  assert.equal((await p.check({now: at(hour), samples: [], verify: unlisted, replicaBytes: 60 * 1024 ** 3})).deadline, null);
  assert.equal((await p.check({now: at(hour), samples: [], verify: unlisted})).deadline.kind, 'no-initial-backup');
  // A backup that is there by then satisfies it.
  const q = new BackupPoller({startedAt: at(0)});
  assert.equal((await q.check({now: at(hour), samples: [], verify: upload(5)})).deadline, null);
  assert.equal(q.lastVerifiedUpload, at(5));
});

test('readiness: after an initial sync, the first watermark opens the gate; later ones only if they advance', () => {
  assert.equal(waitsForBackupBeforeServing({initialSync: true}), true);
  assert.equal(waitsForBackupBeforeServing({initialSync: false}), false, 'a legacy replica restored from its backup');
  assert.equal(waitsForBackupBeforeServing({initialSync: false, backupPath: '1722', restoredBackupPath: null}), true,
    'a v5 backup to a new path');
  const m = new BackupMonitor({waitForBackupBeforeServing: true, startupStateVersion: '0m'});
  assert.equal(m.ready, false);
  // Zero 1.10.0 (23da5f1c): a first watermark below the replica opens the gate; #6465's pin would not.
  assert.equal(m.receive('0k'), true);
  assert.equal(m.ready, true);
  assert.equal(m.readyAtCanary2, true);
  assert.equal(m.readyWithPin, false);
  assert.equal(m.backupWatermark, '0k', 'it is the backup watermark for cleanup and reservations');
  assert.equal(m.receive('0m'), false, 'once');
  assert.equal(m.readyWithPin, true, "#6465's gate opens on the first that reaches the start-up stateVersion");
  // Watermarks that do not advance are ignored (rocicorp/mono#6391).
  assert.equal(m.receive('0l'), false);
  assert.equal(m.backupWatermark, '0m');
  // A proxy that hides the gauge: nothing is ever published, so the gate never opens.
  const hidden = new BackupMonitor({waitForBackupBeforeServing: true, startupStateVersion: '0m'});
  assert.equal(hidden.ready || hidden.readyAtCanary2 || hidden.readyWithPin, false);
  assert.equal(new BackupMonitor({waitForBackupBeforeServing: false, startupStateVersion: '0m'}).ready, true);
});

test('a reservation is confirmed only while the change log starts at or below the backup, with minWatermark B', () => {
  const base = {replicaVersion: '01', backupURL: 's3://b/r'};
  assert.equal(confirmReservation({...base, backupWatermark: undefined, changeLogMin: '01'}), null);
  assert.deepEqual(confirmReservation({...base, backupWatermark: '05', changeLogMin: '03'}),
    {confirmed: true, status: {tag: 'status', backupURL: 's3://b/r', replicaVersion: '01', minWatermark: '05'}});
  assert.equal(confirmReservation({...base, backupWatermark: '05', changeLogMin: '05'}).confirmed, true);
  assert.deepEqual(confirmReservation({...base, backupWatermark: '05', changeLogMin: '06'}),
    {confirmed: false, changeLogMin: '06', backupWatermark: '05'});
  assert.equal(confirmReservation({...base, backupWatermark: '01', changeLogMin: null}).confirmed, true,
    'an empty log counts as starting at the replica version');
  assert.equal(confirmReservation({...base, backupWatermark: '00', changeLogMin: null}).confirmed, false);
});

test('the purge floor is the lowest of the backup, the acks and the reservations; the newest row always stays', () => {
  assert.equal(cleanupFloor({backupWatermark: '0c'}), '0c');
  assert.equal(cleanupFloor({backupWatermark: '0c', acks: ['0d', '0b'], reserved: ['0e']}), '0b');
  assert.equal(cleanupFloor({backupWatermark: '0c', acks: ['0d'], reserved: ['0a']}), '0a');
  const log = [{watermark: '0a', rows: 3}, {watermark: '0b', rows: 2}, {watermark: '0c', rows: 4}];
  assert.equal(rowsPurgedBy('0b', log), 3);
  assert.equal(rowsPurgedBy('0c', log), 5);
  assert.equal(rowsPurgedBy('0z', log), 5, 'the newest transaction is kept');
  assert.equal(rowsPurgedBy('0a', log), 0);
  assert.equal(rowsPurgedBy('0z', []), 0);
});

test('a purge runs the cleanup delay after a new backup, and again while the floor is behind the backup', () => {
  const p = new PgPurger();
  p.maybeSchedule(at(0), undefined);
  assert.equal(p.dueAt, null, 'no backup, no purge');
  p.maybeSchedule(at(0), '0c');
  assert.equal(p.due(at(29)), false);
  assert.equal(p.due(at(30)), true);
  p.maybeSchedule(at(10), '0d');
  assert.equal(p.dueAt, at(30), 'one at a time');
  // A laggard holds the floor below the backup: the purge goes to the laggard, and another is scheduled.
  assert.deepEqual(p.run(at(30), {backupWatermark: '0d', acks: ['0b']}), {floor: '0b', purges: true});
  assert.equal(p.dueAt, at(60));
  assert.deepEqual(p.run(at(60), {backupWatermark: '0d', acks: ['0b']}), {floor: '0b', purges: false});
  assert.deepEqual(p.run(at(90), {backupWatermark: '0d', acks: ['0e']}), {floor: '0d', purges: true});
  assert.equal(p.dueAt, null, 'caught up with the backup');
  p.maybeSchedule(at(100), '0d');
  assert.equal(p.dueAt, null, 'the same backup schedules nothing');
});

test('fed a clamped page (the log\'s oldest watermark), no purge of the model ever deletes a row', async () => {
  // A random history: rows arrive, a second purger (the sidecar) deletes below backed-up watermarks, and the page
  // shows min(changeLog) with the newest upload's time. The model's purges, run at their times, delete nothing.
  let seed = 42;
  const rand = n => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  const w = i => i.toString(36).padStart(4, '0');
  const log = [{watermark: w(1), rows: 1}];
  let next = 2;
  let uploadedAt = at(0);
  const poller = new BackupPoller({startedAt: at(0)});
  const monitor = new BackupMonitor({waitForBackupBeforeServing: true, startupStateVersion: w(1)});
  const purger = new PgPurger();
  let modelPurges = 0;
  for (let s = 1; s < 2000; s++) {
    const now = at(s);
    if (rand(2) === 0) log.push({watermark: w(next++), rows: 1 + rand(3)});
    if (rand(5) === 0) uploadedAt = now;
    if (rand(20) === 0 && log.length > 2) log.splice(0, 1 + rand(log.length - 1)); // the sidecar purges
    if (s % 10 !== 0) continue;
    const page = [sample(log[0].watermark, uploadedAt / 1000 - T0 / 1000)];
    const {outcome} = await poller.check({now, samples: page, verify: async () => uploadedAt});
    assert.ok(!['stale', 'wedged'].includes(outcome.kind), JSON.stringify(outcome));
    if (outcome.kind === 'published') {
      monitor.receive(outcome.watermark);
      purger.maybeSchedule(now, monitor.backupWatermark);
    }
    if (purger.due(now)) {
      const {floor, purges} = purger.run(now, {backupWatermark: monitor.backupWatermark, acks: [log.at(-1).watermark]});
      if (purges) modelPurges++;
      assert.equal(rowsPurgedBy(floor, log), 0, `the model's purge below ${floor} at +${s} s deletes rows of ${JSON.stringify(log.slice(0, 3))}`);
    }
  }
  assert.ok(monitor.ready, 'the gate opened');
  assert.ok(modelPurges > 5, `the model purged (${modelPurges} times)`);
});

test('fed the real gauge instead, the model does purge rows (the check above can fail)', async () => {
  const log = [{watermark: '0a', rows: 2}, {watermark: '0b', rows: 1}, {watermark: '0c', rows: 1}];
  const poller = new BackupPoller({startedAt: at(0)});
  const purger = new PgPurger();
  const {outcome} = await poller.check({now: at(10), samples: [sample('0c', 5)], verify: upload(5)});
  assert.equal(outcome.kind, 'published');
  purger.maybeSchedule(at(10), outcome.watermark);
  const {floor} = purger.run(at(40), {backupWatermark: outcome.watermark, acks: ['0c']});
  assert.equal(rowsPurgedBy(floor, log), 3);
});
