// Preloaded into every Zero process of the interop tests (NODE_OPTIONS=--require): Zero binds its servers on all
// interfaces ("::"); this pins every TCP listener that names no specific address, or a wildcard one, to 127.0.0.1
// so that nothing the tests start is reachable from outside the machine.
'use strict';
const net = require('node:net');

const WILDCARDS = new Set([undefined, null, '', '::', '0.0.0.0', '::0', '[::]']);
const LOOPBACK = '127.0.0.1';
const original = net.Server.prototype.listen;

net.Server.prototype.listen = function listen(...args) {
  const [first] = args;
  if (first !== null && typeof first === 'object' && !(first instanceof net.Server) && first.path === undefined &&
      first.handle === undefined && first.fd === undefined) {
    if (WILDCARDS.has(first.host)) {
      args[0] = {...first, host: LOOPBACK, ipv6Only: false};
    }
  } else if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
    // listen(port[, host][, backlog][, callback])
    if (typeof args[1] !== 'string' || WILDCARDS.has(args[1])) {
      const rest = args.slice(typeof args[1] === 'string' ? 2 : 1);
      args = [Number(first), LOOPBACK, ...rest];
    }
  }
  return original.apply(this, args);
};
