// Clients of the change-streamer protocol used by the scenarios: Zero's own ChangeStreamerHttpClient of the version
// under test (discovery through the change DB or a fixed URI, its schema checks, its acks), and a raw WebSocket
// client that keeps every frame's text exactly as received and acks only when told.
import {join} from 'node:path';
import {pathToFileURL} from 'node:url';
import {setTimeout as sleep} from 'node:timers/promises';
import assert from 'node:assert/strict';
import {APP_ID, ZERO_CACHE_SRC, eventually} from './topology.mjs';
import {deps} from './zero.mjs';

const {LogContext, WebSocket} = deps;

const {ChangeStreamerHttpClient} = await import(
  pathToFileURL(join(ZERO_CACHE_SRC, 'services/change-streamer/change-streamer-http.js')).href
);
export {ChangeStreamerHttpClient};

/**
 * Zero's client for deployment `topo`'s shard, logging into `lines` (printed with the other logs on failure).
 * Without `uri` it discovers the change-streamer through the change DB's ownerAddress, as a discover-mode
 * view-syncer does; with it (Zero 1.9), it connects there, as a view-syncer with ZERO_CHANGE_STREAMER_URI does.
 */
export function zeroClient(topo, lines, uri) {
  const sink = {
    log(level, context, ...args) {
      const text = args.map(a => (a instanceof Error ? a.stack : typeof a === 'string' ? a : JSON.stringify(a)));
      lines.push(`${new Date().toISOString()} ${level} ${JSON.stringify(context ?? {})} ${text.join(' ')}`);
    },
  };
  const lc = new LogContext('debug', {client: uri ? `interop ${uri}` : 'interop'}, sink);
  const shard = {appID: APP_ID, shardNum: topo.shardNum};
  return uri === undefined
    ? new ChangeStreamerHttpClient(lc, shard, topo.changeURL)
    : new ChangeStreamerHttpClient(lc, shard, topo.changeURL, uri);
}

/**
 * Consumes a Zero client stream in the background, the way Zero's replicator does: each message is taken (and so
 * acknowledged by Zero's client) as soon as it arrives. `messages` grows; `ended` resolves when the stream ends.
 */
export class Pump {
  constructor(source, name) {
    this.source = source;
    this.name = name;
    this.messages = [];
    this.error = null;
    this.done = false;
    this.ended = (async () => {
      try {
        for await (const msg of source) this.messages.push(msg);
      } catch (e) {
        this.error = e;
      } finally {
        this.done = true;
      }
    })();
  }

  /** Waits until `predicate(messages)` holds; returns its value. */
  async waitFor(what, predicate, timeout = 30_000) {
    const deadline = Date.now() + timeout;
    for (;;) {
      const value = predicate(this.messages);
      if (value) return value;
      if (this.done) {
        throw new Error(`${this.name}: stream ended (${this.error ?? 'no error'}) before ${what}; got ` +
          JSON.stringify(this.messages.map(m => m[0])));
      }
      if (Date.now() > deadline) {
        throw new Error(`${this.name}: no ${what} within ${timeout} ms; got ${JSON.stringify(this.messages.map(m => m[0]))}`);
      }
      await sleep(50);
    }
  }

  /** Waits for the commit of `watermark`. */
  waitForCommit(watermark, timeout) {
    return this.waitFor(`commit ${watermark}`, ms => ms.some(m => m[0] === 'commit' && m[2]?.watermark === watermark), timeout);
  }

  async waitEnded(timeout = 15_000) {
    const result = await Promise.race([this.ended.then(() => true), sleep(timeout).then(() => false)]);
    if (!result) throw new Error(`${this.name}: stream still open after ${timeout} ms`);
  }

  cancel() {
    this.source.cancel?.();
  }
}

