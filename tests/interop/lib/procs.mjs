// Shared by the Zero 0.20 and Zero 1.9 suites. INTEROP_PROC names each
// process's tree so a stop waits for all of it; `sockets`, `environ` and `cmdline` serve the loopback and telemetry
// checks.
//
// Processes the interop tests start: each in its own process group, its output in a log file and in memory, all of
// them stopped at the end whatever happened. Zero forks its workers detached (a new session each), so process groups
// do not reach them; every process started here therefore carries the run's marker in its environment, Zero passes it
// on to its workers and to litestream, and `killAll` also ends every process whose environment has it. (The marker
// is INTEROP_CHILD_OF, not INTEROP_RUN_ID itself, which the test runner and this process carry too.) Two deployments
// of one run start processes of the same names ("sidecar", "replication-manager"): INTEROP_DEPLOYMENT tells them
// apart, and a `Procs` stops and kills only its own deployment's.
import {spawn, execFileSync} from 'node:child_process';
import {createWriteStream, readdirSync, readFileSync} from 'node:fs';
import {join} from 'node:path';
import {setTimeout as sleep} from 'node:timers/promises';

export const RUN_ID = process.env.INTEROP_RUN_ID || `interop-${process.pid}-${Date.now()}`;

export class Proc {
  constructor(name, child, logPath) {
    this.name = name;
    this.child = child;
    this.pid = child.pid;
    this.logPath = logPath;
    this.startedAt = Date.now();
    this.text = '';
    this.exitCode = undefined;
    this.exitSignal = undefined;
    this.exited = new Promise(resolve => {
      child.on('exit', (code, signal) => {
        this.exitCode = code;
        this.exitSignal = signal;
        resolve({code, signal});
      });
      child.on('error', err => {
        this.text += `\n[harness] spawn error: ${err.message}\n`;
        resolve({code: -1, signal: null});
      });
    });
  }

  get running() {
    return this.exitCode === undefined && this.exitSignal === undefined;
  }

  lines() {
    return this.text.split('\n');
  }

  /** Lines (from character offset `from`) that match `pattern`. */
  matching(pattern, from = 0) {
    return this.text.slice(from).split('\n').filter(l => pattern.test(l));
  }

  /** JSON log lines (the sidecar's `[log] format = "json"`), parsed, from character offset `from`. */
  json(from = 0) {
    const out = [];
    for (const line of this.text.slice(from).split('\n')) {
      if (!line.startsWith('{')) continue;
      try {
        out.push(JSON.parse(line));
      } catch {
        // a partial line; the next read has it whole
      }
    }
    return out;
  }

  /** Waits until a line from offset `from` on matches; returns it. */
  async waitFor(pattern, {timeout = 60_000, from = 0, what} = {}) {
    const deadline = Date.now() + timeout;
    for (;;) {
      const hit = this.matching(pattern, from)[0];
      if (hit !== undefined) return hit;
      if (!this.running) {
        throw new Error(`${this.name} exited (${this.exitCode ?? this.exitSignal}) before logging ${what ?? pattern}`);
      }
      if (Date.now() > deadline) throw new Error(`${this.name}: no log line ${what ?? pattern} within ${timeout} ms`);
      await sleep(100);
    }
  }
}

export class Procs {
  /** @param deployment names this set of processes among the run's (INTEROP_DEPLOYMENT) */
  constructor(logDir, deployment = logDir) {
    this.logDir = logDir;
    this.deployment = deployment;
    this.procs = new Map();
    this.generation = new Map();
    // On the way out, whatever still carries the run's marker goes, whichever deployment started it.
    this.onExit = () => this.killAllSync({everyDeployment: true});
    process.on('exit', this.onExit);
  }

  get(name) {
    const proc = this.procs.get(name);
    if (!proc) throw new Error(`no process ${name}`);
    return proc;
  }

  /** `quiet`: a process that logs every request (moto): a failure report shows only the end of its log. */
  start(name, command, args, {env = {}, cwd, quiet = false} = {}) {
    const existing = this.procs.get(name);
    if (existing?.running) throw new Error(`${name} is already running`);
    const n = (this.generation.get(name) ?? 0) + 1;
    this.generation.set(name, n);
    const logPath = join(this.logDir, n === 1 ? `${name}.log` : `${name}.${n}.log`);
    const file = createWriteStream(logPath);
    // A null or undefined value removes that variable.
    // INTEROP_PROC names the process's whole tree (Zero's detached workers and the litestream it spawns too), and
    // INTEROP_DEPLOYMENT the deployment it belongs to.
    const fullEnv = Object.fromEntries(
      Object.entries({...process.env, ...env, INTEROP_CHILD_OF: RUN_ID, INTEROP_PROC: name, INTEROP_DEPLOYMENT: this.deployment})
        .filter(([, v]) => v !== undefined && v !== null),
    );
    const child = spawn(command, args, {
      cwd,
      env: fullEnv,
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true, // its own process group
    });
    const proc = new Proc(name, child, logPath);
    proc.quiet = quiet;
    if (existing) proc.previous = existing;
    const take = chunk => {
      proc.text += chunk.toString();
      file.write(chunk);
    };
    child.stdout.on('data', take);
    child.stderr.on('data', take);
    // 'close' comes after the last output (unlike 'exit'), so nothing the process wrote is lost.
    child.on('close', (code, signal) => file.end(`[harness] ${name} exited: code=${code} signal=${signal}\n`));
    this.procs.set(name, proc);
    return proc;
  }

