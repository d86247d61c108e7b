// The litestream gauge exporter (litestream-gauge.mjs) on its own, beside the real litestream 0.3.13 and a small
// SQLite replica in Zero's shape: its page, its gauge never ahead of what a restore of the destination gives, its
// restore knobs, its pass-through and its config rewriting. Run by scripts/interop.sh before the Zero 0.20 suite
// (LITESTREAM_BIN; INTEROP_ZERO for zero-sqlite3), in about 20 s.
import {after, before, test} from 'node:test';
import assert from 'node:assert/strict';
import {spawn} from 'node:child_process';
import {existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {dirname, join} from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';
import {setTimeout as sleep} from 'node:timers/promises';
import {litestreamBin, parseConfig, rewriteConfig, run} from './litestream.mjs';
import {eventually, freePort, httpGet, progressSamples} from './util.mjs';
import {ZERO_DIR, deps} from './zero.mjs';

const {Database} = deps;
const GAUGE = join(dirname(fileURLToPath(import.meta.url)), 'litestream-gauge.mjs');
const ZERO_CONFIG = join(ZERO_DIR, 'node_modules/@rocicorp/zero/out/zero-cache/src/services/litestream/config.yml');

const dir = mkdtempSync(join(tmpdir(), 'litestream-gauge-test-'));
const db = join(dir, 'replica.db');
const backup = join(dir, 'backup');
const backupURL = pathToFileURL(backup).toString();
const gaugeLog = join(dir, 'gauge.jsonl');
const children = [];
let port;
let exporter;

/** Sets the replica's watermark, as Zero's replicator commits one. */
function setWatermark(w) {
  const conn = new Database(db);
  try {
    conn.pragma('journal_mode = wal');
    conn.exec('CREATE TABLE IF NOT EXISTS "_zero.replicationState" ("stateVersion" TEXT)');
    conn.exec('DELETE FROM "_zero.replicationState"');
    conn.prepare('INSERT INTO "_zero.replicationState" VALUES (?)').run(w);
  } finally {
    conn.close();
  }
}

/** Runs the exporter with `args`: the child and its output so far. */
function start(args, env = {}) {
  const child = spawn(process.execPath, [GAUGE, ...args], {
    env: {...process.env, LITESTREAM_CONFIG: join(dir, 'litestream.yml'), ...env},
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const proc = {child, out: ''};
  child.stdout.on('data', c => (proc.out += c));
  child.stderr.on('data', c => (proc.out += c));
  proc.exited = new Promise(resolve => child.on('exit', (code, signal) => resolve({code, signal})));
  children.push(proc);
  return proc;
}

async function gauge() {
  const page = (await httpGet(`http://127.0.0.1:${port}/metrics`, {timeout: 2000})).body;
  return {page, samples: progressSamples(page)};
}

/** The newest object of the destination: its modification time in whole seconds. */
function newestObjectSecs() {
  let newest = 0;
  const walk = d => {
    for (const e of readdirSync(d, {withFileTypes: true})) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else newest = Math.max(newest, statSync(p).mtimeMs);
    }
  };
  walk(backup);
  return Math.floor(newest / 1000);
}

before(() => {
  litestreamBin();
});

after(async () => {
  // SIGTERM first: the exporter stops the litestream it runs (which would otherwise hold this process's pipes open).
  const running = children.filter(p => p.child.exitCode === null && p.child.signalCode === null);
  for (const p of running) p.child.kill('SIGTERM');
  await Promise.race([Promise.all(running.map(p => p.exited)), sleep(10_000)]);
  for (const p of running) p.child.kill('SIGKILL');
  rmSync(dir, {recursive: true, force: true});
});

test('replicate: no sample before the first upload, then the real page with the gauge, never after an object', async () => {
  port = await freePort();
  setWatermark('00a');
  writeFileSync(join(dir, 'litestream.yml'),
    `dbs:\n  - path: ${db}\n    watermark-table: _zero.replicationState\n    replicas:\n` +
    `      - url: ${backupURL}\n        sync-interval: 1s\naddr: 127.0.0.1:${port}\n`);
  exporter = start(['replicate'], {
    INTEROP_LITESTREAM_FIRST_UPLOAD_DELAY_MS: '1000',
    INTEROP_LITESTREAM_CHECK_INTERVAL_MS: '300',
    INTEROP_LITESTREAM_GAUGE_LOG: gaugeLog,
  });
  await eventually('the exporter to serve its page', async () => (await gauge()).page === '', {timeout: 10_000});
  assert.equal(existsSync(backup), false, 'nothing uploaded while the first upload is held back');
  const first = await eventually('the gauge to show 00a', async () => {
    const g = await gauge();
    return g.samples.length > 0 && g;
  }, {timeout: 20_000});
  assert.deepEqual(first.samples.map(s => [s.db, s.name, s.watermark]), [[db, 'file', '00a']]);
  assert.ok(first.samples[0].value <= newestObjectSecs(), `${first.samples[0].value} after the newest object`);
  // The real litestream's page, verbatim, before the gauge.
  assert.match(first.page, /^litestream_db_size\{db="[^"]+"\} \d+$/m);
  assert.match(first.page, /^process_start_time_seconds /m);
  assert.match(first.page, /# HELP litestream_replica_progress The last replicated watermark and time of replication\n# TYPE litestream_replica_progress gauge\nlitestream_replica_progress\{/);
  assert.match(exporter.out, /holding the first upload back for 1000 ms/);

  setWatermark('00b');
  const second = await eventually('the gauge to show 00b', async () => {
    const g = await gauge();
    return g.samples[0]?.watermark === '00b' && g;
  }, {timeout: 20_000});
  assert.ok(second.samples[0].value >= first.samples[0].value);
  assert.ok(second.samples[0].value <= newestObjectSecs());
});

test('restore: the fork-only flags dropped; a delayed restore appears only once its delay is over', async () => {
  const target = join(dir, 'vs', 'replica.db');
  writeFileSync(join(dir, 'restore.yml'),
    `dbs:\n  - path: ${target}\n    replicas:\n      - url: ${backupURL}\n`);
  const env = {LITESTREAM_CONFIG: join(dir, 'restore.yml'), INTEROP_LITESTREAM_RESTORE_DELAY_MS: '1500'};
  const args = ['restore', '-if-db-not-exists', '-if-replica-exists', '-parallelism', '4',
    '-multipart-concurrency', '48', '-multipart-size', '16777216', target];
  const slow = start(args, env);
  await eventually('the backup taken', () => /took the backup at watermark=00b; finishing in 1500 ms/.test(slow.out),
    {timeout: 10_000, interval: 50});
  assert.equal(existsSync(target), false, 'not in place before the delay is over');
  assert.deepEqual(await slow.exited, {code: 0, signal: null});
  assert.match(slow.out, /restore: without the fork-only flags -multipart-concurrency 48 -multipart-size 16777216/);
  assert.match(slow.out, /restored \S+replica\.db from file:/);
  const conn = new Database(target, {readonly: true});
  assert.equal(conn.prepare('SELECT "stateVersion" FROM "_zero.replicationState"').pluck().get(), '00b');
  conn.close();
  assert.deepEqual(readdirSync(dirname(target)).filter(n => n !== 'replica.db' && !/^replica\.db-(wal|shm)$/.test(n)), [],
    'no scratch file left beside it');

  // Again: the replica exists, so litestream leaves it alone.
  const again = start(args, env);
  assert.deepEqual(await again.exited, {code: 0, signal: null});
  assert.match(again.out, /database already exists, skipping/);
  assert.match(again.out, /restore: \S+ exists; nothing to do/);
});

test('the gauge stays put when the destination lost an upload (a restore gives less), and moves on once it is whole', async () => {
  const wal = join(backup, 'generations', readdirSync(join(backup, 'generations'))[0], 'wal');
  const segments = () => readdirSync(wal).sort();
  const before = segments();
  // 00b's upload goes missing: a restore ends where the chain breaks, below 00b, without an error.
  rmSync(join(wal, before.at(-1)));
  setWatermark('00c');
  await eventually('litestream to upload 00c', () => segments().length === before.length, {timeout: 20_000});
  await sleep(1_500); // several checks
  assert.equal((await gauge()).samples[0].watermark, '00b', 'the gauge does not claim 00c');
  const copy = join(dir, 'lost.db');
  const r = await run(litestreamBin(), ['restore', '-o', copy, backupURL]);
  assert.equal(r.code, 0, 'litestream restores what is left without complaint');
  const conn = new Database(copy, {readonly: true});
  assert.equal(conn.prepare('SELECT "stateVersion" FROM "_zero.replicationState"').pluck().get(), '00a');
  conn.close();

  // A new generation (litestream's local state removed while it is stopped) is whole again; the gauge follows it.
  exporter.child.kill('SIGTERM');
  await exporter.exited;
  rmSync(join(dir, '.replica.db-litestream'), {recursive: true, force: true});
  exporter = start(['replicate'], {INTEROP_LITESTREAM_CHECK_INTERVAL_MS: '300', INTEROP_LITESTREAM_GAUGE_LOG: gaugeLog});
  setWatermark('00d');
  await eventually('the gauge to show 00d', async () => (await gauge()).samples[0]?.watermark === '00d',
    {timeout: 30_000});
  const served = readFileSync(gaugeLog, 'utf8').split('\n').filter(Boolean).map(l => JSON.parse(l).watermark);
  assert.deepEqual(served.filter(w => w !== '00c'), served, `never 00c: ${served}`);
  exporter.child.kill('SIGTERM');
  await exporter.exited;
});

test('other commands: the real litestream with the same arguments, output and status', async () => {
  const version = start(['version']);
  assert.deepEqual(await version.exited, {code: 0, signal: null});
  assert.match(version.out, /^v0\.3\.13$/m);
  const wal = start(['wal', '-config', join(dir, 'litestream.yml'), db]);
  assert.deepEqual(await wal.exited, {code: 0, signal: null});
  const real = await run(litestreamBin(), ['wal', '-config', join(dir, 'litestream.yml'), db]);
  assert.ok(wal.out.includes(real.stdout), `${wal.out}\n---\n${real.stdout}`);
  const bad = start(['restore', '-no-such-flag', db]);
  assert.notEqual((await bad.exited).code, 0);
});

test("Zero's config rewritten: addr moved, and S3 settings added only where the config has none", () => {
  const zero = readFileSync(ZERO_CONFIG, 'utf8').replace(/\$\{ZERO_LITESTREAM_BACKUP_URL\}/, 's3://bucket/replica')
    .replace(/\$\{ZERO_REPLICA_FILE\}/, '/r/replica.db').replace(/\$\{[A-Z_]+\}/g, '');
  const s3 = {endpoint: 'http://127.0.0.1:9', region: 'us-east-1'};
  const out = rewriteConfig(zero, {addr: '127.0.0.1:1234', s3});
  assert.match(out, /^addr: 127\.0\.0\.1:1234$/m);
  assert.match(out, /^( +)- url: s3:\/\/bucket\/replica\n\1  endpoint: http:\/\/127\.0\.0\.1:9\n\1  region: us-east-1\n\1  force-path-style: true$/m);
  assert.equal(out.match(/endpoint:/g).length, 1);
  assert.deepEqual(parseConfig(out), {dbPath: '/r/replica.db', replicaURL: 's3://bucket/replica', name: 's3', addr: '127.0.0.1:1234'});
  // A config with an endpoint of its own (Zero 1.9's ZERO_LITESTREAM_ENDPOINT) keeps it.
  const own = out.replace('http://127.0.0.1:9', 'http://127.0.0.1:8');
  assert.equal(rewriteConfig(own, {s3}), own);
  // file:// replicas get nothing.
  const file = zero.replace('s3://bucket/replica', 'file:///b');
  assert.equal(rewriteConfig(file, {s3}), file);
});
