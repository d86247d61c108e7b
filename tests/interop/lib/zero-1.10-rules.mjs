// Zero 1.10's rules for backups, readiness, snapshot statuses and change-log purges, written from the tagged
// source (rocicorp/mono at zero/v1.10.0-canary.2, paths under packages/zero-cache/src, line numbers at that tag) and
// corrected to what Zero 1.10.0 built from 23da5f1c does (the zero-1.10 suite runs it): the readiness gate opens on
// the first watermark (the stricter rule of rocicorp/mono#6465 is kept as `readyWithPin`, not in that build), and
// watermarks that do not advance are ignored. The 1.9 suite drives it against the sidecar's real proxy page, the real backup
// destination and the real change log (zero-1.9/interop.test.mjs, scenario 11); lib/zero-1.10-rules.test.mjs
// checks the model itself.
//
// Pure: no I/O and no timers. The caller passes what Zero would read (the progress samples of a metrics page, the
// time of the newest object in the destination, the change log's watermarks, the subscribers' acks) and the time.
// Watermarks compare as strings, as Zero compares them (they sort lexically).

/** How often the poller reads litestream's page: litestream3-prometheus-poller.ts:16 (`setInterval`, :166-169). */
export const CHECK_INTERVAL_MS = 10_000;
/** Clock skew allowed between a claimed backup time and the destination's times: litestream3-prometheus-poller.ts:22. */
export const BACKUP_VERIFICATION_SLACK_MS = 60_000;
/** How long claims may stay ahead of the destination before the process shuts down: litestream3-prometheus-poller.ts:45. */
export const WEDGED_SHUTDOWN_GRACE_MS = 15 * 60_000;
/** The wait for a first restorable backup, per 50 GiB of replica: litestream3-prometheus-poller.ts:63-64. */
export const INITIAL_BACKUP_GRACE_MS_PER_UNIT = 60 * 60_000;
export const INITIAL_BACKUP_GRACE_UNIT_BYTES = 50 * 1024 ** 3;
/**
 * The delay before a purge after a new backup watermark: change-streamer-service.ts:1255 (three times
 * DEFAULT_MAX_RETRY_DELAY_MS, 10 s at services/running-state.ts:9), used at :890-897.
 */
export const CLEANUP_DELAY_MS = 30_000;

/** The smallest of some watermarks (Zero's `min` over strings). */
export function minWatermark(...watermarks) {
  return watermarks.reduce((a, b) => (b < a ? b : a));
}

/**
 * The replication-manager's Litestream3PrometheusPoller (services/change-streamer/litestream3-prometheus-poller.ts):
 * one `check` is one run of `checkVerifyAndPublishWatermarks` (:192-208).
 */
export class BackupPoller {
  /**
   * @param startedAt when `start()` ran (:162-171): the initial-backup deadline counts from it
   */
  constructor({startedAt = 0} = {}) {
    this.startedAt = startedAt;
    /** Claimed watermarks not yet published, with their claimed backup time in ms (`#watermarks`, :107). */
    this.recorded = new Map();
    /** The last published watermark (`#lastWatermark`, :120). */
    this.lastWatermark = '';
    /** The newest upload time a verification found, ms, or null (`#lastVerifiedUploadTime`, :127). */
    this.lastVerifiedUpload = null;
    /** Since when the destination has been continuously behind the claims, ms, or null (`#backupStaleSince`, :132). */
    this.staleSince = null;
    /** The error that ended the poller's stream (and so the process), or null: `{kind, message}`. */
    this.failed = null;
  }

  /**
   * `#checkWatermarks` (:256-268): each sample whose watermark is above the last published one and not recorded yet
   * is recorded with its claimed time (the sample's value, epoch seconds); Zero logs it as `replicated watermark=W to
   * NAME at TIME.`. Samples without a watermark label are skipped (`#fetchWatermarks`, :243-250). `samples` is null
   * when the page could not be read (:218-235: logged, nothing recorded). Returns what was recorded.
   */
  record(samples) {
    const recorded = [];
    for (const {watermark, value} of samples ?? []) {
      if (!watermark) continue;
      if (watermark > this.lastWatermark && !this.recorded.has(watermark)) {
        const timeMs = Number(value) * 1000;
        this.recorded.set(watermark, timeMs);
        recorded.push({watermark, timeMs});
      }
    }
    return recorded;
  }

