#!/usr/bin/env node
// The litestream Zero runs in the interop suites and `make demo` (ZERO_LITESTREAM_EXECUTABLE): the real litestream
// v0.3.13 ($LITESTREAM_BIN), plus the one thing only rocicorp's fork has, its progress gauge, proven against the
// destination. Zero runs it with the environment and arguments it gives litestream (services/litestream/commands.ts):
//
//   litestream-gauge.mjs replicate
//     Runs the real `litestream replicate` with a copy of the config whose `addr` is a private loopback port, and
//     serves on the config's own `addr` the real /metrics page verbatim, followed by the fork's gauge:
//       litestream_replica_progress{db="<db path>",name="<replica name>",watermark="<stateVersion>"} <epoch seconds>
//     The gauge only says what the destination is seen to hold. Every INTEROP_LITESTREAM_CHECK_INTERVAL_MS (1000)
//     it lists the destination's generations (`litestream generations`), restores the newest one into a scratch
//     file (`litestream restore -generation G -o …`) and reads "_zero.replicationState".stateVersion from the copy.
//     A watermark newer than the gauge's, with the `created` time of the newest object listed before that restore
//     (whole seconds, never after an object the destination holds), becomes the gauge; it never moves back, and a
//     listing or restore that fails leaves it as it was. No sample until the first such restore.
//     Each new value is logged ("backed up watermark=…") and appended as a JSON line to
//     $INTEROP_LITESTREAM_GAUGE_LOG when set, for the suites' check that the gauge was never ahead of the backup.
//     INTEROP_LITESTREAM_FIRST_UPLOAD_DELAY_MS holds the real litestream back that long (a slow first snapshot): the
//     destination stays empty and the page is empty meanwhile.
//   litestream-gauge.mjs restore [flags] <db path>
//     The real `litestream restore`, without the fork's -multipart-concurrency and -multipart-size (Zero 0.20
//     passes them; litestream 0.3 has neither). INTEROP_LITESTREAM_RESTORE_DELAY_MS makes it that much slower: the
//     backup is restored at once into a scratch file beside <db path>, then held back that long before it is
//     renamed into place (a restore that delivers an older backup than the destination has by the time it ends).
//   litestream-gauge.mjs <any other command> [...]
//     The real litestream with the same arguments, stdio and exit status (Zero 1.9 lists uploads with
//     `litestream snapshots` and `litestream wal` before it trusts the gauge).
//
// For an s3:// replica whose config has no endpoint (Zero 0.20's config.yml has none), every command reads a copy
// of the config with INTEROP_LITESTREAM_S3_ENDPOINT and INTEROP_LITESTREAM_S3_REGION added to the replica
// (LITESTREAM_CONFIG, or the -config argument, then names the copy). Credentials come from the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), as litestream reads them. Every invocation logs its argv.
import {spawn} from 'node:child_process';
import {appendFileSync, existsSync, mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync} from 'node:fs';
import {createServer} from 'node:http';
import {basename, dirname, join} from 'node:path';
import {setTimeout as sleep} from 'node:timers/promises';
import {
  configPathOf, failure, goFloat, labelValue, listGenerations, litestreamBin, newestGeneration, parseConfig,
  readConfig, restoreTo, rewriteConfig, s3SettingsFromEnv, splitAddr,
} from './litestream.mjs';
import {freePort} from './util.mjs';

const log = (...args) => console.error(`[litestream-gauge ${process.pid}]`, ...args);
const ms = name => Number(process.env[name] ?? 0);

/** Scratch files of this process, beside the config (inside the deployment's directory), removed on the way out. */
let scratch = null;
function scratchDir(configPath) {
  if (!scratch) {
    scratch = mkdtempSync(join(configPath ? dirname(configPath) : process.env.TMPDIR || '/tmp', '.litestream-gauge-'));
    process.on('exit', () => rmSync(scratch, {recursive: true, force: true}));
  }
  return scratch;
}

