// What Zero's replication-manager is shown of the backups through the sidecar's metrics proxy, and what its own
// cleanup does with it, for both suites.
//
// With `litestream.proxy_mode = "clamp"` (the sidecar's default) the proxy page carries one
// `litestream_replica_progress` sample whose watermark is the change log's oldest (`min(watermark)`, the replica
// version while the log is empty), read at every scrape, with the time of the newest object of the destination's
// restorable chain (docs/protocol.md, "Two purgers"). The log has no row below it, so whatever purge Zero schedules
// from it (`DELETE … WHERE watermark < X`, in 0.20 and in 1.9) deletes nothing. `watchProxy` reads the page as Zero
// does, each read followed by a read of the change log, and the assertions below check each served watermark
// against the log as it stood right after; `zeroCleanup` reads Zero's own log lines about it (the same text in 0.20
// and 1.9: services/change-streamer/{backup-monitor,litestream3-backup-monitor,change-streamer-service}.js).
import assert from 'node:assert/strict';
import {setTimeout as sleep} from 'node:timers/promises';
import {progressSamples} from './util.mjs';

/**
 * Reads `topo`'s proxy page every `interval` ms until `stop()`, each read followed by one of the change log's
 * oldest watermark and its replica version: `reads` gets [{at, status, samples, min, replicaVersion}] (`at`:
 * Date.now() as the page was asked for; `samples`: the page's progress samples; `min`: null for an empty log,
 * undefined when the change log could not be read), and `failures` the pages that could not be read (a sidecar
 * restarting), [{at, error}].
 */
export function watchProxy(topo, {interval = 500} = {}) {
  const reads = [];
  const failures = [];
  let stopping = false;
  const done = (async () => {
    while (!stopping) {
      const at = Date.now();
      try {
        const page = await topo.proxyPage();
        // (Before Zero has created the change DB's tables there is nothing to read: undefined.)
        const min = await topo.changeLogMin().catch(() => undefined);
        const [config] = await topo.change.unsafe(`SELECT "replicaVersion" FROM ${topo.cdc}."replicationConfig"`)
          .catch(() => [undefined]);
        reads.push({at, status: page.status, samples: page.status === 200 ? progressSamples(page.body) : [], min,
          replicaVersion: config?.replicaVersion ?? null});
      } catch (e) {
        failures.push({at, error: e.message});
      }
      await sleep(interval);
    }
  })();
  return {reads, failures, stop: async () => {
    stopping = true;
    await done;
  }};
}

/** A watch's reads, briefly, for a failure message: each change of what the page showed. */
export function describeWatch({reads, failures}, since = reads[0]?.at ?? 0) {
  const runs = [];
  for (const r of reads) {
    const shown = r.status !== 200 ? `HTTP ${r.status}` : r.samples.map(s => s.watermark).join('+') || 'no sample';
    const key = `${shown} (log from ${r.min === undefined ? 'unread' : r.min ?? 'empty'})`;
    if (runs.at(-1)?.key === key) runs.at(-1).to = r.at;
    else runs.push({key, from: r.at, to: r.at});
  }
  const s = ms => `+${((ms - since) / 1000).toFixed(1)} s`;
  return runs.map(r => `${r.key} ${s(r.from)}..${s(r.to)}`).join(', ') +
    (failures.length ? `; ${failures.length} failed reads, first ${JSON.stringify(failures[0])}` : '');
}

/**
 * Every page the watch read showed at most one progress sample, and its watermark was at or below the change
 * log's oldest row as read right after (the replica version itself when the log was empty): Zero was never shown a
 * watermark below which the log still had rows. Returns the number of reads with a sample.
 */
export function assertProxyNeverAboveLog(watch, what = 'the proxy') {
  let shown = 0;
  for (const r of watch.reads) {
    if (r.status !== 200) continue;
    assert.ok(r.samples.length <= 1, `${what} showed ${r.samples.length} progress samples at once: ` +
      `${JSON.stringify(r.samples)}`);
    const [sample] = r.samples;
    if (!sample) continue;
    shown++;
    // The sidecar shows no sample while it cannot read the log; a read of ours that failed judges nothing.
    if (r.min === undefined) continue;
    const ok = r.min === null ? sample.watermark === r.replicaVersion : sample.watermark <= r.min;
    assert.ok(ok, `${what} showed watermark ${sample.watermark} while the change log started at ` +
      `${r.min ?? `nothing (replica version ${r.replicaVersion})`} (read at ${new Date(r.at).toISOString()}); ` +
      `every read: ${describeWatch(watch)}`);
  }
  return shown;
}