  /** `#maxBackupBefore` (:459-474): the newest recorded watermark claimed at or before `cutoff`, or null. */
  maxBackupBefore(cutoff) {
    let max = '';
    let time;
    for (const [watermark, timeMs] of this.recorded) {
      if (timeMs <= cutoff && watermark > max) {
        max = watermark;
        time = timeMs;
      }
    }
    return time === undefined ? null : {watermark: max, backupTimeMs: time};
  }

  /** `#confirmedDurable` (:483-490): an upload was verified at or after `claimedMs`, less the slack. */
  confirmedDurable(claimedMs) {
    return this.lastVerifiedUpload !== null && claimedMs <= this.lastVerifiedUpload + BACKUP_VERIFICATION_SLACK_MS;
  }

  /**
   * `#publishVerifiedWatermarks` (:270-340) at `now`. `verify()` is the BackupStateVerifier (:81): it resolves to the
   * time (ms) of the newest object the destination lists (services/litestream/commands.ts:443-463, `litestream
   * snapshots` and `wal`, the newest `created` of all) and rejects when nothing is listed or the listing fails.
   * Resolves to what happened:
   * - `{kind: 'none'}`: no recorded watermark is claimed at or before `now`;
   * - `{kind: 'verification-failed', watermark, error}`: the listing failed; nothing published (:285-299);
   * - `{kind: 'stale', watermark, staleForMs}`: every claim is more than the slack after the newest upload; the
   *   stale clock runs (:306-325), and `{kind: 'wedged', …}` once it has run for WEDGED_SHUTDOWN_GRACE_MS (:372-388);
   * - `{kind: 'published', watermark, backupTimeMs}`: the newest verified claim goes to the backup monitor, and it
   *   and every recorded watermark below it are forgotten (:326-339).
   */
  async publish(now, verify) {
    if (this.failed) return {kind: this.failed.kind, message: this.failed.message};
    const maxBackup = this.maxBackupBefore(now);
    if (!maxBackup) return {kind: 'none'};
    const {watermark: maxWatermark, backupTimeMs: claimedMs} = maxBackup;
    if (!this.confirmedDurable(claimedMs)) {
      try {
        this.lastVerifiedUpload = await verify();
      } catch (e) {
        return {kind: 'verification-failed', watermark: maxWatermark, error: e?.message ?? String(e)};
      }
    }
    const lastUpload = this.lastVerifiedUpload;
    const verified = this.maxBackupBefore(lastUpload + BACKUP_VERIFICATION_SLACK_MS);
    if (!verified) {
      if (this.staleSince === null) this.staleSince = now;
      const staleForMs = now - this.staleSince;
      if (staleForMs >= WEDGED_SHUTDOWN_GRACE_MS) {
        this.failed = {kind: 'wedged', message: `backup is wedged: litestream claims ${maxWatermark} at ` +
          `${new Date(claimedMs).toISOString()}, the last upload was at ${new Date(lastUpload).toISOString()}, ` +
          `stale for ${staleForMs} ms`};
        return {kind: 'wedged', watermark: maxWatermark, staleForMs, message: this.failed.message};
      }
      return {kind: 'stale', watermark: maxWatermark, claimedMs, lastUploadMs: lastUpload, staleForMs};
    }
    this.staleSince = null;
    for (const watermark of [...this.recorded.keys()]) {
      if (watermark <= verified.watermark) this.recorded.delete(watermark);
    }
    this.lastWatermark = verified.watermark;
    return {kind: 'published', ...verified};
  }

