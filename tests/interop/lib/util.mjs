// Helpers both interop suites use (Zero 0.20 and Zero 1.9): free ports,
// waiting for a condition, plain HTTP GETs, reading litestream's progress gauge off a metrics page, and the
// sidecar's JSON log events (and a reservation's course in them) and the lines of its output that are not log records.
import assert from 'node:assert/strict';
import {mkdirSync, readFileSync, unlinkSync, writeFileSync} from 'node:fs';
import {createServer} from 'node:net';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {setTimeout as sleep} from 'node:timers/promises';

/** Ports handed out by `freePort` in this process (each is handed out once). */
const handedOut = new Set();

/**
 * Where every process on the machine that runs `freePort` records the ports it handed out, a file each holding its
 * pid (scripts/interop.sh sets it for the suites it runs side by side; it sweeps the files of processes gone). A
 * port free when it is checked is not free for long: a process of another suite may be handed it before ours binds
 * it, or bind it while ours restarts (seen as EADDRINUSE). The kernel cannot hold a port for a process not started
 * yet, so the runs hold them for one another here.
 */
const RESERVED = process.env.INTEROP_PORTS_DIR || join(tmpdir(), 'litestream-sidecar-ports');

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return e.code === 'EPERM';
  }
}

/**
 * Records `port` as this process's until it exits, unless a live process holds it; a dead one's record is taken
 * over.
 */
export function reservePort(port) {
  const file = join(RESERVED, String(port));
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      writeFileSync(file, String(process.pid), {flag: 'wx'});
      handedOut.add(port);
      return true;
    } catch (e) {
      if (e.code === 'ENOENT') {
        mkdirSync(RESERVED, {recursive: true});
        continue;
      }
      if (e.code !== 'EEXIST') throw e;
    }
    let owner;
    try {
      owner = Number(readFileSync(file, 'utf8'));
    } catch {
      return false; // released or taken over just now: another port will do
    }
    if (!owner || alive(owner)) return false;
    try {
      unlinkSync(file);
    } catch {
      // another process took it over first; writing it again below decides
    }
  }
  return false;
}

process.on('exit', () => {
  for (const port of handedOut) {
    const file = join(RESERVED, String(port));
    try {
      if (readFileSync(file, 'utf8') === String(process.pid)) unlinkSync(file);
    } catch {
      // gone already
    }
  }
});

/**
 * The kernel's ephemeral port range (/proc/sys/net/ipv4/ip_local_port_range): ports it gives to `listen(0)` and to
 * outgoing connections, ours and those of everything else running on the machine.
 */
function ephemeralRange() {
  try {
    const [low, high] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    if (low > 0 && high >= low) return [low, high];
  } catch {
    // not Linux, or not readable
  }
  return [32768, 60999];
}

function canListen(port, host) {
  return new Promise(res => {
    const s = createServer();
    s.once('error', e => res(host === '::1' && (e.code === 'EADDRNOTAVAIL' || e.code === 'EAFNOSUPPORT')));
    s.listen({port, host, exclusive: true}, () => s.close(() => res(true)));
  });
}

/**
 * A free TCP port on 127.0.0.1 (and, for `localhost` listeners, on ::1 where that exists), chosen below the
 * kernel's ephemeral range: a port from that range can be taken as the local port of any outgoing connection on
 * the machine between this check and the moment a process binds it (seen as EADDRINUSE on a busy machine). It
 * stays this process's for its life, also while what listens on it restarts (see `RESERVED`).
 */
export async function freePort({alsoV6 = false} = {}) {
  const [ephemeralLow] = ephemeralRange();
  const high = Math.min(ephemeralLow - 1, 32767);
  const low = Math.max(1024, Math.min(15000, high - 2000));
  for (let attempt = 0; attempt < 1000; attempt++) {
    const port = low + Math.floor(Math.random() * (high - low + 1));
    if (handedOut.has(port)) continue;
    if (!(await canListen(port, '127.0.0.1'))) continue;
    if (alsoV6 && !(await canListen(port, '::1'))) continue;
    if (!reservePort(port)) continue;
    return port;
  }
  throw new Error(`no free port in ${low}-${high}`);
}