/**
 * The config path and environment a litestream command runs with: the caller's, or a copy of the config with the
 * S3 endpoint added (see above) and LITESTREAM_CONFIG or `-config` pointing at it.
 */
function withS3Settings(args) {
  const configPath = configPathOf(args);
  const s3 = s3SettingsFromEnv();
  if (!configPath || !s3 || !existsSync(configPath)) return {args, env: process.env, configPath};
  const text = readConfig(configPath);
  const rewritten = rewriteConfig(text, {s3});
  if (rewritten === text) return {args, env: process.env, configPath};
  const copy = join(scratchDir(configPath), 'litestream.yml');
  writeFileSync(copy, rewritten);
  const i = args.indexOf('-config');
  return i >= 0
    ? {args: [...args.slice(0, i + 1), copy, ...args.slice(i + 2)], env: process.env, configPath: copy}
    : {args, env: {...process.env, LITESTREAM_CONFIG: copy}, configPath: copy};
}

/** Runs the real binary with inherited stdio, signals passed on; resolves to {code, signal}. */
function passThrough(args, env) {
  const child = spawn(litestreamBin(), args, {stdio: 'inherit', env});
  const forward = sig => child.kill(sig);
  for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP']) process.on(sig, forward);
  return new Promise(resolve => {
    child.on('error', e => {
      log(`cannot run ${litestreamBin()}: ${e.message}`);
      resolve({code: 1, signal: null});
    });
    child.on('exit', (code, signal) => resolve({code, signal}));
  });
}

/** Ends this process the way the real one ended. */
function exitLike({code, signal}) {
  if (scratch) rmSync(scratch, {recursive: true, force: true});
  if (signal) {
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
    return;
  }
  process.exit(code ?? 1);
}

// ---------------------------------------------------------------------------------------------------------------
// replicate

