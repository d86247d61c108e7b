//! Every statement the change DB runs, built once from the quoted schema, and the probe that tells whether the
//! watermark column's collation orders as bytes.
//!
//! Text only, no I/O: the safety rules in the parent module hold or break in these strings, so the tests below
//! check them on the SQL itself, without a server.

/// Quotes an SQL identifier. Schema names cannot be bind parameters, and Zero's contains a slash; the only input
/// is validated config (`app_id` matches `^[a-z0-9_]+$`), and embedded quotes are doubled regardless.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Every statement, built once from the quoted schema.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) tables: [String; 3],
    pub(super) tables_present: String,
    pub(super) owner_address: String,
    pub(super) replica_version: String,
    pub(super) data_version: String,
    pub(super) adopt_address: String,
    pub(super) watermark_collation: String,
    /// PostgreSQL's row estimate for `changeLog` (`$1`: the quoted table); -1 before it was ever analyzed.
    pub(super) change_log_estimate: String,
    /// Counts `changeLog` rows, but no more than `$1`.
    pub(super) change_log_count: String,
    /// Whether this session holds the advisory lock `($1, $2)`. Asked rather than tracked, so that a reconnect
    /// (a new session, without the lock) cannot be missed.
    pub(super) holds_purger_lock: String,
    pub(super) try_purger_lock: String,
    /// Releases the lock `($1, $2)` only if this session holds it: unlocking a lock not held logs a server warning.
    pub(super) release_purger_lock: String,
    /// `"{app}_{shard}".replicas`, quoted: the upstream's table of replicas, visible here only when the upstream
    /// database is the change DB.
    pub(super) replicas: String,
    /// Which of the `replicas` columns that say where a replica backs up exist (`$1`: the upstream schema's name,
    /// unquoted): none while the table is absent (another database, or Zero before 1.10).
    pub(super) replica_columns: String,
    /// Statements that compare watermarks, in the column's collation: served by the primary-key index.
    pub(super) indexed: WatermarkSql,
    /// The same under `COLLATE "C"`, for a column whose collation does not order watermarks as bytes.
    pub(super) bytewise: WatermarkSql,
}

/// The statements whose result depends on how watermarks compare.
#[derive(Debug)]
pub(super) struct WatermarkSql {
    pub(super) min_watermark: String,
    pub(super) max_watermark: String,
    pub(super) lock_head: String,
    pub(super) purge_batch: String,
    /// Whether the log holds a row at or past `$1`.
    pub(super) reaches: String,
}

impl WatermarkSql {
    /// `collate` is empty (the column's collation) or ` COLLATE "C"`.
    fn new(change_log: &str, collate: &str) -> WatermarkSql {
        let w = format!("watermark{collate}");
        WatermarkSql {
            min_watermark: format!("SELECT min({w}) FROM {change_log}"),
            max_watermark: format!("SELECT max({w}) FROM {change_log}"),
            // An incoming replication-manager holds FOR SHARE on this row until it owns the log (docs/protocol.md,
            // "Ownership").
            lock_head: format!(
                "SELECT watermark FROM {change_log} ORDER BY {w}, pos LIMIT 1 FOR UPDATE NOWAIT"
            ),
            // One bounded batch, never at the newest watermark (docs/protocol.md, "Purging the newest
            // transaction"). The rows are picked along the
            // (watermark, pos) primary key and deleted by their tuple ids: with `(watermark, pos) IN (…)` the
            // planner hash-joins against a sequential scan of the whole log for every batch. Tuple ids are stable
            // here: change-log rows are never updated, and a row deleted concurrently is simply skipped.
            purge_batch: format!(
                "DELETE FROM {change_log} WHERE ctid = ANY (ARRAY(
                   SELECT ctid FROM {change_log}
                    WHERE {w} < $1 AND {w} < (SELECT max({w}) FROM {change_log})
                    ORDER BY {w}, pos LIMIT $2))"
            ),
            // Under `COLLATE "C"` no index serves the range: the exact watermark is looked up first (equality is
            // byte equality in every deterministic collation, so the index serves it), and the range is scanned
            // only when it is absent.
            reaches: if collate.is_empty() {
                format!("SELECT EXISTS (SELECT 1 FROM {change_log} WHERE {w} >= $1)")
            } else {
                format!(
                    "SELECT EXISTS (SELECT 1 FROM {change_log} WHERE watermark = $1) \
                     OR EXISTS (SELECT 1 FROM {change_log} WHERE {w} >= $1)"
                )
            },
        }
    }
}