/**
 * The page showed the sample soon after the first backup: the first read with one came at most `withinMs` after
 * `backupAt` (when litestream's first backup was reported), and every page read from then on carried it. Returns
 * `{first, reads}`: when the first sample was read, and how many reads followed it.
 */
export function assertProxyShowsBackupSoonAfter(watch, backupAt, {withinMs = 10_000, what = 'the proxy'} = {}) {
  const pages = watch.reads.filter(r => r.status === 200);
  const first = pages.find(r => r.samples.length > 0);
  assert.ok(first && first.at <= backupAt + withinMs,
    `${what} showed no progress sample within ${withinMs} ms of the first backup (${new Date(backupAt).toISOString()}); ` +
    `every read: ${describeWatch(watch, backupAt)}`);
  const after = pages.filter(r => r.at >= first.at);
  const without = after.filter(r => r.samples.length !== 1);
  assert.deepEqual(without.map(r => new Date(r.at).toISOString()), [],
    `${what} showed no progress sample after it first did; every read: ${describeWatch(watch, backupAt)}`);
  return {first: first.at, reads: after.length};
}

/** Zero's line for each watermark it takes from the page (0.20 and 1.9). */
export const ZERO_READ = /replicated watermark=(\S+) to (\S*) at (\S+)\./;
/**
 * Zero's line after each purge of its own (0.20: `Purged N changes before W`; 1.9 adds the time it took; 1.10.0:
 * `Purged N PG changes before W`).
 */
export const ZERO_PURGED = /Purged (\d+) (?:PG )?changes before (\S+)/;
/**
 * Zero 1.9's lines for a backup it does not trust: a claim it could not match with an upload (`blocked change-log
 * cleanup … stale`), the shutdown that follows (`is wedged`, an UnrecoverableError), no backup at all.
 */
export const ZERO_DISTRUSTS = /blocked change-log cleanup|wedged|UnrecoverableError|no restorable backup has appeared/;

/**
 * Zero's own cleanup, from its replication-manager's `lines` (every run's): the watermarks it read, the purges it
 * ran, and the lines that show it distrusts the backup.
 */
export function zeroCleanup(lines) {
  const reads = [];
  const purges = [];
  const distrust = [];
  for (const line of lines) {
    const read = ZERO_READ.exec(line);
    if (read) reads.push({watermark: read[1], name: read[2], time: read[3], line});
    const purged = ZERO_PURGED.exec(line);
    if (purged) purges.push({rows: Number(purged[1]), before: purged[2], line});
    if (ZERO_DISTRUSTS.test(line)) distrust.push(line);
  }
  return {reads, purges, distrust};
}

/**
 * Zero's own cleanup beside the sidecar did no harm: every purge it logged deleted 0 rows, every watermark it read
 * from the proxy is at or below the change log's oldest row now (the proxy's reads of the same page, checked against
 * the log as each was served, are `assertProxyNeverAboveLog`'s), and it never distrusted the backup. With
 * `minReads`, Zero also saw a live backup that many times. Returns what it found.
 */
export async function assertZeroCleanupHarmless(topo, lines, {minReads = 0, what = "Zero's replication-manager"} = {}) {
  const found = zeroCleanup(lines);
  const deleted = found.purges.filter(p => p.rows !== 0);
  assert.deepEqual(deleted.map(p => p.line), [], `${what} purged rows of the change log itself`);
  const min = await topo.changeLogMin();
  const [{replicaVersion}] = await topo.change.unsafe(`SELECT "replicaVersion" FROM ${topo.cdc}."replicationConfig"`);
  const above = found.reads.filter(r => (min === null ? r.watermark !== replicaVersion : r.watermark > min));
  assert.deepEqual(above.map(r => r.line), [],
    `${what} read watermarks above the change log's oldest row (${min ?? `none; replica version ${replicaVersion}`})`);
  assert.deepEqual(found.distrust, [], `${what} distrusted the backup the proxy showed`);
  assert.ok(found.reads.length >= minReads,
    `expected ${what} to read a backed-up watermark from the proxy at least ${minReads} time(s); it read ` +
    `${found.reads.length}`);
  return found;
}
