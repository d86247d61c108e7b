// The litestream stand-in's (litestream-standin.mjs) plumbing: reading Zero's litestream config, the file://
// destination, litestream's number and address formats, holding the first upload back
// (INTEROP_STANDIN_FIRST_UPLOAD_DELAY_MS: a slow initial snapshot, for the cold-start scenarios) and holding a
// restore back (INTEROP_STANDIN_RESTORE_DELAY_MS: a slow restore, for a sidecar restart in the middle of one).
// Node built-ins only.
import {readFileSync} from 'node:fs';
import {fileURLToPath} from 'node:url';
import {setTimeout as sleep} from 'node:timers/promises';

/** Zero's litestream config (-config PATH or $LITESTREAM_CONFIG, ${VAR} expanded): the db path, replica url, addr. */
export function readConfig(path = process.env.LITESTREAM_CONFIG) {
  if (!path) throw new Error('LITESTREAM_CONFIG is not set');
  const text = readFileSync(path, 'utf8').replace(/\$\{(\w+)\}/g, (_, name) => process.env[name] ?? '');
  const value = key => text.match(new RegExp(`^\\s*(?:- )?${key}:\\s*(\\S+)\\s*$`, 'm'))?.[1];
  return {dbPath: value('path'), replicaURL: value('url'), addr: value('addr')};
}

/** The directory of a file:// replica URL (the only kind the stand-ins support). */
export function backupDir(replicaURL) {
  if (!replicaURL?.startsWith('file://')) throw new Error(`only file:// replicas are supported: ${replicaURL}`);
  return fileURLToPath(replicaURL);
}

/** Go's strconv.FormatFloat(v, 'g', -1, 64), as client_golang writes sample values. */
export function goFloat(v) {
  if (v === 0) return '0';
  const exp = Math.floor(Math.log10(Math.abs(v)));
  if (exp < -4 || exp >= 6) {
    const [mantissa, e] = v.toExponential().split('e');
    const n = Number(e);
    return `${mantissa}e${n < 0 ? '-' : '+'}${String(Math.abs(n)).padStart(2, '0')}`;
  }
  return String(v);
}

/** The config's `addr` as [host, port] (an empty host is 127.0.0.1 here). */
export function splitAddr(addr) {
  const m = /^(.*):(\d+)$/.exec(addr ?? '');
  if (!m) throw new Error(`bad addr in litestream config: ${addr}`);
  return [m[1] === '' ? '127.0.0.1' : m[1].replace(/^\[|\]$/g, ''), Number(m[2])];
}

/**
 * Waits INTEROP_STANDIN_FIRST_UPLOAD_DELAY_MS (default 0) before `replicate` uploads anything, logging it first:
 * the metrics page is served meanwhile, without a progress gauge, and the destination stays empty.
 */
export async function holdFirstUpload(log) {
  const delay = Number(process.env.INTEROP_STANDIN_FIRST_UPLOAD_DELAY_MS ?? 0);
  if (delay > 0) {
    log(`holding the first upload back for ${delay} ms`);
    await sleep(delay);
  }
}

/**
 * Waits INTEROP_STANDIN_RESTORE_DELAY_MS (default 0) between taking the backup and putting the restored file in
 * place, logging first what was taken (`taken()`, asked only then): a slow restore, which delivers the backup as it
 * was when the restore began, however far the destination moves meanwhile.
 */
export async function holdRestore(log, taken) {
  const delay = Number(process.env.INTEROP_STANDIN_RESTORE_DELAY_MS ?? 0);
  if (delay > 0) {
    log(`restore: took the backup at ${taken()}; finishing in ${delay} ms`);
    await sleep(delay);
  }
}
