// Which Zero generation this run tests, and where its npm packages are. scripts/interop.sh sets INTEROP_ZERO
// ("0.20" or "1.9"); the harness passes it on to every process it starts (litestream's gauge exporter loads the same
// packages). Each generation is a directory beside this one, zero-<version>, with its package.json and lockfile
// (the pinned Zero, zero-sqlite3, postgres, ws), its node_modules and its scenarios (interop.test.mjs).
import {existsSync} from 'node:fs';
import {dirname, join, resolve} from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

export const VERSIONS = ['0.20', '1.9'];
export const ZERO_VERSION = process.env.INTEROP_ZERO;
if (!VERSIONS.includes(ZERO_VERSION)) {
  throw new Error(`INTEROP_ZERO must name the Zero version under test (${VERSIONS.join(' or ')}); got ${ZERO_VERSION} ` +
    '(run the suites through scripts/interop.sh)');
}
/** tests/interop/zero-<version>: the version's package.json, lockfile, node_modules and scenarios. */
export const ZERO_DIR = resolve(here, '..', `zero-${ZERO_VERSION}`);
if (!existsSync(join(ZERO_DIR, 'node_modules'))) {
  throw new Error(`${ZERO_DIR} has no node_modules: run scripts/interop.sh ${ZERO_VERSION} (it runs npm ci)`);
}

/** postgres, Database (@rocicorp/zero-sqlite3), WebSocket (ws) and LogContext (@rocicorp/logger) of this version. */
export const deps = await import(pathToFileURL(join(ZERO_DIR, 'deps.mjs')).href);