  /**
   * `#checkInitialBackupDeadline` (:399-414) with `#initialBackupGraceMs` (:421-433): without any verified upload
   * by the grace after start (one hour per 50 GiB of replica, at least one), one last listing, and the process
   * shuts down if it finds nothing. Resolves to `{kind: 'no-initial-backup', …}` then, else null.
   */
  async checkInitialDeadline(now, verify, replicaBytes = 0) {
    if (this.failed) return null;
    if (this.lastVerifiedUpload !== null) return null;
    const units = Math.max(1, Math.ceil(replicaBytes / INITIAL_BACKUP_GRACE_UNIT_BYTES));
    const graceMs = units * INITIAL_BACKUP_GRACE_MS_PER_UNIT;
    if (now - this.startedAt < graceMs) return null;
    try {
      this.lastVerifiedUpload = await verify();
      return null;
    } catch {
      this.failed = {kind: 'no-initial-backup', message: `no restorable backup within ${now - this.startedAt} ms of startup`};
      return {kind: 'no-initial-backup', message: this.failed.message};
    }
  }

  /**
   * One check (`checkVerifyAndPublishWatermarks`, :192-208): record the page's samples, publish, then the
   * initial-backup deadline. Returns `{recorded, outcome, deadline}`.
   */
  async check({now, samples, verify, replicaBytes = 0}) {
    const recorded = this.failed ? [] : this.record(samples);
    const outcome = await this.publish(now, verify);
    const deadline = await this.checkInitialDeadline(now, verify, replicaBytes);
    return {recorded, outcome, deadline};
  }
}

/**
 * Whether the replication-manager waits for a first backup before it reports ready:
 * services/change-source/pg/change-source.ts:234-239, after an initial sync, or when it backs up elsewhere than it
 * restored from (a v5 backup path). A legacy (litestream 0.3) replica has no backup path (null) either way.
 */
export function waitsForBackupBeforeServing({initialSync, backupPath = null, restoredBackupPath = null}) {
  return initialSync || backupPath !== restoredBackupPath;
}

/**
 * The BackupMonitor (services/change-streamer/backup-monitor.ts) and the readiness gate in front of it
 * (server/change-streamer.ts:347-358: with `waitForFirstBackupBeforeServing` the process sends `ready`, and answers
 * `/` and `/keepalive`, once `firstBackupReceived()` resolves, else at once).
 *
 * As Zero 1.10.0 runs (built from rocicorp/mono at 23da5f1c, the interop suite's zero-1.10): the first watermark of
 * any value opens the gate, as at canary.2; a later watermark below or equal to the latest one is ignored
 * ("ignoring earlier backup watermark", "ignoring redundant backup watermark": it never becomes the backup watermark,
 * rocicorp/mono#6391). The pin of rocicorp/mono#6465, which holds the gate until a watermark reaches the replica's
 * start-up `stateVersion`, is not in that build: `readyWithPin` follows it, for a later release.
 */
export class BackupMonitor {
  /**
   * @param waitForBackupBeforeServing see `waitsForBackupBeforeServing`
   * @param startupStateVersion the replica's `stateVersion` when the replication-manager started serving (#6465)
   */
  constructor({waitForBackupBeforeServing, startupStateVersion}) {
    this.wait = waitForBackupBeforeServing;
    this.startupStateVersion = startupStateVersion;
    /** The latest backed-up watermark handed to the change-streamer (`#latestBackup`), or undefined. */
    this.backupWatermark = undefined;
    /** Zero 1.10.0's gate (and canary.2's): open from the first watermark. */
    this.ready = !this.wait;
    this.readyAtCanary2 = this.ready;
    /** #6465's gate: open from the first watermark at or above the start-up stateVersion. */
    this.readyWithPin = this.ready;
  }

  /**
   * A published watermark arrives (`run`): the first one, or one above the latest, becomes the change-streamer's
   * backup watermark (`trackBackupWatermark`); others are ignored. Returns whether this one opened the gate.
   */
  receive(watermark) {
    const wasReady = this.ready;
    this.ready = true;
    this.readyAtCanary2 = true;
    if (watermark >= this.startupStateVersion) this.readyWithPin = true;
    if (this.backupWatermark === undefined || watermark > this.backupWatermark) this.backupWatermark = watermark;
    return !wasReady;
  }
}

