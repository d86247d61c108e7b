#!/usr/bin/env node
// A stand-in for rocicorp's litestream fork (zero@v0.0.9), which cannot be built here. Zero spawns it as its
// litestream executable (ZERO_LITESTREAM_EXECUTABLE) with the same environment and arguments it gives litestream
// (services/litestream/commands.ts at zero/v1.9.0):
//
//   litestream-standin.mjs replicate
//     Every INTEROP_STANDIN_INTERVAL_MS (default 2000) copies the replica (a consistent SQLite backup) to the
//     directory of the file:// replica URL, reads "_zero.replicationState".stateVersion from the copy, and serves
//     on the config's `addr` the fork's gauge for it (docs/protocol.md, "litestream's progress gauge"):
//       litestream_replica_progress{db="<replica path>",name="file",watermark="<stateVersion>"} <epoch seconds>
//     Each upload that carries a new watermark is recorded as an object of the destination: the first as a
//     snapshot, later ones as WAL segments (objects.jsonl beside the copy), with the time it was created.
//     INTEROP_STANDIN_FIRST_UPLOAD_DELAY_MS holds the first upload back that long (a slow initial snapshot).
//   litestream-standin.mjs restore [-if-db-not-exists] [-if-replica-exists] [-parallelism N] [...] <db path>
//     Copies the backup back to <db path>. INTEROP_STANDIN_RESTORE_DELAY_MS makes it that much slower: the backup
//     is copied at once, then held back that long before it appears at <db path> (a restore that delivers an
//     older backup than the destination has by the time it ends).
//   litestream-standin.mjs snapshots [-config PATH] [-replica NAME] <db path | replica URL>
//   litestream-standin.mjs wal [-config PATH] [-replica NAME] <db path | replica URL>
//     List the destination's snapshots / WAL segments as litestream 0.3 does: a header row, then one row per
//     object, columns separated by tabs, the last one the RFC 3339 `created` time (Zero 1.9 verifies backups
//     with these before it purges or hands out a snapshot status).
//
// Like litestream it reads its config from -config or $LITESTREAM_CONFIG (Zero's config.yml format, ${VAR}
// expanded from the environment): the db `path`, the replica `url` and `addr`. Every invocation logs its argv.
import {appendFileSync, copyFileSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync} from 'node:fs';
import {randomBytes} from 'node:crypto';
import {createServer} from 'node:http';
import {dirname, join} from 'node:path';
import {backupDir, goFloat, holdFirstUpload, holdRestore, readConfig, splitAddr} from './standin.mjs';
// @rocicorp/zero-sqlite3 of the Zero version under test (INTEROP_ZERO, which the harness gives Zero's processes).
import {deps} from './zero.mjs';

const {Database} = deps;

/** The destination's object listing, beside the copy. */
const OBJECTS = 'objects.jsonl';

const log = (...args) => console.error(`[litestream-standin ${process.pid}]`, ...args);

async function replicate() {
  const {dbPath, replicaURL, addr} = readConfig();
  const dir = backupDir(replicaURL);
  mkdirSync(dir, {recursive: true});
  const backupFile = join(dir, 'replica.db');
  const interval = Number(process.env.INTEROP_STANDIN_INTERVAL_MS ?? 2000);
  const generation = randomBytes(8).toString('hex');
  let progress = null; // {watermark, time}
  let copies = 0;
  let objects = 0;

  const server = createServer((req, res) => {
    if (req.url !== '/metrics') {
      res.writeHead(404).end('404 page not found\n');
      return;
    }
    const lines = [
      '# HELP litestream_db_size The current size of the real DB',
      '# TYPE litestream_db_size gauge',
      `litestream_db_size{db="${dbPath}"} ${goFloat(existsSync(dbPath) ? statSync(dbPath).size : 0)}`,
    ];
    if (progress) {
      lines.push(
        '# HELP litestream_replica_progress The last replicated watermark and time of replication',
        '# TYPE litestream_replica_progress gauge',
        `litestream_replica_progress{db="${dbPath}",name="file",watermark="${progress.watermark}"} ${goFloat(progress.time)}`,
      );
    }
    lines.push(
      '# HELP litestream_replica_validation_total The number of validations performed',
      '# TYPE litestream_replica_validation_total counter',
      `litestream_replica_validation_total{db="${dbPath}",name="file",status="ok"} ${copies}`,
    );
    res.writeHead(200, {'Content-Type': 'text/plain; version=0.0.4; charset=utf-8'}).end(lines.join('\n') + '\n');
  });
  const [host, port] = splitAddr(addr);
  await new Promise((resolve, reject) => server.once('error', reject).listen(port, host, resolve));
  log(`replicating ${dbPath} to ${dir} every ${interval} ms; metrics on http://${addr}/metrics`);

  let stopping = false;
  const stop = () => {
    stopping = true;
    server.close();
    server.closeAllConnections?.();
    log('stopped');
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);

  await holdFirstUpload(log);
  while (!stopping) {
    try {
      if (existsSync(dbPath)) {
        const tmp = `${backupFile}.tmp-${process.pid}`;
        const db = new Database(dbPath, {readonly: true, fileMustExist: true});
        try {
          await db.backup(tmp);
        } finally {
          db.close();
        }
        const watermark = watermarkOf(tmp);
        renameSync(tmp, backupFile);
        copies++;
        if (watermark && watermark !== progress?.watermark) {
          // An object of the destination: the generation's first upload is its snapshot, later ones are WAL
          // segments. Recorded once the copy is in place, as an object is listable once its upload finished.
          const created = new Date();
          appendFileSync(join(dir, OBJECTS), JSON.stringify({
            kind: objects === 0 ? 'snapshot' : 'wal', generation, index: objects, size: statSync(backupFile).size,
            created: created.toISOString(),
          }) + '\n');
          objects++;
          // Like the fork: the previous series is replaced, the value is the time the upload finished.
          progress = {watermark, time: created.getTime() / 1000};
          log(`backed up watermark=${watermark}`);
        }
      }
    } catch (e) {
      log('backup failed:', e?.message ?? e);
    }
    await new Promise(r => setTimeout(r, interval));
  }
}

