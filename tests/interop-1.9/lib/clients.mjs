// Zero 1.9's own change-streamer client (ChangeStreamerHttpClient: discovery through the change DB or a fixed
// URI, its schema checks, its acks), as the scenarios use it to ask the sidecar and Zero's change-streamer the same
// question. (Adapted from tests/interop/lib/clients.mjs, the Zero 0.20 suite.)
import {join} from 'node:path';
import {pathToFileURL} from 'node:url';
import {setTimeout as sleep} from 'node:timers/promises';
import {LogContext} from '@rocicorp/logger';
import {APP_ID, SHARD_NUM, ZERO_CACHE_SRC} from './topology.mjs';

const {ChangeStreamerHttpClient} = await import(
  pathToFileURL(join(ZERO_CACHE_SRC, 'services/change-streamer/change-streamer-http.js')).href
);
export {ChangeStreamerHttpClient};

/**
 * Zero's client, logging into `lines` (printed with the other logs on failure). Without `uri` it discovers the
 * change-streamer through the change DB's ownerAddress, as a discover-mode view-syncer does; with it, it connects
 * there, as a view-syncer with ZERO_CHANGE_STREAMER_URI does.
 */
export function zeroClient(changeDB, lines, uri) {
  const sink = {
    log(level, context, ...args) {
      const text = args.map(a => (a instanceof Error ? a.stack : typeof a === 'string' ? a : JSON.stringify(a)));
      lines.push(`${new Date().toISOString()} ${level} ${JSON.stringify(context ?? {})} ${text.join(' ')}`);
    },
  };
  const lc = new LogContext('debug', {client: uri ? `interop ${uri}` : 'interop'}, sink);
  return new ChangeStreamerHttpClient(lc, {appID: APP_ID, shardNum: SHARD_NUM}, changeDB, uri);
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

  async waitEnded(timeout = 15_000) {
    const result = await Promise.race([this.ended.then(() => true), sleep(timeout).then(() => false)]);
    if (!result) throw new Error(`${this.name}: stream still open after ${timeout} ms`);
  }

  cancel() {
    this.source.cancel?.();
  }
}
