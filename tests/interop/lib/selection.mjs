// Which of a suite's scenarios a run registers: those of its shard (INTEROP_SHARD=k/n, which `make test` sets to
// spread each suite over the PostgreSQL majors: lib/versions.mjs `shardOf`) whose names match INTEROP_ONLY (a
// regular expression, for working on one scenario). Decided as each scenario is declared, so that a suite starts
// its main deployment only when a scenario that uses it runs: a shard of deployments of their own, or
// INTEROP_ONLY='^12\.', does not wait for one it never uses.
import {parseShard, shardOf, versionOf} from './versions.mjs';

/**
 * The selection of `version`'s suite for this run. `take(name)`: whether to register the scenario `name` (its
 * number is what precedes the first "."); a number the version's `suite` table does not list throws, since no
 * shard would run it. `main`: whether a scenario taken so far is one of the main deployment's.
 */
export function selection(version, env = process.env) {
  const {suite} = versionOf(version);
  const listed = new Set([...suite.main.scenarios, ...Object.keys(suite.own).map(Number)]);
  const shard = new Set(shardOf(version, ...parseShard(env.INTEROP_SHARD)).scenarios);
  const only = env.INTEROP_ONLY ? new RegExp(env.INTEROP_ONLY) : null;
  const sel = {
    main: false,
    take(name) {
      const number = Number(name.slice(0, name.indexOf('.')));
      if (!listed.has(number)) {
        throw new Error(`scenario '${name}' of Zero ${version}'s suite is in no group of its \`suite\` in ` +
          'tests/interop/lib/versions.mjs: no shard would run it');
      }
      const taken = shard.has(number) && (!only || only.test(name));
      if (taken && suite.main.scenarios.includes(number)) sel.main = true;
      return taken;
    },
  };
  return sel;
}
