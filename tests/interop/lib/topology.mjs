// The deployments under test with real Zero processes, on 127.0.0.1 with free ports. One harness for both Zero
// versions (INTEROP_ZERO, lib/zero.mjs): what differs between them is in the version's `profile` (lib/versions.mjs).
//
// Address topology (`discovery.mode = "verify"`; the only one Zero 0.20 has):
//
//   view-syncer (discover) ──ownerAddress = sidecar── /snapshot, /changes ──▶ sidecar ──/changes──▶ RM change-streamer
//   RM backup replicator: Zero 0.20 ──/changes──▶ sidecar; Zero 1.9 ──ws://localhost:{change-streamer port} (direct)
//   RM BackupMonitor ──GET localhost:{proxy}/metrics──▶ sidecar proxy ──▶ litestream's page (private addr)
//   sidecar ──▶ change DB (verify ownerAddress, purge changeLog)
//   RM litestream (lib/litestream-gauge.mjs: the real litestream 0.3.13, and the fork's gauge proven by restores;
//     or, `zeroLitestream: 'stock'`, the real one alone) ──▶ the destination: a file:// directory, or an s3:// bucket
//     on a moto server on 127.0.0.1; the sidecar lists it (and, `requires: 'restore'`, restores it in its drills),
//     view-syncers restore from it
//
// URI topology (Zero 1.9, `discovery.mode = "owner"`): view-syncers set ZERO_CHANGE_STREAMER_URI to the sidecar,
// the RM advertises its own change-streamer address, and the sidecar checks that it is that one.
//
// A pair (`sidecars: 2`, the URI topology; docs/deploy-zero-1.9.md "Two sidecars for availability"): two sidecars,
// "sidecar" and "sidecar-b", each scraping the RM's litestream, relaying to the RM and listing every slot in the
// change DB, behind one address: Debian's haproxy (as a Kubernetes Service would be), which sends view-syncers to the
// first sidecar whose /keepalive answers 200 and the RM's BackupMonitor to either sidecar's metrics proxy.
//
//   view-syncers ──ZERO_CHANGE_STREAMER_URI = haproxy── ▶ sidecar (first ready) ──/changes──▶ RM change-streamer
//   RM BackupMonitor ──GET localhost:{proxy}/metrics──▶ haproxy ──▶ either sidecar's proxy ──▶ litestream's page
//
// One PostgreSQL cluster (scripts/with-postgres.sh) holds the upstream, CVR and change databases; each Topology
// has databases of its own.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import {mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {basename, dirname, join, resolve} from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';
import {listGenerations, litestreamBin, restoreTo} from './litestream.mjs';
import {Procs} from './procs.mjs';
import {S3_REGION, ZERO_VERSIONS, parseShard} from './versions.mjs';
import {ZERO, ZERO_DIR, ZERO_VERSION, deps} from './zero.mjs';

const {postgres, Database} = deps;
const here = dirname(fileURLToPath(import.meta.url));
export {ZERO_DIR, ZERO_VERSION};
export const ZERO_CLI = join(ZERO_DIR, 'node_modules/@rocicorp/zero/out/zero/src/cli.js');
export const ZERO_CACHE_SRC = join(ZERO_DIR, 'node_modules/@rocicorp/zero/out/zero-cache/src');
/** The litestream Zero runs: the real one, with the fork's progress gauge beside it (lib/litestream-gauge.mjs). */
export const LITESTREAM_GAUGE = join(here, 'litestream-gauge.mjs');
export const LOOPBACK_PRELOAD = join(here, 'loopback.cjs');

export const APP_ID = 'zero';
/**
 * Zero's shard number of each deployment this process starts, one apart. Replication slots are the cluster's, not
 * a database's, and Zero names them `{app}_{shard}_…`: a replication-manager's initial sync drops every inactive
 * slot of its app and shard that its own database does not list, so deployments sharing a PostgreSQL cluster (the
 * suites and shards `make test` runs side by side, the deployments of one suite) must not share a shard number, or
 * one's initial sync drops the slot of another whose replication-manager is restarting. Each suite and shard has its
 * own range: 1000 per version of lib/versions.mjs, 100 per shard of it (INTEROP_SHARD), one per deployment.
 */