async function replicate(args) {
  const bin = litestreamBin();
  const configPath = configPathOf(args);
  const config = readConfig(configPath);
  const {dbPath, replicaURL, name, addr} = parseConfig(config);
  if (!dbPath || !replicaURL || !addr) throw new Error(`${configPath}: expected a db path, a replica url and addr`);
  const work = scratchDir(configPath);
  // litestream's own page, on a private port chosen just before it starts.
  let privatePort = null;
  const privateConfig = join(work, 'replicate.yml');
  const checkInterval = Number(process.env.INTEROP_LITESTREAM_CHECK_INTERVAL_MS || 1000);
  const gaugeLog = process.env.INTEROP_LITESTREAM_GAUGE_LOG;
  // The copy a check restores: Database of the Zero version under test (@rocicorp/zero-sqlite3).
  const {deps} = await import('./zero.mjs');

  let child = null;
  let progress = null; // {watermark, time (epoch seconds), generation}
  let stopping = false;

  const server = createServer(async (req, res) => {
    if (req.method !== 'GET' || !/^\/metrics(\?|$)/.test(req.url)) {
      res.writeHead(404).end('404 page not found\n');
      return;
    }
    let page = '';
    if (child) {
      try {
        const real = await fetch(`http://127.0.0.1:${privatePort}/metrics`, {signal: AbortSignal.timeout(5000)});
        page = await real.text();
        if (!real.ok) {
          res.writeHead(502).end(`litestream answered ${real.status}\n`);
          return;
        }
      } catch (e) {
        res.writeHead(502).end(`litestream unreachable: ${e.message}\n`);
        return;
      }
    }
    if (page !== '' && !page.endsWith('\n')) page += '\n';
    if (progress) {
      page += '# HELP litestream_replica_progress The last replicated watermark and time of replication\n' +
        '# TYPE litestream_replica_progress gauge\n' +
        `litestream_replica_progress{db="${labelValue(dbPath)}",name="${labelValue(name)}",` +
        `watermark="${labelValue(progress.watermark)}"} ${goFloat(progress.time)}\n`;
    }
    res.writeHead(200, {'Content-Type': 'text/plain; version=0.0.4; charset=utf-8'}).end(page);
  });
  const [host, port] = splitAddr(addr);
  await new Promise((resolve, reject) => server.once('error', reject).listen(port, host, resolve));
  log(`metrics on http://${addr}/metrics; replicating ${dbPath} to ${replicaURL}; the gauge follows restores of ` +
    `it every ${checkInterval} ms`);

  const stop = sig => {
    if (stopping) return;
    stopping = true;
    server.close();
    server.closeAllConnections?.();
    if (child) child.kill(sig);
    else process.exit(0);
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));

  const delay = ms('INTEROP_LITESTREAM_FIRST_UPLOAD_DELAY_MS');
  if (delay > 0) {
    log(`holding the first upload back for ${delay} ms`);
    await sleep(delay);
    if (stopping) return;
  }
  privatePort = await freePort();
  writeFileSync(privateConfig, rewriteConfig(config, {addr: `127.0.0.1:${privatePort}`, s3: s3SettingsFromEnv()}));
  log(`litestream replicate starts, its own page on 127.0.0.1:${privatePort}`);
  child = spawn(bin, ['replicate', '-config', privateConfig, ...args.filter((_, i) => !isConfigArg(args, i))],
    {stdio: ['ignore', 'inherit', 'inherit'], env: process.env});
  const exited = new Promise(resolve => {
    child.on('error', e => resolve({code: 1, signal: null, error: e.message}));
    child.on('exit', (code, signal) => resolve({code, signal}));
  });
  exited.then(result => {
    if (!stopping) log(`litestream replicate exited (${result.error ?? result.signal ?? `code ${result.code}`})`);
    stopping = true;
    server.close();
    server.closeAllConnections?.();
    exitLike(result);
  });

  // Proving uploads: list, restore the newest generation, read its watermark.
  const checkOut = join(work, 'check');
  let lastProblem = null;
  const problem = text => {
    if (text !== lastProblem) log(`check: ${text}`);
    lastProblem = text;
  };
  while (!stopping) {
    await sleep(checkInterval);
    if (stopping) break;
    try {
      const newest = newestGeneration(await listGenerations(bin, privateConfig, dbPath));
      if (!newest) continue;
      rmSync(checkOut, {recursive: true, force: true});
      mkdirSync(checkOut);
      const copy = join(checkOut, 'replica.db');
      if (!(await restoreTo(bin, privateConfig, dbPath, copy, {generation: newest.generation}))) continue;
      const watermark = watermarkOf(deps.Database, copy);
      const time = Math.floor(newest.end.getTime() / 1000);
      lastProblem = null;
      if (!watermark || (progress && (watermark <= progress.watermark || time < progress.time))) continue;
      progress = {watermark, time, generation: newest.generation};
      log(`backed up watermark=${watermark} (generation ${newest.generation}, newest object ${newest.end.toISOString()})`);
      if (gaugeLog) {
        appendFileSync(gaugeLog, JSON.stringify({
          at: new Date().toISOString(), db: dbPath, name, replica: replicaURL, watermark, value: time,
          generation: newest.generation, pid: process.pid,
        }) + '\n');
      }
    } catch (e) {
      problem(e?.message ?? String(e));
    } finally {
      rmSync(checkOut, {recursive: true, force: true});
    }
  }
  await exited;
}

function isConfigArg(args, i) {
  return args[i] === '-config' || (i > 0 && args[i - 1] === '-config');
}

