// The deployment under test (docs/deploy-zero-0.20.md), on 127.0.0.1 with free ports:
//
//   view-syncer (zero-cache, discover) ──/snapshot, /changes──▶ sidecar ──/changes──▶ RM change-streamer
//   RM backup replicator ──────────────────/changes──────────▶ sidecar
//   RM BackupMonitor ──GET localhost:{proxy}/metrics──▶ sidecar proxy ──▶ litestream stand-in (private addr)
//   sidecar ──▶ change DB (verify ownerAddress, purge changeLog)
//
// One PostgreSQL cluster (scripts/with-postgres.sh) holds the upstream, CVR and change databases; each Topology
// has databases of its own.
import {mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {dirname, join, resolve} from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';
import postgres from 'postgres';
import Database from '@rocicorp/zero-sqlite3';
import {Procs} from '../../interop-lib/procs.mjs';

const here = dirname(fileURLToPath(import.meta.url));
export const INTEROP_DIR = resolve(here, '..');
export const ZERO_CLI = join(INTEROP_DIR, 'node_modules/@rocicorp/zero/out/zero/src/cli.js');
export const ZERO_CACHE_SRC = join(INTEROP_DIR, 'node_modules/@rocicorp/zero/out/zero-cache/src');
export const STANDIN = join(here, 'litestream-standin.mjs');
export const LOOPBACK_PRELOAD = join(here, '..', '..', 'interop-lib', 'loopback.cjs');

export const APP_ID = 'zero';
export const SHARD_NUM = 0;
export const CDC = `"${APP_ID}_${SHARD_NUM}/cdc"`;
export const RM_TASK_ID = 'interop-rm';
export const VS_TASK_ID = 'interop-view-syncer';

export {eventually, freePort, httpGet, progressSamples} from '../../interop-lib/util.mjs';
import {eventually, freePort, httpGet, progressSamples} from '../../interop-lib/util.mjs';

export class Topology {
  /**
   * @param name distinguishes this deployment's databases and directories from another one's
   * @param standinEnv extra environment for the litestream stand-in the replication-manager runs
   */
  constructor(name = 'main', {standinEnv = {}} = {}) {
    this.name = name;
    this.standinEnv = standinEnv;
    this.dir = mkdtempSync(join(tmpdir(), `sidecar-interop-${name}-`));
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
    this.dbs = {upstream: `interop_upstream_${suffix}`, cvr: `interop_cvr_${suffix}`, change: `interop_change_${suffix}`};
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
      vsSync: await freePort(),
      vsChangeStreamer: await freePort(),
      vsLitestream: await freePort(),
    };
    this.sidecarAddress = `127.0.0.1:${this.ports.sidecar}`;
    this.backupDir = join(this.dir, 'backup');
    this.backupURL = pathToFileURL(this.backupDir).toString();
    for (const d of ['rm', 'vs', 'sidecar']) mkdirSync(join(this.dir, d));
    // zero-cache loads ./.env (dotenvx); an empty one keeps the environment given here the only source.
    for (const d of ['rm', 'vs']) writeFileSync(join(this.dir, d, '.env'), '');
    this.rmReplica = join(this.dir, 'rm', 'replica.db');
    this.vsReplica = join(this.dir, 'vs', 'replica.db');

    // Zero's own litestream config with only `addr` moved to a private port (docs/deploy-zero-0.20.md, step 1).
    const zeroConfig = readFileSync(join(ZERO_CACHE_SRC, 'services/litestream/config.yml'), 'utf8');
    const moved = (port) => zeroConfig.replace(/^addr: .*$/m, `addr: 127.0.0.1:${port}`);
    if (moved(1) === zeroConfig) throw new Error("Zero's litestream config has no addr line");
    this.rmLitestreamConfig = join(this.dir, 'rm', 'litestream.yml');
    writeFileSync(this.rmLitestreamConfig, moved(this.ports.litestream));
    this.vsLitestreamConfig = join(this.dir, 'vs', 'litestream.yml');
    writeFileSync(this.vsLitestreamConfig, moved(this.ports.vsLitestream));

    this.sidecarConfig = join(this.dir, 'sidecar', 'sidecar.toml');
    writeFileSync(this.sidecarConfig, this.sidecarToml());
  }

  sidecarToml() {
    return `# Generated by the interop tests: the recommended deployment, with short intervals.
[server]
listen = "${this.sidecarAddress}"
ping_interval = "5s"
shutdown_grace = "3s"

[upstream]
address = "127.0.0.1:${this.ports.rmChangeStreamer}"

[litestream]
backup_url = "${this.backupURL}"
metrics_url = "http://127.0.0.1:${this.ports.litestream}/metrics"
check_interval = "1s"
scrape_timeout = "2s"
name = "file"
proxy_listen = "localhost:${this.ports.proxy}"

[zero]
app_id = "${APP_ID}"
shard_num = ${SHARD_NUM}

[change_db]
url = "${this.changeURL}"

[cleanup]
enabled = true
initial_delay = "30s"
reservations = "pin"
reconnect_grace = "5s"
# Kept beside the config, where this deployment's restarts find it; a fresh deployment has no restore in flight.
state_file = "${join(this.dir, 'sidecar', 'state.json')}"
hold_without_state = "0s"

[discovery]
mode = "verify"
advertise_address = "${this.sidecarAddress}"
interval = "1s"

[log]
format = "json"
filter = "warn,litestream_sidecar=debug"
`;
  }

  zeroEnv(role) {
    const common = {
      NODE_OPTIONS: `--require=${LOOPBACK_PRELOAD}`,
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
      // One table-copy worker: Zero 0.20 starts every worker at the slot's exported snapshot, and a worker left
      // with no table to copy that connects after the copy is done (a loaded machine) finds the snapshot gone and
      // crashes the replication-manager ("invalid snapshot identifier"). The suite's tables are tiny.
      ZERO_INITIAL_SYNC_TABLE_COPY_WORKERS: '1',
      ZERO_LITESTREAM_EXECUTABLE: STANDIN,
      ZERO_LITESTREAM_LOG_LEVEL: 'info',
      INTEROP_STANDIN_INTERVAL_MS: '2000',
      OTEL_SDK_DISABLED: 'true',
    };
    if (role === 'rm') {
      return {
        ...common,
        ...this.standinEnv,
        ZERO_TASK_ID: RM_TASK_ID,
        ZERO_REPLICA_FILE: this.rmReplica,
        ZERO_NUM_SYNC_WORKERS: '0',
        ZERO_PORT: String(this.ports.rmSync),
        ZERO_CHANGE_STREAMER_PORT: String(this.ports.rmChangeStreamer),
        ZERO_CHANGE_STREAMER_ADDRESS: this.sidecarAddress,
        ZERO_LITESTREAM_BACKUP_URL: this.backupURL,
        ZERO_LITESTREAM_CONFIG_PATH: this.rmLitestreamConfig,
        ZERO_LITESTREAM_PORT: String(this.ports.proxy),
      };
    }
    return {
      ...common,
      ZERO_TASK_ID: VS_TASK_ID,
      ZERO_REPLICA_FILE: this.vsReplica,
      ZERO_CHANGE_STREAMER_MODE: 'discover',
      ZERO_NUM_SYNC_WORKERS: '1',
      ZERO_PORT: String(this.ports.vsSync),
      ZERO_CHANGE_STREAMER_PORT: String(this.ports.vsChangeStreamer),
      ZERO_LITESTREAM_CONFIG_PATH: this.vsLitestreamConfig,
      ZERO_LITESTREAM_PORT: String(this.ports.vsLitestream),
    };
  }

  async startSidecar() {
    const proc = this.procs.start('sidecar', this.sidecarBin, ['--config', this.sidecarConfig], {
      cwd: join(this.dir, 'sidecar'),
      env: {RUST_LOG: null}, // the config's [log] filter applies
    });
    await eventually('the sidecar to answer GET /', async () => {
      if (!proc.running) throw new Error(`sidecar exited (${proc.exitCode ?? proc.exitSignal})`);
      return (await httpGet(`http://${this.sidecarAddress}/`, {timeout: 1000})).status === 200;
    }, {timeout: 20_000});
    return proc;
  }

  async stopSidecar() {
    return this.procs.stop('sidecar');
  }

  startReplicationManager() {
    return this.procs.start('replication-manager', process.execPath, [ZERO_CLI], {
      cwd: join(this.dir, 'rm'),
      env: this.zeroEnv('rm'),
    });
  }

  startViewSyncer() {
    return this.procs.start('view-syncer', process.execPath, [ZERO_CLI], {
      cwd: join(this.dir, 'vs'),
      env: this.zeroEnv('vs'),
    });
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

  /** Inserts rows upstream in one transaction; returns its commit watermark once the change log has stored it. */
  async insert(rows) {
    await this.upstream.begin(async tx => {
      for (const [id, label, big = null] of rows) {
        await tx`INSERT INTO item (id, label, big) VALUES (${id}, ${label}, ${big})`;
      }
    });
    const ids = rows.map(r => String(r[0]));
    const found = await eventually(`the change log to store the insert of ${ids}`, async () => {
      const hits = await this.change.unsafe(
        `SELECT DISTINCT watermark FROM ${CDC}."changeLog"
          WHERE change->>'tag' = 'insert' AND change->'relation'->>'name' = 'item' AND change->'new'->>'id' = ANY($1)`,
        [ids],
      );
      return hits.length > 0 ? hits : null;
    });
    if (found.length !== 1) throw new Error(`the rows ${ids} are in more than one transaction: ${JSON.stringify(found)}`);
    const {watermark} = found[0];
    // The commit row is stored with the rest of the transaction; wait for it all the same.
    await eventually(`the commit of ${watermark}`, async () =>
      (await this.change.unsafe(`SELECT 1 FROM ${CDC}."changeLog" WHERE watermark = $1 AND change->>'tag' = 'commit'`,
        [watermark])).length === 1);
    return watermark;
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

  /** Rows of `item` in a replica file, by id. */
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
