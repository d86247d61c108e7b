//! What a change DB failure means: the error every operation returns and its class (heals by itself or not, and the
//! remedy). Apart from the handle, because metrics and logs need only this table, never the connection.

use std::fmt;

use tokio_postgres::error::SqlState;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// No connection right now; the supervisor is reconnecting.
    #[error("change DB unavailable: {reason}")]
    Unavailable { reason: String },
    /// The schema or a table is absent (SQLSTATE 3F000 / 42P01): Zero has not initialised the change DB yet.
    #[error(
        "change DB schema \"{schema}\" is missing or incomplete: Zero has not initialised it yet"
    )]
    SchemaMissing { schema: String },
    /// Any other failure of a statement, with what the sidecar was doing.
    #[error("change DB {context}: {}", with_cause(source))]
    Query {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

impl DbError {
    /// What kind of failure this is: whether it heals by itself, and what an operator should do if not.
    pub fn class(&self) -> FailureClass {
        match self {
            DbError::Unavailable { .. } => FailureClass::Unavailable,
            DbError::SchemaMissing { .. } => FailureClass::SchemaMissing,
            DbError::Query { source, .. } => match source.code() {
                Some(code) => FailureClass::of_sqlstate(code.code()),
                // No SQLSTATE: an I/O error or a closed connection rather than a rejected statement.
                None => FailureClass::Unavailable,
            },
        }
    }

    /// The SQLSTATE of a failed statement, if the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            DbError::Query { source, .. } => source.code().map(SqlState::code),
            _ => None,
        }
    }
}

/// Why a change DB operation failed, in the terms that decide what happens next: transient classes are retried
/// quietly on the next check; permanent ones will fail the same way until someone changes the database, its
/// permissions or the sidecar's configuration, so they are logged at error with what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// No connection: the server is down, restarting or unreachable. The supervisor reconnects.
    Unavailable,
    /// Zero's tables are not there yet; they appear when the replication-manager initialises the change DB.
    SchemaMissing,
    /// Serialization failures, deadlocks, lock timeouts, cancelled statements, server shutdown, exhausted
    /// resources (SQLSTATE classes 40, 53, 55P03, 57): the next attempt may succeed.
    Transient,
    /// The sidecar's role lacks a privilege, or was refused at login (42501, class 28).
    Permission,
    /// The server does not know a setting, function or type a statement uses (42704, 42883): a server version
    /// or build the sidecar does not support.
    UnsupportedServer,
    /// A column, table shape or type is not what Zero's schema has (other class 42 codes): the change DB was
    /// created by a Zero version the sidecar does not support, or altered by hand.
    SchemaMismatch,
    /// The connection is to a read-only server, such as a standby (25006).
    ReadOnly,
    /// Anything else the server rejected.
    Other,
}

impl FailureClass {
    /// Every variant, for pre-registering metric label values.
    pub const ALL: [FailureClass; 8] = [
        FailureClass::Unavailable,
        FailureClass::SchemaMissing,
        FailureClass::Transient,
        FailureClass::Permission,
        FailureClass::UnsupportedServer,
        FailureClass::SchemaMismatch,
        FailureClass::ReadOnly,
        FailureClass::Other,
    ];

    /// The class of a server error by its SQLSTATE (PostgreSQL's Appendix A).
    pub fn of_sqlstate(code: &str) -> FailureClass {
        match code {
            "42501" => FailureClass::Permission,
            "42704" | "42883" => FailureClass::UnsupportedServer,
            "3F000" | "42P01" => FailureClass::SchemaMissing,
            "25006" => FailureClass::ReadOnly,
            "55P03" => FailureClass::Transient,
            _ if code.starts_with("28") => FailureClass::Permission,
            _ if code.starts_with("42") => FailureClass::SchemaMismatch,
            _ if ["08", "40", "53", "57"].iter().any(|c| code.starts_with(c)) => {
                FailureClass::Transient
            }
            _ => FailureClass::Other,
        }
    }

    /// True when retrying will not help until someone changes something.
    pub fn is_permanent(self) -> bool {
        matches!(
            self,
            FailureClass::Permission
                | FailureClass::UnsupportedServer
                | FailureClass::SchemaMismatch
                | FailureClass::ReadOnly
        )
    }