/** `"_zero.replicationState".stateVersion` of a replica file (null if it has none). */
function watermarkOf(Database, file) {
  const db = new Database(file, {fileMustExist: true});
  try {
    return db.prepare('SELECT "stateVersion" FROM "_zero.replicationState"').pluck().get() ?? null;
  } finally {
    db.close();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// restore

/** The fork's restore flags that litestream 0.3 does not have, each with its value. */
const FORK_ONLY_RESTORE_FLAGS = new Set(['-multipart-concurrency', '-multipart-size']);
/** litestream 0.3's restore flags that take a value. */
const RESTORE_VALUE_FLAGS = new Set(['-config', '-o', '-replica', '-generation', '-index', '-parallelism', '-timestamp']);

async function restore(rawArgs) {
  const kept = [];
  const dropped = [];
  for (let i = 0; i < rawArgs.length; i++) {
    if (FORK_ONLY_RESTORE_FLAGS.has(rawArgs[i])) dropped.push(rawArgs[i], rawArgs[++i]);
    else kept.push(rawArgs[i]);
  }
  if (dropped.length > 0) log(`restore: without the fork-only flags ${dropped.join(' ')}`);
  const {args, env, configPath} = withS3Settings(kept);
  const positional = [];
  let output;
  for (let i = 0; i < args.length; i++) {
    if (RESTORE_VALUE_FLAGS.has(args[i])) {
      if (args[i] === '-o') output = args[i + 1];
      i++;
    } else if (!args[i].startsWith('-')) {
      positional.push(args[i]);
    }
  }
  const target = positional.at(-1);
  const out = output ?? target;
  const replicaURL = target?.includes('://') ? target : (configPath && existsSync(configPath) ? parseConfig(readConfig(configPath)).replicaURL : undefined);
  const existed = out !== undefined && existsSync(out);
  const delay = ms('INTEROP_LITESTREAM_RESTORE_DELAY_MS');

  if (delay <= 0 || out === undefined || (existed && args.includes('-if-db-not-exists'))) {
    const result = await passThrough(['restore', ...args], env);
    if (result.code === 0 && out !== undefined) {
      if (!existed && existsSync(out)) log(`restored ${out} from ${replicaURL}`);
      else if (existed) log(`restore: ${out} exists; nothing to do`);
      else log(`restore: no backup at ${replicaURL}; nothing to do`);
    }
    exitLike(result);
    return;
  }

  // Restored at once into a scratch file beside the target, put in place `delay` later.
  const slow = join(dirname(out), `.${basename(out)}.restoring-${process.pid}`);
  const scratchFiles = () => [slow, `${slow}.tmp`].flatMap(f => ['', '-wal', '-wal2', '-shm'].map(s => f + s));
  for (const f of scratchFiles()) rmSync(f, {force: true});
  const withOutput = output === undefined
    ? [...args.slice(0, args.lastIndexOf(target)), '-o', slow, ...args.slice(args.lastIndexOf(target))]
    : args.map((a, i) => (i > 0 && args[i - 1] === '-o' ? slow : a));
  const result = await passThrough(['restore', ...withOutput], env);
  if (result.code !== 0 || !existsSync(slow)) {
    if (result.code === 0) log(`restore: no backup at ${replicaURL}; nothing to do`);
    exitLike(result);
    return;
  }
  const {deps} = await import('./zero.mjs');
  const watermark = watermarkOf(deps.Database, slow);
  log(`restore: took the backup at watermark=${watermark}; finishing in ${delay} ms`);
  await sleep(delay);
  // (Reading the copy's watermark leaves a WAL and a shared-memory file beside it; litestream leaves its own.)
  for (const f of scratchFiles().filter(f => f !== slow)) rmSync(f, {force: true});
  for (const s of ['-wal', '-wal2', '-shm']) rmSync(out + s, {force: true});
  renameSync(slow, out);
  log(`restored ${out} from ${replicaURL}`);
  process.exit(0);
}

// ---------------------------------------------------------------------------------------------------------------

const [command, ...rest] = process.argv.slice(2);
log(`argv: ${JSON.stringify(process.argv.slice(2))}`);
try {
  if (command === 'replicate') {
    await replicate(rest);
  } else if (command === 'restore') {
    await restore(rest);
  } else {
    const {args, env} = withS3Settings(process.argv.slice(2));
    exitLike(await passThrough(args, env));
  }
} catch (e) {
  log(e?.stack ?? e);
  process.exit(1);
}
