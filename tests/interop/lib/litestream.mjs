// The real litestream (v0.3.13, scripts/install-litestream.sh) as the interop harness and its gauge exporter
// (litestream-gauge.mjs) run it: where the binary is, Zero's litestream config read and rewritten the way
// litestream reads it, the destination listed and restored with litestream's own commands, and the number and
// address formats of its metrics page. Node built-ins only: the exporter loads this for every command Zero runs.
import {execFile} from 'node:child_process';
import {existsSync, readFileSync} from 'node:fs';

/** The real litestream binary: $LITESTREAM_BIN (scripts/interop.sh and scripts/demo.sh set it). */
export function litestreamBin(env = process.env) {
  const bin = env.LITESTREAM_BIN;
  if (!bin || !existsSync(bin)) {
    throw new Error(`LITESTREAM_BIN must name the litestream binary (scripts/install-litestream.sh prints it); got ${bin}`);
  }
  return bin;
}

/** Go's os.ExpandEnv, as litestream applies it to its config: `${VAR}` and `$VAR`, unset variables empty. */
export function expandEnv(text, env = process.env) {
  return text.replace(/\$(?:\{([^}]*)\}|([A-Za-z0-9_]+))/g, (_, braced, bare) => env[braced ?? bare] ?? '');
}

/**
 * What the harness needs of a litestream config in Zero's format (services/litestream/config.yml: one db, one
 * replica), already expanded: the db `path`, the replica `url` and `name` (litestream names a replica after its
 * URL's scheme unless the config names it), and `addr`.
 */
export function parseConfig(text) {
  const value = key => text.match(new RegExp(`^\\s*(?:- )?${key}:[ \\t]*(\\S*)[ \\t]*$`, 'm'))?.[1] || undefined;
  const replicaURL = value('url');
  return {
    dbPath: value('path'),
    replicaURL,
    name: value('name') ?? replicaURL?.slice(0, replicaURL.indexOf(':')),
    addr: value('addr'),
  };
}

/** The config file a litestream command reads: `-config PATH` among `args`, else $LITESTREAM_CONFIG. */
export function configPathOf(args, env = process.env) {
  const i = args.indexOf('-config');
  return i >= 0 ? args[i + 1] : env.LITESTREAM_CONFIG || undefined;
}

/**
 * Endpoint settings for an S3-compatible destination that the config itself lacks (Zero 0.20's config.yml has no
 * `endpoint` or `region`): INTEROP_LITESTREAM_S3_ENDPOINT and INTEROP_LITESTREAM_S3_REGION, or null when unset.
 */
export function s3SettingsFromEnv(env = process.env) {
  const endpoint = env.INTEROP_LITESTREAM_S3_ENDPOINT;
  return endpoint ? {endpoint, region: env.INTEROP_LITESTREAM_S3_REGION || 'us-east-1'} : null;
}

/**
 * An expanded config with `addr` set (when given) and, for an s3:// replica without an endpoint of its own, the
 * `s3` settings added to the replica: `endpoint`, `region` and `force-path-style: true` (what litestream 0.3
 * takes for an S3-compatible server). Keys litestream 0.3 does not know (the fork's `watermark-table`, say) stay;
 * it ignores them.
 */
export function rewriteConfig(text, {addr, s3} = {}) {
  let out = text;
  if (addr !== undefined) {
    out = /^addr:.*$/m.test(out) ? out.replace(/^addr:.*$/m, `addr: ${addr}`) : `${out.replace(/\n*$/, '\n')}addr: ${addr}\n`;
  }
  const {replicaURL} = parseConfig(out);
  const hasEndpoint = /^\s*endpoint:[ \t]*\S+/m.test(out);
  if (s3 && replicaURL?.startsWith('s3://') && !hasEndpoint) {
    out = out.replace(/^[ \t]*(endpoint|region|force-path-style):.*\n/gm, '');
    out = out.replace(/^([ \t]*)- url:.*$/m, (line, indent) => {
      const pad = `${indent}  `;
      return `${line}\n${pad}endpoint: ${s3.endpoint}\n${pad}region: ${s3.region}\n${pad}force-path-style: true`;
    });
  }
  return out;
}