  /**
   * Sends `signal` to the process group and waits for the leader to exit; SIGKILL after `timeout`. Then waits
   * for the rest of its tree (INTEROP_PROC, in this deployment) to go, and kills what is left after a few seconds,
   * so that a restart never finds the old one's ports taken.
   */
  async stop(name, opts = {}) {
    const result = await this.#stopLeader(name, opts);
    const tree = () => treePids(name, this.deployment);
    for (let i = 0; i < 50 && tree().length > 0; i++) await sleep(100);
    for (const pid of tree()) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    return result;
  }

  async #stopLeader(name, {signal = 'SIGTERM', timeout = 20_000} = {}) {
    const proc = this.procs.get(name);
    if (!proc || !proc.running) return proc?.exited;
    try {
      process.kill(-proc.pid, signal);
    } catch {
      // already gone
    }
    const result = await Promise.race([proc.exited, sleep(timeout).then(() => null)]);
    if (result) return result;
    try {
      process.kill(-proc.pid, 'SIGKILL');
    } catch {
      // already gone
    }
    return proc.exited;
  }

  /**
   * Stops every process (SIGTERM, then SIGKILL), then kills whatever of this deployment still carries the run's
   * marker. Another deployment's processes keep running.
   */
  async stopAll() {
    await Promise.all([...this.procs.keys()].reverse().map(name => this.stop(name, {timeout: 10_000})));
    for (let i = 0; i < 50 && deploymentPids(this.deployment).length > 0; i++) await sleep(100);
    this.killAllSync();
  }

  /** `everyDeployment`: every process with the run's marker, not only this deployment's. */
  killAllSync({everyDeployment = false} = {}) {
    for (const proc of this.procs.values()) {
      if (proc.running) {
        try {
          process.kill(-proc.pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
    }
    for (const pid of everyDeployment ? markedPids() : deploymentPids(this.deployment)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
  }

  /** Every process's log, for a failure report. */
  dump(write = s => process.stderr.write(s), maxLines = 3000) {
    for (const [name, proc] of this.procs) {
      for (const p of chain(proc)) {
        const lines = p.text.split('\n');
        const keep = p.quiet ? Math.min(maxLines, 20) : maxLines;
        const shown = lines.length > keep ? lines.slice(-keep) : lines;
        write(`\n===== log of ${name} (pid ${p.pid}, ${p.running ? 'running' : `exited ${p.exitCode ?? p.exitSignal}`}, ` +
          `${p.logPath}) =====\n`);
        if (shown.length < lines.length) write(`[... ${lines.length - shown.length} earlier lines in ${p.logPath}]\n`);
        write(shown.join('\n'));
        write(`\n===== end of ${name} =====\n`);
      }
    }
  }
}

function chain(proc) {
  const out = [];
  for (let p = proc; p; p = p.previous) out.unshift(p);
  return out;
}

/** Pids of every process (other than this one) whose environment carries this run's marker. */
export function markedPids() {
  return pidsWith(`INTEROP_CHILD_OF=${RUN_ID}\0`);
}

/**
 * Pids of every process of this run started as `name`, and of everything it started: of one deployment's (a
 * `Procs`'s `deployment`), or, without one, of every deployment's.
 */
export function treePids(name, deployment) {
  return markedPids().filter(pid => {
    try {
      const env = environ(pid);
      return env.get('INTEROP_PROC') === name && (deployment === undefined || env.get('INTEROP_DEPLOYMENT') === deployment);
    } catch {
      return false;
    }
  });
}

/** Pids of every process of this run that one deployment started (a `Procs`'s `deployment`), and their trees. */
export function deploymentPids(deployment) {
  return markedPids().filter(pid => {
    try {
      return environ(pid).get('INTEROP_DEPLOYMENT') === deployment;
    } catch {
      return false;
    }
  });
}

function pidsWith(text) {
  const marker = Buffer.from(text);
  const pids = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid === process.pid) continue;
    try {
      const environ = readFileSync(`/proc/${pid}/environ`);
      if (environ.includes(marker)) pids.push(pid);
    } catch {
      // gone, or not ours to read
    }
  }
  return pids;
}

/** `ss` lists every socket of the machine, other people's builds and tests included. */
const SS_MAX_BUFFER = 256 << 20;

/** Listening TCP sockets: [{local, port, pids}] from `ss -ltnp`. */
export function listeners() {
  const out = execFileSync('ss', ['-Hltnp'], {encoding: 'utf8', maxBuffer: SS_MAX_BUFFER});
  return out
    .split('\n')
    .filter(Boolean)
    .map(line => {
      const cols = line.trim().split(/\s+/);
      const local = cols[3];
      const port = Number(local.slice(local.lastIndexOf(':') + 1));
      const pids = [...line.matchAll(/pid=(\d+)/g)].map(m => Number(m[1]));
      return {local, host: local.slice(0, local.lastIndexOf(':')), port, pids, line};
    });
}

/** Established TCP connections: [{local, peer, pids}] from `ss -tnp`. */
export function connections() {
  const out = execFileSync('ss', ['-Htnp', 'state', 'established'], {encoding: 'utf8', maxBuffer: SS_MAX_BUFFER});
  return out
    .split('\n')
    .filter(Boolean)
    .map(line => {
      const cols = line.trim().split(/\s+/);
      const [local, peer] = [cols[2], cols[3]];
      const pids = [...line.matchAll(/pid=(\d+)/g)].map(m => Number(m[1]));
      const port = a => Number(a.slice(a.lastIndexOf(':') + 1));
      return {local, peer, localPort: port(local), peerPort: port(peer), pids, line};
    });
}

/** Every TCP and UDP socket of `pids` that is not listening: [{proto, state, local, peer, pids, line}] (`ss -tuanp`). */
export function sockets(pids) {
  const ours = new Set(pids);
  // TIME-WAIT sockets belong to no process; a busy machine has very many of them.
  const out = execFileSync('ss', ['-Htuanp', 'exclude', 'time-wait'], {encoding: 'utf8', maxBuffer: SS_MAX_BUFFER});
  return out
    .split('\n')
    .filter(Boolean)
    .map(line => {
      const cols = line.trim().split(/\s+/);
      const pidsOf = [...line.matchAll(/pid=(\d+)/g)].map(m => Number(m[1]));
      return {proto: cols[0], state: cols[1], local: cols[4], peer: cols[5], pids: pidsOf, line};
    })
    .filter(s => s.state !== 'LISTEN' && s.pids.some(p => ours.has(p)));
}

/** Whether an `ss` address (`127.0.0.1:5432`, `[::1]:80`, `[::ffff:127.0.0.1]:80`, `*:*`) is loopback or unset. */
export function isLoopbackOrUnset(address) {
  const host = address.slice(0, address.lastIndexOf(':')).replace(/^\[|\]$/g, '').replace(/%.*$/, '');
  return host === '*' || host === '0.0.0.0' || host === '::' || host === '::1' || /^(::ffff:)?127\.\d+\.\d+\.\d+$/.test(host);
}

/** The environment of a process, as a map. */
export function environ(pid) {
  const text = readFileSync(`/proc/${pid}/environ`, 'utf8');
  return new Map(text.split('\0').filter(Boolean).map(kv => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
}

/** The command line of a process. */
export function cmdline(pid) {
  return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
}

/**
 * What the kernel counted on each established TCP connection to `peerPort` (`ss -tinp`), whatever the processes
 * log: [{local, peer, pids, bytesAcked, bytesReceived}], bytes sent and acknowledged by the peer, bytes received.
 * A WebSocket ping a server sends with no payload is 2 bytes on the wire, a client's pong to it 6 (masked).
 */
export function tcpCounters(peerPort) {
  const out = execFileSync('ss', ['-Htinp', 'state', 'established', 'dport', '=', `:${peerPort}`],
    {encoding: 'utf8', maxBuffer: SS_MAX_BUFFER});
  const found = [];
  for (const line of out.split('\n')) {
    if (!line.trim()) continue;
    if (/^\s/.test(line)) {
      // The counters of the socket on the line before.
      const last = found.at(-1);
      if (!last) continue;
      const counter = name => Number(line.match(new RegExp(`\\b${name}:(\\d+)`))?.[1] ?? 0);
      last.bytesAcked = counter('bytes_acked');
      last.bytesReceived = counter('bytes_received');
      continue;
    }
    const cols = line.trim().split(/\s+/);
    found.push({local: cols[2], peer: cols[3], pids: [...line.matchAll(/pid=(\d+)/g)].map(m => Number(m[1])),
      bytesAcked: 0, bytesReceived: 0});
  }
  return found;
}
