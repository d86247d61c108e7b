// What the scenarios of the Zero 1.x suites share beyond the deployments themselves (lib/topology.mjs): reading
// process logs across restarts, checks that every process stays on loopback with telemetry off, writers and
// samplers that run beside a scenario, and the scenario wrapper that dumps every log when one fails. Written for the
// Zero 1.10 suite (zero-1.10/interop.test.mjs), in the shape the 1.9 suite's own helpers have.
import {test} from 'node:test';
import assert from 'node:assert/strict';
import {setTimeout as sleep} from 'node:timers/promises';
import {cmdline, environ, isLoopbackOrUnset, listeners, markedPids, sockets} from './procs.mjs';
import {StrayLines, eventually, progressSamples} from './util.mjs';
import {assertZeroCleanupHarmless} from './proxy-watch.mjs';

/** Lines of every run of process `name` of a deployment matching `pattern`, oldest run first. */
export function logLines(topo, name, pattern) {
  const out = [];
  for (let p = topo.procs.procs.get(name); p; p = p.previous) out.unshift(...p.matching(pattern));
  return out;
}

/**
 * Zero's own cleanup behind the clamped proxy did no harm (lib/proxy-watch.mjs): every purge of its own deleted 0
 * rows, every watermark it read is at or below the change log's oldest row, and it never distrusted the backup.
 */
export function zeroCleanupHarmless(topo, opts = {}) {
  return assertZeroCleanupHarmless(topo, logLines(topo, 'replication-manager', /./), opts);
}

/**
 * The proxy page and the change log's oldest watermark, read until the log read before the page and the one
 * after it agree (no purge in between): `{page, samples, min}`.
 */
export function clampedPage(topo) {
  return eventually("the proxy page between two equal reads of the change log's oldest watermark", async () => {
    const before = await topo.changeLogMin();
    const page = await topo.proxyPage();
    const after = await topo.changeLogMin();
    assert.equal(page.status, 200, page.body);
    return before === after ? {page: page.body, samples: progressSamples(page.body), min: after} : null;
  });
}

/**
 * A view-syncer's log lines when the change-streamer refused its subscription (`WatermarkTooOld`,
 * `WrongReplicaVersion`) or dropped it as too far behind (Zero 1.10's `StreamTooFarBehind`).
 */
export const SUBSCRIPTION_REFUSED = /earliest supported watermark|WatermarkTooOld|WrongReplicaVersion|StreamTooFarBehind/;

/** `text` as a regular expression that matches it literally. */
export const literally = text => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** Zero's text log lines carry the message after the context; this finds the JSON object a line ends with. */
export function trailingJSON(line) {
  return JSON.parse(line.slice(line.indexOf('{"')));
}

/**
 * Every process of the run (the sidecar, Zero's processes and workers, litestream, moto) listens on loopback only and
 * has no TCP or UDP socket, connected or connecting, to a non-loopback address (`ss`); `expectedPorts` listen.
 */
export async function assertLoopbackOnly(expectedPorts) {
  const ourListeners = () => {
    const ours = markedPids();
    return listeners().filter(l => l.pids.some(p => ours.includes(p)));
  };
  for (const [name, port] of Object.entries(expectedPorts)) {
    await eventually(`${name} to listen on port ${port}`, () => ourListeners().some(l => l.port === port), {timeout: 60_000});
  }
  const ours = markedPids();
  assert.ok(ours.length > 0);
  for (const l of ourListeners()) {
    assert.match(l.host, /^(127\.\d+\.\d+\.\d+|\[::1\])$/, `listener not on loopback: ${l.line}`);
  }
  const open = sockets(ours);
  assert.ok(open.some(s => s.state === 'ESTAB'), 'the processes have connections (to PostgreSQL, to each other)');
  for (const s of open) {
    assert.ok(isLoopbackOrUnset(s.local) && isLoopbackOrUnset(s.peer), `a socket off loopback: ${s.line}`);
  }
}

/**
 * Every Zero process of the run, its workers and the litestream it spawned, runs with telemetry off (the sidecar,
 * the S3 server and haproxy are not Zero's).
 */
