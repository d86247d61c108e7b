// The npm packages the shared harness (../lib) loads, resolved from this directory's node_modules (Zero 1.10's pins).
export {default as postgres} from 'postgres';
export {default as Database} from '@rocicorp/zero-sqlite3';
export {default as WebSocket} from 'ws';
export {LogContext} from '@rocicorp/logger';
