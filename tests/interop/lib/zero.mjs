// Which Zero version this run tests, and where its npm packages are. scripts/interop.sh sets INTEROP_ZERO (a
// version of the table in lib/versions.mjs that can be installed: "0.20" or "1.9"); the harness passes it on to every
// process it starts (litestream's gauge exporter loads the same packages). Each version is a directory beside this
// one, zero-<version>, with its package.json and lockfile (the pinned Zero, zero-sqlite3, postgres, ws), its
// node_modules and its scenarios (interop.test.mjs).
import {existsSync} from 'node:fs';
import {dirname, join, resolve} from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';
import {AVAILABLE, versionOf} from './versions.mjs';

const here = dirname(fileURLToPath(import.meta.url));

export const VERSIONS = AVAILABLE;
export const ZERO_VERSION = process.env.INTEROP_ZERO;
if (!VERSIONS.includes(ZERO_VERSION)) {
  throw new Error(`INTEROP_ZERO must name the Zero version under test (${VERSIONS.join(' or ')}); got ${ZERO_VERSION} ` +
    '(run the suites through scripts/interop.sh)');
}
/** The version's entry in lib/versions.mjs: its node, protocol, profile, …. */
export const ZERO = versionOf(ZERO_VERSION);
/** tests/interop/zero-<version>: the version's package.json, lockfile, node_modules and scenarios. */
export const ZERO_DIR = resolve(here, '..', `zero-${ZERO_VERSION}`);
if (!existsSync(join(ZERO_DIR, 'node_modules'))) {
  throw new Error(`${ZERO_DIR} has no node_modules: run scripts/interop.sh ${ZERO_VERSION} (it runs npm ci)`);
}

/** postgres, Database (@rocicorp/zero-sqlite3), WebSocket (ws) and LogContext (@rocicorp/logger) of this version. */
export const deps = await import(pathToFileURL(join(ZERO_DIR, 'deps.mjs')).href);