impl Sql {
    /// `schema` is the change DB's, `upstream` the shard's schema in the upstream database.
    pub(super) fn new(schema: &str, upstream: &str) -> Sql {
        let table = |name: &str| format!("{}.{}", quote_ident(schema), quote_ident(name));
        let change_log = table("changeLog");
        let replication_state = table("replicationState");
        let replication_config = table("replicationConfig");
        let version_history = table("versionHistory");
        Sql {
            tables_present: "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
                             AND to_regclass($3) IS NOT NULL"
                .into(),
            owner_address: format!(r#"SELECT "ownerAddress", "owner" FROM {replication_state}"#),
            replica_version: format!(r#"SELECT "replicaVersion" FROM {replication_config}"#),
            data_version: format!(r#"SELECT "dataVersion" FROM {version_history}"#),
            // Matches no row unless the address must change: no row version, so no conflict with the storer's
            // SERIALIZABLE transaction (docs/protocol.md, "Writing ownerAddress under a serializable storer").
            // `owner` is never written.
            adopt_address: format!(
                r#"UPDATE {replication_state} SET "ownerAddress" = $2
                    WHERE "ownerAddress" = $1 AND "ownerAddress" IS DISTINCT FROM $2"#
            ),
            watermark_collation: WATERMARK_COLLATION.into(),
            change_log_estimate:
                "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass($1)".into(),
            change_log_count: format!(
                "SELECT count(*) FROM (SELECT 1 FROM {change_log} LIMIT $1) AS counted"
            ),
            holds_purger_lock: format!("SELECT {HOLDS_LOCK}"),
            // The two-int4 form, whose keys `pg_locks` shows as `classid`/`objid` with `objsubid` 2.
            try_purger_lock: "SELECT pg_try_advisory_lock($1::int4, $2::int4)".into(),
            release_purger_lock: format!(
                "SELECT CASE WHEN {HOLDS_LOCK} THEN pg_advisory_unlock($1::int4, $2::int4) ELSE false END"
            ),
            replicas: format!("{}.{}", quote_ident(upstream), quote_ident("replicas")),
            // By name through the catalogs, which every role may read: no lookup that a schema without USAGE could
            // turn into an error.
            replica_columns: "SELECT a.attname::text FROM pg_attribute a \
                              JOIN pg_class c ON c.oid = a.attrelid \
                              JOIN pg_namespace n ON n.oid = c.relnamespace \
                              WHERE n.nspname = $1 AND c.relname = 'replicas' AND c.relkind IN ('r', 'p') \
                              AND a.attname IN ('id', 'slot', 'backupPath', 'backupV5') AND a.attnum > 0 \
                              AND NOT a.attisdropped"
                .into(),
            indexed: WatermarkSql::new(&change_log, ""),
            bytewise: WatermarkSql::new(&change_log, r#" COLLATE "C""#),
            tables: [change_log, replication_state, replication_config],
        }
    }
}

/// The rows of `replicas` (quoted) that say a replica backs up to a path of its own or with litestream 0.5, from
/// `columns`, the ones [`Sql::replica_columns`] found; `None` when neither of the two columns exists (Zero before
/// 1.10: every replica backs up to the backup URL itself). `backupPath` came in Zero's shard schema v24, `backupV5`
/// in v25: either may be there alone.
pub(super) fn replica_backups(replicas: &str, columns: &[String]) -> Option<String> {
    let has = |name: &str| columns.iter().any(|c| c == name);
    if !has("backupPath") && !has("backupV5") {
        return None;
    }
    let id = if has("id") {
        "id::text"
    } else if has("slot") {
        "slot::text"
    } else {
        "''::text"
    };
    let path = if has("backupPath") {
        r#""backupPath"::text"#
    } else {
        "NULL::text"
    };
    let v5 = if has("backupV5") {
        r#"coalesce("backupV5", false)"#
    } else {
        "false"
    };
    Some(format!(
        "SELECT {id}, {path}, {v5} FROM {replicas} WHERE {path} IS NOT NULL OR {v5} ORDER BY 1"
    ))
}

/// This session holds the two-int4 advisory lock `($1, $2)`. `pg_locks` shows its keys as `oid`: the cast keeps
/// their bits, so a negative key matches as the large oid the server stored.
const HOLDS_LOCK: &str = "EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() \
                          AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2 AND granted)";

/// The collation of `changeLog.watermark`, quoted by the server, and the name to log (`$1`: the quoted table).
///
/// The database default is named from `pg_database`: the `lc_collate` setting was removed in PostgreSQL 16, and
/// the ICU locale column was renamed in 17 (`daticulocale` to `datlocale`), so only columns that every supported
/// major (15 to 18) has are read. The name is for logs only: whether the collation orders watermarks as bytes is
/// decided by [`byte_order_probe`], never by its name.
const WATERMARK_COLLATION: &str = r#"
    SELECT quote_ident(n.nspname) || '.' || quote_ident(c.collname),
           CASE WHEN c.collname <> 'default' THEN c.collname
                ELSE (SELECT 'database default, '
                             || CASE d.datlocprovider WHEN 'i' THEN 'icu' WHEN 'b' THEN 'builtin' ELSE 'libc' END
                             || ' provider, datcollate ' || d.datcollate
                        FROM pg_database d WHERE d.datname = current_database())
           END
      FROM pg_attribute a
      JOIN pg_collation c ON c.oid = a.attcollation
      JOIN pg_namespace n ON n.oid = c.collnamespace
     WHERE a.attrelid = to_regclass($1) AND a.attname = 'watermark'"#;

/// True when `collation` sorts every string of one to three characters from `[0-9a-z]` exactly as bytes: the alphabet
/// of LexiVersions (docs/protocol.md, "Collations that do not sort watermarks as bytes"). This catches the collations
/// that do not, such as Danish ("aa" after "z"), Estonian ("z" before "t") or numeric ordering ("9" before "10").
pub(super) fn byte_order_probe(collation: &str) -> String {
    format!(
        r#"WITH c(ch) AS (SELECT chr(x) FROM generate_series(48, 57) x
                          UNION ALL SELECT chr(x) FROM generate_series(97, 122) x),
                s(w) AS (SELECT ch FROM c
                         UNION ALL SELECT a.ch || b.ch FROM c a, c b
                         UNION ALL SELECT a.ch || b.ch || d.ch FROM c a, c b, c d)
           SELECT array_agg(w ORDER BY w COLLATE {collation}) = array_agg(w ORDER BY w COLLATE "C") FROM s"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::shard::ZeroConfig;

    #[test]
    fn schema_is_quoted_with_its_slash() {
        let sql = Sql::new(
            &ZeroConfig {
                app_id: "zero".into(),
                shard_num: 0,
            }
            .cdc_schema(),
            "zero_0",
        );
        assert_eq!(
            sql.owner_address,
            r#"SELECT "ownerAddress", "owner" FROM "zero_0/cdc"."replicationState""#
        );
        assert_eq!(sql.tables[0], r#""zero_0/cdc"."changeLog""#);
        assert!(sql
            .indexed
            .purge_batch
            .contains(r#"DELETE FROM "zero_0/cdc"."changeLog""#));
    }

    #[test]
    fn replica_backups_are_read_from_whichever_columns_exist() {
        let sql = Sql::new("zero_0/cdc", "zero_0");
        assert_eq!(sql.replicas, r#""zero_0"."replicas""#);
        let columns = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        // Zero <= 1.9: neither column, nothing to read.
        assert_eq!(
            replica_backups(&sql.replicas, &columns(&["id", "slot"])),
            None
        );
        assert_eq!(
            replica_backups(
                &sql.replicas,
                &columns(&["id", "slot", "backupPath", "backupV5"])
            )
            .unwrap(),
            r#"SELECT id::text, "backupPath"::text, coalesce("backupV5", false) FROM "zero_0"."replicas" WHERE "backupPath"::text IS NOT NULL OR coalesce("backupV5", false) ORDER BY 1"#
        );
        // Shard schema v24 only: the path without the flag.
        assert_eq!(
            replica_backups(&sql.replicas, &columns(&["slot", "backupPath"])).unwrap(),
            r#"SELECT slot::text, "backupPath"::text, false FROM "zero_0"."replicas" WHERE "backupPath"::text IS NOT NULL OR false ORDER BY 1"#
        );
    }

    #[test]
    fn reaching_a_watermark_uses_the_index_where_it_can() {
        let sql = Sql::new("zero_0/cdc", "zero_0");
        assert_eq!(
            sql.indexed.reaches,
            r#"SELECT EXISTS (SELECT 1 FROM "zero_0/cdc"."changeLog" WHERE watermark >= $1)"#
        );
        assert!(sql
            .bytewise
            .reaches
            .contains(r#"WHERE watermark = $1) OR EXISTS"#));
        assert!(sql
            .bytewise
            .reaches
            .contains(r#"WHERE watermark COLLATE "C" >= $1)"#));
    }

    #[test]
    fn quotes_inside_identifiers_are_doubled() {
        assert_eq!(quote_ident(r#"a"b"#), r#""a""b""#);
        assert_eq!(quote_ident("zero_3/cdc"), r#""zero_3/cdc""#);
    }

    #[test]
    fn purge_never_reaches_the_newest_watermark() {
        let sql = Sql::new("zero_0/cdc", "zero_0");
        assert!(sql
            .indexed
            .purge_batch
            .contains(r#"watermark < (SELECT max(watermark) FROM "zero_0/cdc"."changeLog")"#));
        assert!(sql.indexed.purge_batch.contains("LIMIT $2"));
        assert!(sql.bytewise.purge_batch.contains(
            r#"watermark COLLATE "C" < (SELECT max(watermark COLLATE "C") FROM "zero_0/cdc"."changeLog")"#
        ));
        assert!(sql
            .bytewise
            .lock_head
            .contains(r#"ORDER BY watermark COLLATE "C", pos"#));
    }

    #[test]
    fn address_update_never_writes_owner_and_skips_no_ops() {
        let sql = Sql::new("zero_0/cdc", "zero_0");
        assert!(!sql.adopt_address.contains(r#""owner" "#));
        assert!(!sql.adopt_address.contains(r#""owner"="#));
        assert!(sql
            .adopt_address
            .contains(r#""ownerAddress" IS DISTINCT FROM $2"#));
    }
}