/**
 * `#confirmReservations` (change-streamer-service.ts:861-877, with `#getChangeLogState`, :922-936, and
 * SnapshotReservations.confirm, snapshot-reservations.ts:79-88 and :122-132): a reservation waiting for its status
 * is confirmed only once there is a backup watermark B and the change log's oldest watermark (the replica version
 * when the log is empty) is at or below it; the status then says `minWatermark: B`, and the reservation keeps every
 * row from B. Returns null while there is no backup watermark (the reservation waits for the next one), `{confirmed:
 * false, changeLogMin, backupWatermark}` when the log starts past it (Zero logs an error and waits for the next
 * backup), or `{confirmed: true, status}`.
 */
export function confirmReservation({backupWatermark, changeLogMin, replicaVersion, backupURL}) {
  if (!backupWatermark) return null;
  const min = changeLogMin ?? replicaVersion;
  if (min <= backupWatermark) {
    return {confirmed: true, status: {tag: 'status', backupURL, replicaVersion, minWatermark: backupWatermark}};
  }
  return {confirmed: false, changeLogMin: min, backupWatermark};
}

/**
 * `#getCleanupFloor` (change-streamer-service.ts:938-961): the lowest of the backup watermark, every connected
 * subscriber's ack (`#forwarder.getAcks()`) and every confirmed reservation's watermark
 * (snapshot-reservations.ts:90-95).
 */
export function cleanupFloor({backupWatermark, acks = [], reserved = []}) {
  return minWatermark(backupWatermark, ...acks, ...reserved);
}

/**
 * How many rows `purgeRecordsBefore(floor)` deletes (storer.ts:316-355): those below the floor, except the newest
 * transaction, which is always kept (:337-343). `log` is the change log as [{watermark, rows}].
 */
export function rowsPurgedBy(floor, log) {
  if (log.length === 0) return 0;
  const newest = log.reduce((m, r) => (r.watermark > m ? r.watermark : m), '');
  return log.filter(r => r.watermark < floor && r.watermark < newest).reduce((n, r) => n + r.rows, 0);
}

/**
 * The PostgreSQL change log's purge loop: `#maybeSchedulePGPurge` (change-streamer-service.ts:879-898) and
 * `#purgePGChangeLog` (:963-992). A backup watermark above the last purge schedules a purge CLEANUP_DELAY_MS
 * later; when it runs, it purges below the cleanup floor if that is above the last purge, then schedules again
 * while the backup is still ahead.
 */
export class PgPurger {
  constructor() {
    /** The floor of the last purge (`#pgPurgedWatermark`, :399). */
    this.purgedWatermark = '';
    /** When the scheduled purge runs, ms, or null (`#pgPurgeScheduled`). */
    this.dueAt = null;
  }

  /** `trackBackupWatermark` (:843-851) calls `#maybeSchedulePGPurge`. */
  maybeSchedule(now, backupWatermark) {
    if (this.dueAt !== null || backupWatermark === undefined || this.purgedWatermark >= backupWatermark) return;
    this.dueAt = now + CLEANUP_DELAY_MS;
  }

  /** Whether the scheduled purge runs at `now`. */
  due(now) {
    return this.dueAt !== null && now >= this.dueAt;
  }

  /**
   * Runs the scheduled purge: returns `{floor, purges}` (`purges`: false when the floor is not above the last purge,
   * :978-980) and schedules the next one.
   */
  run(now, {backupWatermark, acks = [], reserved = []}) {
    this.dueAt = null;
    const floor = cleanupFloor({backupWatermark, acks, reserved});
    const purges = floor > this.purgedWatermark;
    if (purges) this.purgedWatermark = floor;
    this.maybeSchedule(now, backupWatermark);
    return {floor, purges};
  }
}
