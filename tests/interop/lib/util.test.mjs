// The free ports the suites hand out (lib/util.mjs `freePort`) are held across processes: suites that run side by
// side never hand out one port twice, a port stays held while its process lives (also while what listens on it
// restarts), and the port of a process gone is handed out again. Run by scripts/interop.sh before the 1.10 suite
// (and by `node --test tests/interop/lib/util.test.mjs` anywhere); a few child processes, a second or two.
import {test} from 'node:test';
import assert from 'node:assert/strict';
import {spawn} from 'node:child_process';
import {existsSync, mkdtempSync, readFileSync, readdirSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';

// The held ports of this test only, so that suites running now are neither disturbed nor disturbing.
const dir = mkdtempSync(join(tmpdir(), 'interop-ports-test-'));
process.env.INTEROP_PORTS_DIR = dir;
const {freePort, reservePort} = await import('./util.mjs');
test.after(() => rmSync(dir, {recursive: true, force: true}));

const UTIL = new URL('./util.mjs', import.meta.url).href;

/**
 * A node process that holds `port` (or a port of its own from `freePort` when `port` is null), prints it, and
 * then waits for its stdin to close (or exits at once with `exit`).
 */
async function holder(port, {exit = false} = {}) {
  const script = `
    const {freePort, reservePort} = await import(${JSON.stringify(UTIL)});
    const port = ${port} ?? await freePort();
    console.log(JSON.stringify({port, held: ${port} === null || reservePort(port)}));
    ${exit ? '' : "process.stdin.resume(); process.stdin.on('end', () => process.exit(0));"}
  `;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
    env: {...process.env, INTEROP_PORTS_DIR: dir},
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout.setEncoding('utf8');
  const line = await new Promise((resolve, reject) => {
    child.stdout.on('data', chunk => {
      out += chunk;
      if (out.includes('\n')) resolve(JSON.parse(out.split('\n')[0]));
    });
    child.once('exit', code => reject(new Error(`the holder exited (${code}) before saying: ${out}`)));
  });
  const exited = new Promise(resolve => (child.exitCode !== null ? resolve() : child.once('exit', resolve)));
  return {...line, child, exited};
}

test('a port another live process holds is not handed out; once that process is killed it is taken over', async () => {
  const other = await holder(null);
  assert.equal(readFileSync(join(dir, String(other.port)), 'utf8'), String(other.child.pid));
  assert.equal(reservePort(other.port), false, 'held by a live process');
  other.child.kill('SIGKILL');
  await other.exited;
  // Killed, it could not release the port: its record names a process gone, which is taken over.
  assert.equal(readFileSync(join(dir, String(other.port)), 'utf8'), String(other.child.pid));
  assert.equal(reservePort(other.port), true, 'a dead process holds nothing');
  assert.equal(readFileSync(join(dir, String(other.port)), 'utf8'), String(process.pid));
});

test("a port this process holds is not another's, and freePort never hands it out again", async () => {
  const port = await freePort();
  const other = await holder(port);
  assert.equal(other.held, false, 'held here');
  other.child.stdin.end();
  await other.exited;
  assert.equal(readFileSync(join(dir, String(port)), 'utf8'), String(process.pid));
});

test('a process that exits releases what it held, ports reserved by number too', async () => {
  const other = await holder(null, {exit: true});
  await other.exited;
  assert.equal(existsSync(join(dir, String(other.port))), false, `${readdirSync(dir)}`);
  const port = other.port + 1;
  const byNumber = await holder(port, {exit: true});
  assert.equal(byNumber.held, true);
  await byNumber.exited;
  assert.equal(existsSync(join(dir, String(port))), false, `${readdirSync(dir)}`);
});