export function assertTelemetryOff() {
  const zero = markedPids().filter(pid => {
    try {
      return !['sidecar', 'sidecar-b', 'moto', 'haproxy'].includes(environ(pid).get('INTEROP_PROC'));
    } catch {
      return false; // gone meanwhile
    }
  });
  let seen = 0;
  for (const pid of zero) {
    let env;
    let argv;
    try {
      env = environ(pid);
      argv = cmdline(pid);
    } catch {
      continue;
    }
    seen++;
    const what = `${env.get('INTEROP_PROC')} pid ${pid} (${argv.join(' ').slice(0, 160)})`;
    assert.equal(env.get('ZERO_ENABLE_TELEMETRY'), 'false', `${what}: ZERO_ENABLE_TELEMETRY`);
    assert.equal(env.get('DO_NOT_TRACK'), '1', `${what}: DO_NOT_TRACK`);
    assert.ok(env.get('ZERO_ADMIN_PASSWORD'), `${what}: ZERO_ADMIN_PASSWORD`);
  }
  assert.ok(seen >= 2, `Zero's processes were found (${seen})`);
}

/**
 * Calls `read()` every `interval` ms until `stop()`: `samples` gets [{at, value}] (`at`: Date.now() as the read
 * began); a read that fails is left out (the sidecar restarting, say).
 */
export function sampleEvery(interval, read) {
  const samples = [];
  let stopping = false;
  const done = (async () => {
    while (!stopping) {
      const at = Date.now();
      try {
        samples.push({at, value: await read()});
      } catch {
        // not there at the moment
      }
      await sleep(interval);
    }
  })();
  return {samples, stop: async () => {
    stopping = true;
    await done;
  }};
}

/**
 * Inserts one row upstream every `interval` ms, ids from `first` on, until `stop()`: the change log, the backups and
 * the subscribers' acks keep moving. `rows` lists those committed, [{id, at}] (`at`: Date.now() at the commit).
 */
export function keepWriting(topo, first, interval = 1_000) {
  const rows = [];
  let stopping = false;
  let error = null;
  const done = (async () => {
    for (let id = first; !stopping; id++) {
      try {
        await topo.upstream`INSERT INTO item (id, label, big) VALUES (${id}, ${`row ${id}`}, ${id})`;
      } catch (e) {
        error = e;
        return;
      }
      rows.push({id, at: Date.now()});
      await sleep(interval);
    }
  })();
  return {rows, stop: async () => {
    stopping = true;
    await done;
    if (error) throw error;
  }};
}

/**
 * The suite's bookkeeping: `scenario()` declares a node:test test that fails when a sidecar wrote a line that is not
 * a log record; `failed` tells the `after` hook to dump every log.
 */
export class Suite {
  constructor(topologies) {
    this.topologies = topologies;
    this.strays = new StrayLines(() => this.topologies.map(topo => topo.procs));
    this.failed = false;
  }

  scenario(name, fn, {timeout = 180_000, skip} = {}) {
    test(name, {timeout, skip}, async ctx => {
      this.strays.mark();
      try {
        await fn(ctx);
        this.strays.assertNoneSince('during this scenario');
      } catch (e) {
        this.failed = true;
        throw e;
      }
    });
  }

  /** Stops every deployment, dumps their logs if anything failed, removes them, and checks nothing is left. */
  async finish(label, extraLog = []) {
    for (const topo of this.topologies) await topo.procs.stopAll();
    let stray = null;
    try {
      this.strays.assertNone('over the whole run');
    } catch (e) {
      stray = e;
    }
    if (this.failed || stray) {
      const what = this.failed ? 'a scenario failed' : 'a sidecar wrote lines that are not log records';
      for (const topo of this.topologies) {
        process.stderr.write(`\n# ${label}: ${what}; logs of every process of "${topo.name}" follow (also in ${topo.logDir})\n`);
        topo.procs.dump(undefined, 600);
      }
      if (extraLog.length > 0) process.stderr.write(`\n===== log of Zero's client in the tests =====\n${extraLog.join('\n')}\n`);
    }
    for (const topo of this.topologies) await topo.close({keep: this.failed || stray !== null});
    const left = markedPids();
    if (stray) {
      if (left.length > 0) stray.message += `\nand processes left running: ${left}`;
      throw stray;
    }
    assert.deepEqual(left, [], `processes left running: ${left}`);
  }
}