export async function eventually(what, check, {timeout = 30_000, interval = 200} = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      const value = await check();
      if (value) return value;
    } catch (e) {
      if (e?.fatal) throw e; // waiting longer cannot help
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeout} ms waiting for ${what}${last ? `: ${last.message}` : ''}`);
    }
    await sleep(interval);
  }
}

export async function httpGet(url, {timeout = 5000} = {}) {
  const res = await fetch(url, {signal: AbortSignal.timeout(timeout)});
  return {status: res.status, body: await res.text()};
}

/** litestream_replica_progress samples on a metrics page: [{db, name, watermark, value}]. */
export function progressSamples(page) {
  const out = [];
  for (const m of page.matchAll(/^litestream_replica_progress\{([^}]*)\}\s+(\S+)$/gm)) {
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map(l => [l[1], l[2]]));
    out.push({...labels, value: Number(m[2])});
  }
  return out;
}

/** Every JSON log event of the sidecar started as `name` in `procs`, over all its runs. */
export function sidecarEvents(procs, name = 'sidecar') {
  const out = [];
  for (let p = procs.procs.get(name); p; p = p.previous) out.unshift(...p.json());
  return out;
}

/** A field of a log event, from the event itself or from one of its spans. */
export function field(event, key) {
  if (event[key] !== undefined) return event[key];
  if (event.span?.[key] !== undefined) return event.span[key];
  for (const s of event.spans ?? []) if (s[key] !== undefined) return s[key];
  return undefined;
}

/** The log events of sidecar `name` with `message` whose `fields` have the given values. */
export function sidecarEventsWith(procs, message, fields = {}, name = 'sidecar') {
  return sidecarEvents(procs, name).filter(
    e => e.message === message && Object.entries(fields).every(([k, v]) => field(e, k) === v),
  );
}

/**
 * Whether a line of the sidecar's output is one of its log records (`[log] format = "json"`): a JSON object with
 * a `timestamp` and a `level`.
 */
export function isLogRecord(line) {
  if (!line.startsWith('{')) return false;
  try {
    const record = JSON.parse(line);
    return record !== null && typeof record === 'object' && !Array.isArray(record) &&
      typeof record.timestamp === 'string' && typeof record.level === 'string';
  } catch {
    return false;
  }
}

/**
 * Lines the sidecar started as `name` in `procs` wrote to stdout or stderr, over all its runs, that are not log
 * records: a panic message, a stray print. Each as {key, run, pid, logPath, lineNo, line, previous} (`previous`: the
 * log record just before it, for context, when there is one). The last line of a running process may be unfinished
 * and waits for a later look.
 */
export function sidecarStrayLines(procs, name = 'sidecar') {
  const runs = [];
  for (let p = procs.procs.get(name); p; p = p.previous) runs.unshift(p);
  const out = [];
  runs.forEach((p, i) => {
    const lines = p.text.split('\n');
    // Everything after the last newline: unfinished while the process runs, '' once its output ended with one.
    const last = lines.pop();
    if (!p.running && last !== '') lines.push(last);
    lines.forEach((line, n) => {
      if (isLogRecord(line)) return;
      out.push({key: `${p.logPath}:${n}`, run: i + 1, pid: p.pid, logPath: p.logPath, lineNo: n + 1, line,
        previous: n > 0 && isLogRecord(lines[n - 1]) ? lines[n - 1] : null});
    });
  });
  return out;
}

/** Fails, listing each line with where it came from, if `strays` (from `sidecarStrayLines`) is not empty. */
export function assertNoStrayLines(strays, where = '') {
  if (strays.length === 0) return;
  const shown = strays.slice(0, 40).map(s =>
    `  run ${s.run} (pid ${s.pid}, ${s.logPath}) line ${s.lineNo}: ${JSON.stringify(s.line)}` +
    (s.previous !== null ? `\n      after the record: ${s.previous.slice(0, 300)}` : ''));
  if (strays.length > shown.length) shown.push(`  [... ${strays.length - shown.length} more]`);
  assert.fail(
    `the sidecar${where ? ` ${where}` : ''} wrote ${strays.length} line(s) that are not JSON log records ` +
    `(expected every line of its stdout and stderr to be a {"timestamp", "level", ...} record):\n${shown.join('\n')}`);
}

/**
 * The stray lines (`sidecarStrayLines`) of the sidecars of every `Procs` that `procsList()` returns (asked at each
 * look, as deployments come and go), and a check of those that appeared since a mark: `mark()` at the start of a
 * test, `assertNoneSince(where)` at its end, `assertNone(where)` once everything has stopped.
 */
export class StrayLines {
  constructor(procsList) {
    this.procsList = procsList;
    this.marked = new Set();
  }

  /** Of every sidecar (every process whose name starts with "sidecar": a pair's second one too). */
  all() {
    return this.procsList().flatMap(procs =>
      [...procs.procs.keys()].filter(n => n.startsWith('sidecar')).flatMap(n => sidecarStrayLines(procs, n)));
  }

  mark() {
    this.marked = new Set(this.all().map(s => s.key));
  }

  assertNoneSince(where) {
    assertNoStrayLines(this.all().filter(s => !this.marked.has(s.key)), where);
  }

  assertNone(where) {
    assertNoStrayLines(this.all(), where);
  }
}

/** The records that end a reservation in the sidecar's log, whichever way it ends. */
export const RESERVATION_ENDS = ['reservation ended by its subscription', 'reservation released', 'reservation closed'];

/**
 * The course of the first reservation of `taskID` in the log of the sidecar started as `sidecar` in `procs`: its
 * "reservation opened" record, why its status was held back ("snapshot status withheld …" / "… held back …", or
 * null), "reservation pinned" (logged as its status is queued; null until then), the first record that ended it
 * (null while open), and `waitMs`, from opened to pinned by the sidecar's own timestamps (null until pinned).
 */
export function reservationTimeline(procs, taskID) {
  const all = sidecarEvents(procs).filter(e => field(e, 'task_id') === taskID);
  const opened = all.find(e => e.message === 'reservation opened') ?? null;
  const after = opened ? all.slice(all.indexOf(opened) + 1) : [];
  const withheld = after.find(e => /^snapshot status (withheld|held back)/.test(e.message)) ?? null;
  const pinned = after.find(e => e.message === 'reservation pinned') ?? null;
  const ended = after.find(e => RESERVATION_ENDS.includes(e.message)) ?? null;
  const waitMs = opened && pinned ? Date.parse(pinned.timestamp) - Date.parse(opened.timestamp) : null;
  return {opened, withheld, pinned, ended, waitMs};
}