let nextShardNum = (() => {
  const version = Object.keys(ZERO_VERSIONS).indexOf(ZERO_VERSION);
  const [k] = parseShard(process.env.INTEROP_SHARD);
  return 1000 * (version + 1) + 100 * (k - 1);
})();
/** The sidecars' `cleanup.initial_delay` and `cleanup.reconnect_grace`, in ms: the waits of a sidecar that starts. */
export const CLEANUP_DELAY_MS = 30_000;
export const RECONNECT_GRACE_MS = 5_000;
/**
 * The reconnect grace of a deployment whose scenarios restart a view-syncer and expect it to keep its replica: a
 * departed subscriber holds cleanup only that long, and on a loaded 2-core machine a view-syncer took 15 s from its
 * stop to its next reservation (Node's start-up), past RECONNECT_GRACE_MS, so the sidecar rightly purged past it.
 */
export const VIEW_SYNCER_RESTART_GRACE_MS = 30_000;
/** How often the replication-manager's litestream uploads (its replica's `sync-interval`), in ms. */
export const SYNC_INTERVAL_MS = 1_200;
/** The S3 credentials of the deployments on moto (which accepts any) and the bucket (the region: lib/versions.mjs). */
const S3_CREDENTIALS = {AWS_ACCESS_KEY_ID: 'interop-access-key', AWS_SECRET_ACCESS_KEY: 'interop-secret-key'};
const S3_BUCKET = 'zero-backups';

/**
 * What differs between the Zero versions in a deployment: names (so that two suites can share a cluster), task IDs,
 * and the environment Zero's processes get on top of the common one (the version's `profile` in lib/versions.mjs).
 */
export const PROFILE = ZERO.profile;

export {eventually, freePort, httpGet, progressSamples} from './util.mjs';
import {eventually, freePort, httpGet, progressSamples} from './util.mjs';