/** Reads and expands a config file. */
export function readConfig(path, env = process.env) {
  if (!path) throw new Error('no litestream config: neither -config nor LITESTREAM_CONFIG');
  return expandEnv(readFileSync(path, 'utf8'), env);
}

/** Runs the binary to its end: {code, signal, stdout, stderr}; never rejects for a non-zero exit. */
export function run(bin, args, {env = process.env, timeout = 30_000} = {}) {
  return new Promise(resolve => {
    execFile(bin, args, {env, timeout, killSignal: 'SIGKILL', maxBuffer: 16 << 20}, (err, stdout, stderr) => {
      resolve({
        code: err ? (typeof err.code === 'number' ? err.code : null) : 0,
        signal: err?.signal ?? null,
        error: err && typeof err.code !== 'number' && !err.signal ? err.message : null,
        stdout,
        stderr,
      });
    });
  });
}

/** A failed run, in one line for a log. */
export function failure(what, r) {
  const out = `${r.stderr}\n${r.stdout}`.trim().split('\n').filter(Boolean).slice(-3).join(' | ');
  return `${what} failed (${r.error ?? (r.signal ? `signal ${r.signal}` : `exit ${r.code}`)}): ${out}`;
}

/**
 * `litestream generations -config CONFIG DB`: the replica's generations, [{name, generation, start, end}], `end`
 * (the `created` time of its newest snapshot or WAL segment, RFC 3339 in whole seconds) as a Date. A generation
 * listed before its first object was uploaded (litestream prints Go's zero time, year 1, for its bounds) is left
 * out. Throws on failure.
 */
export async function listGenerations(bin, configPath, dbPath, {env} = {}) {
  const r = await run(bin, ['generations', '-config', configPath, dbPath], {env});
  if (r.code !== 0) throw new Error(failure('litestream generations', r));
  const rows = [];
  for (const line of r.stdout.split('\n')) {
    const cols = line.trim().split(/\s+/);
    if (cols.length < 5 || cols[0] === 'name') continue;
    const [name, generation] = cols;
    const [start, end] = cols.slice(-2).map(s => new Date(s));
    if (!/^[0-9a-f]{16}$/.test(generation) || !(end.getTime() > 0)) continue;
    rows.push({name, generation, start, end});
  }
  return rows;
}

/** The generation a restore of the latest backup uses: the one with the newest object (null when there is none). */
export function newestGeneration(generations) {
  return generations.reduce((best, g) => (best === null || g.end > best.end ? g : best), null);
}

/**
 * `litestream restore -config CONFIG [-generation G] -o OUT DB`: the destination (or one generation of it) restored
 * to OUT, which must not exist. Throws on failure; resolves to whether OUT exists (false: nothing to restore).
 */
export async function restoreTo(bin, configPath, dbPath, out, {generation, env} = {}) {
  const args = ['restore', '-config', configPath, ...(generation ? ['-generation', generation] : []), '-o', out, dbPath];
  const r = await run(bin, args, {env, timeout: 60_000});
  if (r.code !== 0) throw new Error(failure(`litestream ${args.join(' ')}`, r));
  return existsSync(out);
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

/** A config's `addr` as [host, port] (an empty host is 127.0.0.1 here). */
export function splitAddr(addr) {
  const m = /^(.*):(\d+)$/.exec(addr ?? '');
  if (!m) throw new Error(`bad addr in litestream config: ${addr}`);
  return [m[1] === '' ? '127.0.0.1' : m[1].replace(/^\[|\]$/g, ''), Number(m[2])];
}

/** A Prometheus label value, escaped. */
export function labelValue(s) {
  return String(s).replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}