/** The objects uploaded to a file:// destination so far: [{kind, generation, index, size, created}]. */
function listObjects(dir) {
  const file = join(dir, OBJECTS);
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8').split('\n').filter(Boolean).map(l => JSON.parse(l));
}

/** Go's time.Format(time.RFC3339) in UTC: seconds precision, `Z`. */
function rfc3339(iso) {
  return iso.replace(/\.\d+Z$/, 'Z');
}

/**
 * `litestream snapshots|wal [-config PATH] [-replica NAME] <db path | replica URL>`: litestream 0.3's listing,
 * tab-separated (litestream aligns the same columns with a tabwriter; Zero splits on any whitespace).
 */
function list(command, args) {
  let configPath;
  const positional = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '-config') configPath = args[++i];
    else if (args[i] === '-replica') i++;
    else if (args[i].startsWith('-')) continue;
    else positional.push(args[i]);
  }
  if (positional.length !== 1) throw new Error(`usage: litestream ${command} [arguments] <db path | replica URL>`);
  const [target] = positional;
  let replicaURL = target;
  if (!target.includes('://')) {
    const config = readConfig(configPath);
    if (config.dbPath !== target) throw new Error(`database not found in config: ${target}`);
    replicaURL = config.replicaURL;
  }
  const objects = listObjects(backupDir(replicaURL)).filter(o => o.kind === (command === 'snapshots' ? 'snapshot' : 'wal'));
  const rows = command === 'snapshots'
    ? [['replica', 'generation', 'index', 'size', 'created'],
      ...objects.map(o => ['file', o.generation, o.index, o.size, rfc3339(o.created)])]
    : [['replica', 'generation', 'index', 'offset', 'size', 'created'],
      ...objects.map(o => ['file', o.generation, o.index, 0, o.size, rfc3339(o.created)])];
  process.stdout.write(rows.map(r => r.join('\t')).join('\n') + '\n');
}

/** `"_zero.replicationState".stateVersion` of a replica file. */
function watermarkOf(file) {
  const db = new Database(file, {readonly: true, fileMustExist: true});
  try {
    return db.prepare('SELECT "stateVersion" FROM "_zero.replicationState"').pluck().get();
  } finally {
    db.close();
  }
}

async function restore(args) {
  const flags = new Set(args.filter(a => a.startsWith('-')));
  const dbPath = args[args.length - 1];
  const {replicaURL} = readConfig();
  // Zero passes the backup URL it was handed (the snapshot status) in the environment; the config expands it.
  const dir = backupDir(replicaURL);
  const backupFile = join(dir, 'replica.db');
  if (flags.has('-if-db-not-exists') && existsSync(dbPath)) {
    log(`restore: ${dbPath} exists; nothing to do`);
    return;
  }
  if (!existsSync(backupFile)) {
    if (flags.has('-if-replica-exists')) {
      log(`restore: no backup at ${replicaURL}; nothing to do`);
      return;
    }
    throw new Error(`no backup at ${replicaURL}`);
  }
  mkdirSync(dirname(dbPath), {recursive: true});
  const tmp = `${dbPath}.tmp-${process.pid}`;
  copyFileSync(backupFile, tmp);
  await holdRestore(log, () => `watermark=${watermarkOf(tmp)}`);
  // (Reading the copy's watermark leaves an empty WAL and a shared-memory file beside it.)
  for (const file of [dbPath, tmp]) {
    for (const suffix of ['-wal', '-wal2', '-shm']) rmSync(file + suffix, {force: true});
  }
  renameSync(tmp, dbPath);
  log(`restored ${dbPath} from ${replicaURL}`);
}

const [command, ...rest] = process.argv.slice(2);
log(`argv: ${JSON.stringify(process.argv.slice(2))}`);
try {
  if (command === 'replicate') {
    await replicate();
  } else if (command === 'restore') {
    await restore(rest);
  } else if (command === 'snapshots' || command === 'wal') {
    list(command, rest);
  } else {
    throw new Error(`unsupported command: ${command}`);
  }
} catch (e) {
  log(e?.stack ?? e);
  process.exit(1);
}