    /// The snake_case value of the `class` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Unavailable => "unavailable",
            FailureClass::SchemaMissing => "schema_missing",
            FailureClass::Transient => "transient",
            FailureClass::Permission => "permission",
            FailureClass::UnsupportedServer => "unsupported_server",
            FailureClass::SchemaMismatch => "schema_mismatch",
            FailureClass::ReadOnly => "read_only",
            FailureClass::Other => "other",
        }
    }

    /// What an operator should do about a failure of this class.
    pub fn remedy(self) -> &'static str {
        match self {
            FailureClass::Unavailable => {
                "check that the change DB server is up and reachable from this host; the sidecar reconnects by itself"
            }
            FailureClass::SchemaMissing => {
                "start the replication-manager so that it initialises the change DB, and check zero.app_id and \
                 zero.shard_num"
            }
            FailureClass::Transient => "none needed if it clears; if it persists, look for long-held locks on changeLog",
            FailureClass::Permission => {
                "grant the sidecar's role SELECT, UPDATE and DELETE on the change DB schema's tables (it runs \
                 SELECT ... FOR UPDATE and DELETE on changeLog), or use the replication-manager's role"
            }
            FailureClass::UnsupportedServer => {
                "the server rejected a setting or function the sidecar uses: check that the PostgreSQL major is one \
                 the sidecar supports (15 to 18) and report the SQLSTATE and message"
            }
            FailureClass::SchemaMismatch => {
                "the change DB's tables are not shaped as the sidecar expects: check that the Zero version is one the \
                 sidecar supports and that zero.app_id names the right schema"
            }
            FailureClass::ReadOnly => {
                "change_db.url points at a read-only server (a standby?): point it at the primary"
            }
            FailureClass::Other => "report the SQLSTATE and message",
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error and its cause: tokio-postgres' `Display` omits the cause ("db error"), which carries the server's
/// message.
pub(super) fn with_cause(err: &tokio_postgres::Error) -> String {
    match std::error::Error::source(err) {
        Some(cause) => format!("{err}: {cause}"),
        None => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_without_a_connection_heal_by_themselves() {
        let down = DbError::Unavailable {
            reason: "connecting".into(),
        };
        assert_eq!(down.class(), FailureClass::Unavailable);
        assert!(!down.class().is_permanent());
        assert_eq!(down.sqlstate(), None);
        let missing = DbError::SchemaMissing {
            schema: "zero_0/cdc".into(),
        };
        assert_eq!(missing.class(), FailureClass::SchemaMissing);
        assert!(!missing.class().is_permanent());
        assert!(missing.to_string().contains("\"zero_0/cdc\""));
    }

    #[test]
    fn sqlstates_are_classified_by_whether_they_heal() {
        let cases = [
            // lock_timeout, serialization failure, deadlock, admin shutdown, too many connections.
            ("55P03", FailureClass::Transient),
            ("40001", FailureClass::Transient),
            ("40P01", FailureClass::Transient),
            ("57P01", FailureClass::Transient),
            ("53300", FailureClass::Transient),
            ("08006", FailureClass::Transient),
            // insufficient privilege, invalid password.
            ("42501", FailureClass::Permission),
            ("28P01", FailureClass::Permission),
            // "unrecognized configuration parameter" (lc_collate on PostgreSQL 16+), undefined function.
            ("42704", FailureClass::UnsupportedServer),
            ("42883", FailureClass::UnsupportedServer),
            // undefined column, datatype mismatch.
            ("42703", FailureClass::SchemaMismatch),
            ("42804", FailureClass::SchemaMismatch),
            ("42P01", FailureClass::SchemaMissing),
            ("3F000", FailureClass::SchemaMissing),
            ("25006", FailureClass::ReadOnly),
            ("XX000", FailureClass::Other),
        ];
        for (code, class) in cases {
            assert_eq!(FailureClass::of_sqlstate(code), class, "{code}");
        }
        let permanent: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| c.is_permanent())
            .collect();
        assert_eq!(
            permanent,
            [
                FailureClass::Permission,
                FailureClass::UnsupportedServer,
                FailureClass::SchemaMismatch,
                FailureClass::ReadOnly
            ]
        );
        for class in FailureClass::ALL {
            assert!(!class.remedy().is_empty());
        }
    }
}
