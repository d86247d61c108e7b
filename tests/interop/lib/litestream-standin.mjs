#!/usr/bin/env node
// A stand-in for rocicorp's litestream fork (zero@v0.0.9), which cannot be built here. Zero spawns it as its
// litestream executable (ZERO_LITESTREAM_EXECUTABLE) with the same environment and arguments it gives litestream:
//
//   litestream-standin.mjs replicate
//     Every INTEROP_STANDIN_INTERVAL_MS (default 2000) copies the replica (a consistent SQLite backup) to the
//     directory of the file:// replica URL, reads "_zero.replicationState".stateVersion from the copy, and serves
//     on the config's `addr` the fork's gauge for it (docs/protocol.md, "litestream's progress gauge"):
//       litestream_replica_progress{db="<replica path>",name="file",watermark="<stateVersion>"} <epoch seconds>
//     INTEROP_STANDIN_FIRST_UPLOAD_DELAY_MS holds the first upload back that long (a slow initial snapshot).
//   litestream-standin.mjs restore [-if-db-not-exists] [-if-replica-exists] [...] <db path>
//     Copies the backup back to <db path>.
//
// Like litestream it reads its config from $LITESTREAM_CONFIG (Zero's config.yml format, ${VAR} expanded from the
// environment): the db `path`, the replica `url` and `addr` (tests/interop-lib/standin.mjs, shared with the Zero 1.9
// suite's stand-in).
import {copyFileSync, existsSync, mkdirSync, renameSync, rmSync, statSync} from 'node:fs';
import {createServer} from 'node:http';
import {dirname, join} from 'node:path';
import Database from '@rocicorp/zero-sqlite3';
import {backupDir, goFloat, holdFirstUpload, readConfig, splitAddr} from '../../interop-lib/standin.mjs';

const log = (...args) => console.error(`[litestream-standin ${process.pid}]`, ...args);

async function replicate() {
  const {dbPath, replicaURL, addr} = readConfig();
  const dir = backupDir(replicaURL);
  mkdirSync(dir, {recursive: true});
  const backupFile = join(dir, 'replica.db');
  const interval = Number(process.env.INTEROP_STANDIN_INTERVAL_MS ?? 2000);
  let progress = null; // {watermark, time}
  let copies = 0;

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
        const copy = new Database(tmp, {readonly: true, fileMustExist: true});
        let watermark;
        try {
          watermark = copy.prepare('SELECT "stateVersion" FROM "_zero.replicationState"').pluck().get();
        } finally {
          copy.close();
        }
        renameSync(tmp, backupFile);
        copies++;
        if (watermark && watermark !== progress?.watermark) {
          // Like the fork: the previous series is replaced, the value is the time the upload finished.
          progress = {watermark, time: Date.now() / 1000};
          log(`backed up watermark=${watermark}`);
        }
      }
    } catch (e) {
      log('backup failed:', e?.message ?? e);
    }
    await new Promise(r => setTimeout(r, interval));
  }
}

function restore(args) {
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
  for (const suffix of ['-wal', '-wal2', '-shm']) rmSync(dbPath + suffix, {force: true});
  renameSync(tmp, dbPath);
  log(`restored ${dbPath} from ${replicaURL}`);
}

const [command, ...rest] = process.argv.slice(2);
try {
  if (command === 'replicate') {
    await replicate();
  } else if (command === 'restore') {
    restore(rest);
  } else {
    throw new Error(`unsupported command: ${command}`);
  }
} catch (e) {
  log(e?.stack ?? e);
  process.exit(1);
}