/** A WebSocket client that records every text frame verbatim and acks only when told. */
export class RawSubscriber {
  constructor(url, name) {
    this.name = name;
    this.frames = [];
    this.closed = null;
    this.ws = new WebSocket(url, {perMessageDeflate: false, maxPayload: 256 << 20});
    this.ws.on('message', (data, isBinary) => this.frames.push(isBinary ? {binary: data} : data.toString('utf8')));
    this.opened = new Promise((resolve, reject) => {
      this.ws.once('open', resolve);
      this.ws.once('unexpected-response', (_req, res) => reject(new Error(`${name}: HTTP ${res.statusCode}`)));
      this.ws.once('error', reject);
    });
    this.closedP = new Promise(resolve => this.ws.once('close', (code, reason) => {
      this.closed = {code, reason: reason.toString()};
      resolve(this.closed);
    }));
  }

  /** Parsed messages so far: [{id, msg}]. */
  messages() {
    return this.frames.map(f => JSON.parse(f));
  }

  async waitFrames(what, predicate, timeout = 30_000) {
    const deadline = Date.now() + timeout;
    for (;;) {
      const value = predicate(this.messages());
      if (value) return value;
      if (this.closed) throw new Error(`${this.name}: closed ${JSON.stringify(this.closed)} before ${what}`);
      if (Date.now() > deadline) throw new Error(`${this.name}: no ${what} within ${timeout} ms (${this.frames.length} frames)`);
      await sleep(50);
    }
  }

  /** The frames up to and including the commit of `watermark`. */
  async untilCommit(watermark, timeout) {
    return this.waitFrames(`commit ${watermark}`, ms => {
      const i = ms.findIndex(m => m.msg[0] === 'commit' && m.msg[2]?.watermark === watermark);
      return i >= 0 ? this.frames.slice(0, i + 1) : null;
    }, timeout);
  }

  ack(id) {
    this.ws.send(JSON.stringify({ack: id}));
  }

  /** Acks every message received so far, in order, from `from` on. */
  ackAll(from = 1) {
    for (const m of this.messages()) if (m.id >= from) this.ack(m.id);
  }

  async close() {
    if (!this.closed) {
      this.ws.close();
      await Promise.race([this.closedP, sleep(5000)]);
      if (!this.closed) this.ws.terminate();
    }
  }
}

/** The query string a Zero 0.20 subscriber sends. */
export function changesQuery({taskID = '', id, mode = 'serving', watermark, replicaVersion, initial = false}) {
  return new URLSearchParams({taskID, id, mode, watermark, replicaVersion, initial: initial ? 'true' : 'false'}).toString();
}

/**
 * One question, the v6 snapshot status, asked of `topo`'s sidecar (found through ownerAddress, as a discover-mode
 * view-syncer finds it) and of Zero's own change-streamer, with Zero's client: `[ours, zeros]`, each `['status',
 * {…}]`. Asked once the sidecar has read the replica's size, which its status carries; Zero may first list the
 * backup destination, or wait for its next backup check, before it answers. Both reservations are cancelled.
 */
export async function snapshotStatuses(topo, lines, {sidecarTask, zeroTask}) {
  await eventually("the sidecar to read the replica's size", async () => (await topo.sidecarStatus()).replica_bytes > 0,
    {timeout: 30_000});
  const viaSidecar = new Pump(await zeroClient(topo, lines).reserveSnapshot(sidecarTask), 'sidecar status');
  const fromZero = new Pump(await zeroClient(topo, lines, `ws://${topo.rmAddress}/`).reserveSnapshot(zeroTask),
    'Zero status');
  try {
    const [ours] = await viaSidecar.waitFor('the status', ms => ms.length > 0 && ms);
    const [zeros] = await fromZero.waitFor('the status', ms => ms.length > 0 && ms, 60_000);
    const asked = `connecting to change-streamer@ws://${topo.sidecarAddress}/replication/v6/snapshot`;
    assert.ok(lines.some(l => l.includes(asked)), `discovered the sidecar and asked for a v6 snapshot: ${lines.join('\n')}`);
    return [ours, zeros];
  } finally {
    viaSidecar.cancel();
    fromZero.cancel();
  }
}