export class Topology {
  /**
   * @param name distinguishes this deployment's databases and directories from another one's (its processes are
   *   told apart by INTEROP_DEPLOYMENT, the name of its directory: procs.mjs)
   * @param litestreamEnv extra environment for the litestream the replication-manager runs (lib/litestream-gauge.mjs)
   * @param destination where litestream backs up: "file" (a directory of the deployment's) or "s3" (a bucket on a
   *   moto server of its own, on 127.0.0.1)
   * @param syncIntervalMs the replica's litestream `sync-interval`
   * @param zeroLitestream the ZERO_LITESTREAM_EXECUTABLE of Zero's processes: "gauge" (lib/litestream-gauge.mjs,
   *   the real litestream with the fork's progress gauge) or "stock" (the real litestream binary itself: no gauge,
   *   no argv lines, no knobs)
   * @param requires the sidecar's `cleanup.requires`: "listing", or "restore" (its restore drills then drive
   *   cleanup and statuses)
   * @param drillInterval the sidecar's `backup.drill_interval` (unset: its default, an hour; "2s" under "restore").
   *   Drills always run the real litestream, into a directory of the deployment's.
   * @param drillLitestream the litestream binary the sidecar's drills run (`backup.litestream`; unset: the one Zero
   *   runs, LITESTREAM_BIN)
   * @param restoreWith the sidecar's `backup.restore_with` (unset: its default)
   * @param reconnectGraceMs the sidecars' `cleanup.reconnect_grace`: how long a subscriber that left still holds
   *   cleanup at what it acknowledged (RECONNECT_GRACE_MS unless a scenario restarts a view-syncer and expects it
   *   back within it)
   */
  constructor(name = 'main', {
    litestreamEnv = {}, destination = 'file', syncIntervalMs = SYNC_INTERVAL_MS, zeroLitestream = 'gauge',
    requires = 'listing', drillInterval = requires === 'restore' ? '2s' : undefined, sidecars = 1, drillLitestream,
    restoreWith, reconnectGraceMs = RECONNECT_GRACE_MS,
  } = {}) {
    this.name = name;
    /** Its sidecars' `cleanup.reconnect_grace`, in ms. */
    this.reconnectGraceMs = reconnectGraceMs;
    /** Zero's shard number here, this deployment's alone (`nextShardNum`). */
    this.shardNum = nextShardNum++;
    /** The change DB's schema of this shard, quoted for SQL. */
    this.cdc = `"${APP_ID}_${this.shardNum}/cdc"`;
    if (![1, 2].includes(sidecars)) throw new Error(`one sidecar or a pair, not ${sidecars}`);
    /** The sidecars' process names; a pair's are reached through haproxy (`startFront`). */
    this.sidecarNames = sidecars === 1 ? ['sidecar'] : ['sidecar', 'sidecar-b'];
    this.litestreamEnv = litestreamEnv;
    if (!['file', 's3'].includes(destination)) throw new Error(`unknown destination ${destination}`);
    this.destination = destination;
    this.syncIntervalMs = syncIntervalMs;
    if (!['gauge', 'stock'].includes(zeroLitestream)) throw new Error(`unknown zeroLitestream ${zeroLitestream}`);
    this.zeroLitestream = zeroLitestream;
    if (!['listing', 'restore'].includes(requires)) throw new Error(`unknown cleanup.requires ${requires}`);
    this.requires = requires;
    this.drillInterval = drillInterval;
    this.litestreamBin = litestreamBin();
    this.drillLitestream = drillLitestream ?? this.litestreamBin;
    this.restoreWith = restoreWith;
    this.dir = mkdtempSync(join(tmpdir(), `sidecar-${PROFILE.tag}-${name}-`));
    this.logDir = join(this.dir, 'logs');
    mkdirSync(this.logDir);
    this.procs = new Procs(this.logDir, basename(this.dir));
    // Where the sidecar's restore drills restore to (it creates the directory).
    this.drillDir = join(this.dir, 'drills');
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
    // The sidecar's `litestream.proxy_mode`: unset, the sidecar's default ("clamp"); or "hide", "clamp".
    this.proxyMode = undefined;
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
      litestream: await freePort(), // the config's addr: the exporter's page, scraped by the sidecar
      rmSync: await freePort(),
      rmChangeStreamer: await freePort(),
    };
    this.sidecarAddress = `127.0.0.1:${this.ports.sidecar}`;
    // Each sidecar's own listener and metrics proxy; a pair's RM reads its proxy page through haproxy on
    // ports.proxy, and view-syncers reach either sidecar through haproxy on ports.front.
    this.sidecars = new Map([['sidecar', {address: this.sidecarAddress, proxyPort: this.ports.proxy}]]);
    if (this.sidecarNames.length === 2) {
      this.sidecars.get('sidecar').proxyPort = await freePort();
      this.sidecars.set('sidecar-b', {address: `127.0.0.1:${await freePort()}`, proxyPort: await freePort()});
      this.ports.front = await freePort();
      this.frontAddress = `127.0.0.1:${this.ports.front}`;
    }
    this.rmAddress = `127.0.0.1:${this.ports.rmChangeStreamer}`;
    if (this.destination === 's3') {
      await this.startMoto();
      this.backupURL = `s3://${S3_BUCKET}/${PROFILE.tag}-${this.name}/replica`;
    } else {
      this.backupDir = join(this.dir, 'backup');
      this.backupURL = pathToFileURL(this.backupDir).toString();
    }
    for (const d of ['rm', 'tmp', ...this.sidecarNames]) mkdirSync(join(this.dir, d));
    // Every gauge value the replication-manager's exporter serves, over all its runs (assertGaugeNeverAhead).
    this.gaugeLog = join(this.dir, 'rm', 'litestream-gauge.jsonl');
    // zero-cache loads ./.env (dotenvx); an empty one keeps the environment given here the only source.
    writeFileSync(join(this.dir, 'rm', '.env'), '');
    this.rmReplica = join(this.dir, 'rm', 'replica.db');
    this.rmLitestreamConfig = join(this.dir, 'rm', 'litestream.yml');
    writeFileSync(this.rmLitestreamConfig, this.litestreamConfig(this.ports.litestream));
    this.writeSidecarConfig();
  }

  /**
   * A moto server of this deployment's own on 127.0.0.1 ($MOTO_SERVER, else what scripts/moto.sh finds or
   * installs), with the bucket the backups go to.
   */
  async startMoto() {
    const server = process.env.MOTO_SERVER ||
      execFileSync(resolve(here, '../../../scripts/moto.sh'), {encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit']}).trim();
    this.ports.moto = await freePort();
    this.s3Endpoint = `http://127.0.0.1:${this.ports.moto}`;
    const moto = this.procs.start('moto', server, ['-H', '127.0.0.1', '-p', String(this.ports.moto)], {quiet: true});
    await eventually('moto to answer', async () => {
      if (!moto.running) {
        throw Object.assign(new Error(`moto exited: ${moto.lines().slice(-3).join(' | ')}`), {fatal: true});
      }
      return (await httpGet(`${this.s3Endpoint}/moto-api/data.json`, {timeout: 2000})).status === 200;
    }, {timeout: 60_000});
    const res = await fetch(`${this.s3Endpoint}/${S3_BUCKET}`, {method: 'PUT'});
    if (res.status !== 200) throw new Error(`creating bucket ${S3_BUCKET} on moto: HTTP ${res.status} ${await res.text()}`);
  }

  /** What a process that reaches the S3 destination needs in its environment (nothing for file://). */
  s3Env() {
    return this.destination === 's3' ? {...S3_CREDENTIALS, AWS_REGION: S3_REGION, AWS_EC2_METADATA_DISABLED: 'true'} : {};
  }

  /** Zero's own litestream config with only `addr` moved to a private port. */
  litestreamConfig(port) {
    const zeroConfig = readFileSync(join(ZERO_CACHE_SRC, 'services/litestream/config.yml'), 'utf8');
    const moved = zeroConfig.replace(/^addr: .*$/m, `addr: 127.0.0.1:${port}`);
    if (moved === zeroConfig) throw new Error("Zero's litestream config has no addr line");
    return moved;
  }

  /** Writes every sidecar's config; `sidecarConfig` is the first one's. */
  writeSidecarConfig() {
    for (const name of this.sidecarNames) {
      writeFileSync(this.sidecarConfigOf(name), this.sidecarToml(name));
    }
    this.sidecarConfig = this.sidecarConfigOf('sidecar');
  }

  sidecarConfigOf(name) {
    return join(this.dir, name, 'sidecar.toml');
  }

  sidecarToml(name = 'sidecar') {
    const {address, proxyPort} = this.sidecars.get(name);
    const discovery = this.discovery === 'owner'
      ? `mode = "owner"`
      : `mode = "verify"
advertise_address = "${this.sidecarAddress}"`;
    const backup = [
      ...(this.destination === 's3' ? [`# moto on loopback; the credentials come from the environment.
endpoint = "${this.s3Endpoint}"
region = "${S3_REGION}"
force_path_style = true
allow_http = true`] : []),
      // Restore drills with the real litestream (under "restore", often: they prove what cleanup and statuses go by).
      `litestream = "${this.drillLitestream}"${this.restoreWith ? `
restore_with = "${this.restoreWith}"` : ''}
drill_dir = "${this.drillDir}"${this.drillInterval ? `
drill_interval = "${this.drillInterval}"` : ''}`,
    ];
    return `# Generated by the Zero ${ZERO_VERSION} interop tests (${this.discovery === 'owner' ? 'URI' : 'address'} topology), with short intervals.
[server]
listen = "${address}"
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
${this.zeroLitestream === 'stock' ? `# No gauge to pick a replica's samples from: the clamped sample is named after the backup URL's scheme.`
    : `name = "${this.destination}"`}
proxy_listen = "localhost:${proxyPort}"
${this.proxyMode ? `proxy_mode = "${this.proxyMode}"\n` : ''}${backup.length > 0 ? `
[backup]
${backup.join('\n')}
` : ''}
[zero]
app_id = "${APP_ID}"
shard_num = ${this.shardNum}

[change_db]
url = "${this.changeURL}"

[cleanup]
enabled = true
initial_delay = "${CLEANUP_DELAY_MS / 1000}s"
reservations = "pin"
reconnect_grace = "${this.reconnectGraceMs / 1000}s"
without_subscribers = "${this.discovery === 'owner' ? 'after_grace' : 'hold'}"
# Inside the deployment's directory, not the default under /var/lib. Each deployment here is a fresh one: no hold
# for the first start without a state file.
state_file = "${join(this.dir, name, 'state.json')}"
hold_without_state = "0s"
requires = "${this.requires}"

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
      ...PROFILE.env(this),
      // Zero's view-syncers keep SQLite files in the temporary directory (mutagen-*) and leave them behind:
      // this deployment's own, removed with it.
      TMPDIR: join(this.dir, 'tmp'),
      NODE_OPTIONS: `--require=${LOOPBACK_PRELOAD}`,
      INTEROP_ZERO: ZERO_VERSION, // the exporter loads this version's packages
      ZERO_UPSTREAM_DB: this.upstreamURL,
      ZERO_CVR_DB: this.cvrURL,
      ZERO_CHANGE_DB: this.changeURL,
      ZERO_APP_ID: APP_ID,
      ZERO_SHARD_NUM: String(this.shardNum),
      ZERO_LOG_LEVEL: 'info',
      ZERO_LOG_FORMAT: 'text',
      ZERO_UPSTREAM_MAX_CONNS: '4',
      ZERO_CVR_MAX_CONNS: '4',
      ZERO_CHANGE_MAX_CONNS: '2',
      ZERO_LITESTREAM_EXECUTABLE: this.zeroLitestream === 'stock' ? this.litestreamBin : LITESTREAM_GAUGE,
      LITESTREAM_BIN: this.litestreamBin,
      ZERO_LITESTREAM_LOG_LEVEL: 'info',
      // Zero's own setting for litestream's sync-interval (its config.yml: `${…}m`; 15 minutes by default).
      ZERO_LITESTREAM_INCREMENTAL_BACKUP_INTERVAL_MINUTES: String(this.syncIntervalMs / 60_000),
      ...this.s3Env(),
      ...(this.destination === 's3' ? PROFILE.s3Env(this.s3Endpoint) : {}),
      OTEL_SDK_DISABLED: 'true',
    };
  }

  rmEnv() {
    return {
      ...this.commonZeroEnv(),
      ...this.litestreamEnv,
      INTEROP_LITESTREAM_GAUGE_LOG: this.gaugeLog,
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
   * `uri`: ZERO_CHANGE_STREAMER_URI (the URI topology); otherwise it discovers the change-streamer.
   * `litestreamEnv`: extra environment for the litestream it runs to restore (lib/litestream-gauge.mjs).
   */
  async viewSyncer(name, {uri, litestreamEnv = {}} = {}) {
    let vs = this.viewSyncers.get(name);
    if (vs) return vs;
    const dir = join(this.dir, name);
    mkdirSync(dir);
    writeFileSync(join(dir, '.env'), '');
    vs = {
      name,
      dir,
      uri,
      litestreamEnv,
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
      ...vs.litestreamEnv,
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

  /** Starts sidecar `name` and waits until it answers. */
  async startSidecar(name = 'sidecar') {
    const {address} = this.sidecars.get(name);
    const proc = this.procs.start(name, this.sidecarBin, ['--config', this.sidecarConfigOf(name)], {
      cwd: join(this.dir, name),
      env: {RUST_LOG: null, ...this.s3Env()}, // the config's [log] filter applies
    });
    await eventually('the sidecar to answer GET /', async () => {
      if (!proc.running) {
        throw Object.assign(new Error(`${name} exited (${proc.exitCode ?? proc.exitSignal}): ${proc.lines().slice(-3).join(' | ')}`),
          {fatal: true});
      }
      return (await httpGet(`http://${address}/`, {timeout: 1000})).status === 200;
    }, {timeout: 20_000});
    return proc;
  }

  /** `{signal: 'SIGKILL'}`: the sidecar dies without a shutdown of its own. */
  stopSidecar(opts, name = 'sidecar') {
    return this.procs.stop(name, opts);
  }

  /**
   * A pair's one address (Debian's haproxy, $HAPROXY_BIN, else the machine's): view-syncers go to the first sidecar
   * whose /keepalive answers 200 (checked every second; down after two failures), the next one while it is not;
   * the RM's BackupMonitor to either sidecar's metrics proxy that accepts connections, on every address
   * `localhost` has. Waits until haproxy answers.
   */
  async startFront() {
    assert.equal(this.sidecarNames.length, 2, 'a front for a pair of sidecars');
    const [a, b] = this.sidecarNames.map(n => this.sidecars.get(n));
    const config = join(this.dir, 'haproxy.cfg');
    writeFileSync(config, `# Generated by the interop tests: one address for a pair of sidecars.
global
  log stderr format raw local0 info
defaults
  mode tcp
  log global
  option tcplog
  timeout connect 2s
  timeout client 5m
  timeout server 5m
  timeout tunnel 1h
frontend change_streamer
  bind ${this.frontAddress}
  default_backend sidecars
backend sidecars
  balance first
  option httpchk GET /keepalive
  http-check expect status 200
  default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions
  server sidecar ${a.address} check
  server sidecar-b ${b.address} check
frontend metrics
  bind 127.0.0.1:${this.ports.proxy}
  bind ::1:${this.ports.proxy}
  default_backend proxies
backend proxies
  balance roundrobin
  default-server inter 1s fall 2 rise 2
  server sidecar 127.0.0.1:${a.proxyPort} check
  server sidecar-b 127.0.0.1:${b.proxyPort} check
`);
    const bin = process.env.HAPROXY_BIN || 'haproxy';
    const proc = this.procs.start('haproxy', bin, ['-db', '-f', config], {cwd: this.dir});
    await eventually('haproxy to accept connections', async () => {
      if (!proc.running) {
        throw Object.assign(new Error(`haproxy exited (${proc.exitCode ?? proc.exitSignal}): ${proc.lines().slice(-5).join(' | ')}`),
          {fatal: true});
      }
      return (await httpGet(`http://localhost:${this.ports.proxy}/metrics`, {timeout: 1000}).catch(() => ({status: 0})))
        .status !== 0;
    }, {timeout: 20_000});
    return proc;
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
    const rows = await this.change.unsafe(`SELECT "ownerAddress" FROM ${this.cdc}."replicationState"`).catch(() => []);
    return rows[0]?.ownerAddress ?? null;
  }

  async replicationState() {
    const [state] = await this.change.unsafe(`SELECT * FROM ${this.cdc}."replicationState"`);
    const [config] = await this.change.unsafe(`SELECT * FROM ${this.cdc}."replicationConfig"`);
    return {...state, replicaVersion: config.replicaVersion};
  }

  /** Distinct watermarks in the change log with their row counts, ascending. */
  async changeLog() {
    return this.change.unsafe(
      `SELECT watermark, count(*)::int AS rows FROM ${this.cdc}."changeLog" GROUP BY watermark ORDER BY watermark`,
    );
  }

  async changeLogWatermarks() {
    return (await this.changeLog()).map(r => r.watermark);
  }

  /** The change log's oldest watermark, or null when it is empty. */
  async changeLogMin() {
    const [{min}] = await this.change.unsafe(`SELECT min(watermark) AS min FROM ${this.cdc}."changeLog"`);
    return min;
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
        `SELECT DISTINCT watermark FROM ${this.cdc}."changeLog"
          WHERE change->>'tag' = 'insert' AND change->'relation'->>'name' = 'item' AND change->'new'->>'id' = ANY($1)`,
        [ids],
      );
      return hits.length > 0 ? hits : null;
    }, {timeout});
    if (found.length !== 1) throw new Error(`the rows ${ids} are in more than one transaction: ${JSON.stringify(found)}`);
    const {watermark} = found[0];
    await eventually(`the commit of ${watermark}`, async () =>
      (await this.change.unsafe(`SELECT 1 FROM ${this.cdc}."changeLog" WHERE watermark = $1 AND change->>'tag' = 'commit'`,
        [watermark])).length === 1);
    return watermark;
  }

  /** Sidecar `name`'s `GET /status` document. */
  async sidecarStatus(name = 'sidecar') {
    const res = await httpGet(`http://${this.sidecars.get(name).address}/status`);
    if (res.status !== 200) throw new Error(`GET /status: HTTP ${res.status}: ${res.body.slice(0, 200)}`);
    return JSON.parse(res.body);
  }

  /** The page the replication-manager's litestream serves: the real one's, with the exporter's gauge. */
  async litestreamPage() {
    return (await httpGet(`http://127.0.0.1:${this.ports.litestream}/metrics`)).body;
  }

  async proxyPage() {
    return httpGet(`http://localhost:${this.ports.proxy}/metrics`);
  }

  /** The watermark litestream's gauge last reported backed up, or null. */
  async backedUp() {
    const samples = progressSamples(await this.litestreamPage());
    return samples[0]?.watermark ?? null;
  }

  // A hang guard: on a loaded machine an upload and its proof by the gauge exporter take tens of seconds.
  async waitBackedUp(watermark, timeout = 90_000) {
    return eventually(`litestream to back up ${watermark}`, async () => {
      const w = await this.backedUp();
      return w !== null && w >= watermark ? w : null;
    }, {timeout});
  }

  /**
   * Every value of the gauge the replication-manager's litestream served, over all its runs, in order:
   * [{at, watermark, value, generation, pid}] (`value`: the sample's epoch seconds; `pid`: the exporter's).
   */
  gaugeServed() {
    if (!existsSync(this.gaugeLog)) return [];
    return readFileSync(this.gaugeLog, 'utf8').split('\n').filter(Boolean).map(l => JSON.parse(l));
  }

  /**
   * The destination as a fresh restore with the real litestream finds it now: its generations as listed
   * ([{generation, end}]), the watermark of each one restored whole ({generation: watermark}), and `latest`, the
   * watermark of the restore a view-syncer gets (the newest generation).
   */
  async restoreDestination() {
    const dir = mkdtempSync(join(this.dir, 'restore-check-'));
    const {config, env} = this.destinationConfig(dir);
    try {
      const generations = await listGenerations(this.litestreamBin, config, this.rmReplica, {env});
      const restored = {};
      const read = async (name, generation) => {
        const out = join(dir, `${name}.db`);
        if (!(await restoreTo(this.litestreamBin, config, this.rmReplica, out, {generation, env}))) return null;
        return this.replicaItems(out).stateVersion;
      };
      for (const {generation} of generations) restored[generation] = await read(generation, generation);
      return {generations, restored, latest: await read('latest')};
    } finally {
      rmSync(dir, {recursive: true, force: true});
    }
  }

  /** A litestream config in `dir` that reaches the destination, and the environment litestream needs for it. */
  destinationConfig(dir) {
    const config = join(dir, 'litestream.yml');
    const s3 = this.destination === 's3'
      ? `\n        endpoint: ${this.s3Endpoint}\n        region: ${S3_REGION}\n        force-path-style: true` : '';
    writeFileSync(config, `dbs:\n  - path: ${this.rmReplica}\n    replicas:\n      - url: ${this.backupURL}${s3}\n`);
    return {config, env: {...process.env, ...this.s3Env()}};
  }

  /**
   * The destination's generations as the real litestream lists them now ([{generation, start, end}], `end` the
   * `created` time of a generation's newest snapshot or WAL segment), and `newest`, the newest of those times (null
   * when nothing is listed): what Zero's own upload verification (`litestream snapshots` and `wal`) finds.
   */
  async listDestination() {
    const dir = mkdtempSync(join(this.dir, 'list-'));
    try {
      const {config, env} = this.destinationConfig(dir);
      const generations = await listGenerations(this.litestreamBin, config, this.rmReplica, {env});
      const newest = generations.reduce((n, g) => (n === null || g.end > n ? g.end : n), null);
      return {generations, newest};
    } finally {
      rmSync(dir, {recursive: true, force: true});
    }
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

  /**
   * Stops everything; on success also drops the databases and removes the temp directory (kept on failure). A
   * deployment never prepared (a run whose scenarios do not use it) leaves nothing behind.
   */
  async close({keep = false} = {}) {
    await this.procs.stopAll();
    await Promise.all(this.sqls.map(s => s.end({timeout: 2}).catch(() => {})));
    if (keep || process.env.INTEROP_KEEP) return;
    if (!this.dbs) {
      rmSync(this.dir, {recursive: true, force: true});
      return;
    }
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

/**
 * The gauge the replication-manager's litestream served was never ahead of its backup: for every value it served
 * (at least `min` of them), restoring the destination now with the real litestream reaches that watermark, both in
 * the generation the value named and in the restore a view-syncer gets; each value's time is no later than the
 * newest object of its generation; and each exporter's watermarks only went up. Returns what it compared.
 */
export async function assertGaugeNeverAhead(topo, {min = 1} = {}) {
  const served = topo.gaugeServed();
  assert.ok(served.length >= min,
    `expected at least ${min} gauge value(s) in ${topo.gaugeLog}; found ${served.length}`);
  const {generations, restored, latest} = await topo.restoreDestination();
  const ends = new Map(generations.map(g => [g.generation, g.end.getTime() / 1000]));
  const where = `(served: ${served.map(s => `${s.watermark}@${s.value} gen ${s.generation}`).join(', ')}; restored ` +
    `now: ${JSON.stringify(restored)}, latest ${latest})`;
  const last = new Map();
  for (const s of served) {
    assert.ok(restored[s.generation] != null && restored[s.generation] >= s.watermark,
      `the gauge served ${s.watermark} from generation ${s.generation}, which restores to ` +
      `${restored[s.generation] ?? 'nothing'} ${where}`);
    assert.ok(latest !== null && latest >= s.watermark,
      `the gauge served ${s.watermark}, and a restore of the destination gives ${latest} ${where}`);
    assert.ok(s.value >= 1e9, `the gauge served ${s.watermark} with the time ${s.value}, not a time of an upload ${where}`);
    assert.ok(s.value <= ends.get(s.generation),
      `the gauge served ${s.watermark} at ${s.value}, after the newest object of generation ${s.generation} ` +
      `(${ends.get(s.generation)}) ${where}`);
    assert.ok(!last.has(s.pid) || last.get(s.pid) < s.watermark,
      `exporter ${s.pid} served ${s.watermark} after ${last.get(s.pid)} ${where}`);
    last.set(s.pid, s.watermark);
  }
  return {served: served.length, newest: served.at(-1).watermark, latest, generations: generations.length};
}
