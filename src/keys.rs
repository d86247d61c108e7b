//! How a component reads its section of `sidecar.toml`: each key once, where the component declares it, with its
//! default and its checks; every problem is collected, so an operator fixes the file in one pass.
//!
//! A component's `read` takes a [`Section`] and asks it for each key with [`Section::get`]. Values arrive from the
//! file (typed TOML) or from environment overrides (always text), so a number, a boolean or a list may come as text
//! and is read as the same value. What a component reads is also what `--print-config` shows: the effective value
//! of every key, defaults included, with secrets hidden where the component says so ([`Section::redact`]).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Declares a component's config section: its typed struct and `read`, each key once with its default, its checks
/// and its meaning.
///
/// ```ignore
/// keys::section! {
///     /// `[relay]`: ...
///     pub struct ExampleConfig(s) {
///         /// What the key means to an operator.
///         max_pending_commits: usize = key(4096u64, |n: u64| usize::try_from(n).map_err(|e| e.to_string())),
///         /// ...
///         suppress_upstream_cleanup: bool = key(true),
///         /// What the field is to the code.
///         tls: Option<Files> = from(files(s)) reads {
///             /// What the key means to an operator.
///             tls_cert_file,
///             /// ...
///             tls_key_file,
///         },
///     }
/// }
/// ```
/// `key(default, check)` reads the key named as the field (`check` takes the raw value: a `String` for text,
/// `u64`, `i64`, `bool`, an enum, a `Vec<String>`); `key(default)` takes it as it is; `from(expr)` computes a field
/// from other keys or from earlier fields, which are in scope as `Option`s (`None`: their problem is recorded).
/// `key(default, check, hide = f)` shows the value through `f` in the printed config (a secret).
/// Extra arguments of `read` follow the section's name: `(s, backup_url: Option<&str>)` after the struct's name.
///
/// A key's doc comment is its meaning, the one text that `sidecar.toml` and docs/configuration.md repeat
/// ([`crate::config::reference`]): a `key` field without one does not compile, and a `from` field names the keys it
/// reads itself after `reads`, each under its doc comment. `keys()` lists them in the order declared.
macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident ($s:ident $(, $arg:ident : $argty:ty)*) {
            $(
                $(#[doc = $doc:literal])*
                $field:ident : $ty:ty = $how:ident ( $($tt:tt)* ) $(reads { $($reads:tt)* })?,
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl $name {
            /// The file that declares the section's keys, named wherever their meanings are checked.
            pub const DECLARED_IN: &'static str = file!();

            /// Reads the section's keys; `None` when any had a problem (each is recorded in the section).
            pub fn read($s: &mut $crate::keys::Section<'_> $(, $arg: $argty)*) -> Option<Self> {
                $( let $field: Option<$ty> = $crate::keys::section!(@field $s, $field, $how ( $($tt)* )); )*
                Some(Self { $( $field: $field?, )* })
            }

            /// Every key an operator sets in this section, in the order declared, with its meaning.
            pub fn keys() -> Vec<$crate::keys::KeyDoc> {
                let fields: &[&[$crate::keys::KeyDoc]] =
                    &[$( $crate::keys::section!(@doc $field, $how, [$($doc)*], [$($($reads)*)?]), )*];
                fields.concat()
            }
        }
    };
    (@field $s:ident, $field:ident, key ( $default:expr, $check:expr, hide = $hide:expr $(,)? )) => {{
        let value = $s.get(stringify!($field), ($default).into(), $check);
        $s.redact(stringify!($field), $hide);
        value
    }};
    (@field $s:ident, $field:ident, key ( $default:expr, $check:expr $(,)? )) => {
        $s.get(stringify!($field), ($default).into(), $check)
    };
    (@field $s:ident, $field:ident, key ( $default:expr $(,)? )) => {
        $s.value(stringify!($field), ($default).into())
    };
    (@field $s:ident, $field:ident, from ( $e:expr $(,)? )) => {
        $e
    };
    (@doc $field:ident, key, [$($doc:literal)+], []) => {
        &[$crate::keys::KeyDoc { name: stringify!($field), doc: &[$($doc),+] }]
    };
    (@doc $field:ident, from, [$($doc:literal)*], [$( $(#[doc = $kdoc:literal])+ $key:ident ),* $(,)?]) => {
        &[$( $crate::keys::KeyDoc { name: stringify!($key), doc: &[$($kdoc),+] } ),*]
    };
    (@doc $field:ident, $how:ident, [$($doc:literal)*], [$($reads:tt)*]) => {
        compile_error!(concat!(
            "config field `", stringify!($field), "`: a `key` field needs a doc comment, the key's meaning in \
             sidecar.toml and docs/configuration.md, and reads nothing else; a `from` field's `reads { ... }` needs \
             one above each key it names"
        ))
    };
}
pub(crate) use section;

/// A key as its section declares it: its name and its doc comment, line by line as written (each line as `///`
/// hands it over, with the space after the slashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    pub name: &'static str,
    pub doc: &'static [&'static str],
}

/// One problem with one key (`section.key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct KeyError {
    pub key: String,
    pub problem: String,
}

/// One section of the merged file and environment, as read by its component.
pub struct Section<'a> {
    name: &'static str,
    table: toml::Table,
    read: BTreeSet<String>,
    problems: &'a mut Vec<KeyError>,
    shown: toml::Table,
    /// Keys shown through their component's own [`Section::redact`].
    hidden: BTreeSet<&'static str>,
}

impl<'a> Section<'a> {
    /// `table` is the section as written (empty when absent); problems go to `problems`.
    pub fn new(name: &'static str, table: toml::Table, problems: &'a mut Vec<KeyError>) -> Self {
        Self {
            name,
            table,
            read: BTreeSet::new(),
            problems,
            shown: toml::Table::new(),
            hidden: BTreeSet::new(),
        }
    }

    /// The value of `key`, or `default` when it is not set, handed to `check`: the checked value, or `None` with its
    /// problem recorded. A value of the wrong type is a problem too.
    pub fn get<R, T>(
        &mut self,
        key: &'static str,
        default: R,
        check: impl FnOnce(R) -> Result<T, String>,
    ) -> Option<T>
    where
        R: DeserializeOwned + Serialize,
    {
        self.read.insert(key.to_string());
        let raw = match self.table.get(key) {
            None => Ok(default),
            Some(value) => from_value(value),
        };
        let raw = match raw {
            Ok(raw) => raw,
            Err(problem) => return self.problem(key, problem),
        };
        if let Ok(shown) = toml::Value::try_from(&raw) {
            self.shown.insert(key.to_string(), shown);
        }
        match check(raw) {
            Ok(value) => Some(value),
            Err(problem) => self.problem(key, problem),
        }
    }

    /// The value of `key` as written, or `default`, with no check beyond its type.
    pub fn value<R>(&mut self, key: &'static str, default: R) -> Option<R>
    where
        R: DeserializeOwned + Serialize,
    {
        self.get(key, default, Ok)
    }

    /// Records a problem of `key` found by a check that spans keys; always `None`.
    /// A key that is no longer read: its presence is a problem that says why, rather than "unknown key".
    pub fn removed(&mut self, key: &'static str, why: &str) -> Option<()> {
        self.read.insert(key.to_string());
        if self.table.contains_key(key) {
            return self.problem(key, why.to_string());
        }
        Some(())
    }

    pub fn problem<T>(&mut self, key: &'static str, problem: String) -> Option<T> {
        let key = format!("{}.{key}", self.name);
        self.problems.push(KeyError { key, problem });
        None
    }

    /// Records a problem of a key of another section (`section.key`) that this section's reading found; always
    /// `None`.
    pub fn problem_elsewhere<T>(&mut self, key: &'static str, problem: String) -> Option<T> {
        let key = key.to_string();
        self.problems.push(KeyError { key, problem });
        None
    }

    /// Shows `key` through `hide` wherever the effective config is printed.
    pub fn redact(&mut self, key: &'static str, hide: impl FnOnce(&str) -> String) {
        self.hidden.insert(key);
        if let Some(toml::Value::String(text)) = self.shown.get_mut(key) {
            *text = hide(text);
        }
    }

    /// Every key that no component read is a problem (a typo would otherwise be a silent default); returns what
    /// was read, for `--print-config`, with the credentials of any URL hidden.
    pub fn finish(mut self) -> toml::Table {
        for (key, value) in self.shown.iter_mut() {
            if self.hidden.contains(key.as_str()) {
                continue;
            }
            if let toml::Value::String(text) = value {
                *text = without_userinfo(text);
            }
        }
        let unknown: Vec<String> = self
            .table
            .keys()
            .filter(|key| !self.read.contains(*key))
            .map(|key| format!("{}.{key}", self.name))
            .collect();
        for key in unknown {
            let problem = "unknown key".to_string();
            self.problems.push(KeyError { key, problem });
        }
        self.shown
    }
}

/// A raw value of type `R` from TOML, or from text when it came from the environment: `"1024"` is a number there,
/// `"true"` a boolean and `"a, b"` a list.
fn from_value<R: DeserializeOwned>(value: &toml::Value) -> Result<R, String> {
    let err = match value.clone().try_into::<R>() {
        Ok(raw) => return Ok(raw),
        Err(err) => wrong_type(&err),
    };
    let toml::Value::String(text) = value else {
        return Err(err);
    };
    let scalar = format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"));
    if let Some(Ok(raw)) = scalar.map(|v| v.try_into::<R>()) {
        return Ok(raw);
    }
    let list = toml::Value::Array(
        text.split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(|s| toml::Value::String(s.to_string()))
            .collect(),
    );
    list.try_into::<R>().map_err(|_| err)
}

fn wrong_type(err: &toml::de::Error) -> String {
    err.message().trim().to_string()
}

/// Accepts `30s`, `5m`, `1h 30m`, `250ms`; a bare number is refused because its unit would be a guess.
pub fn duration(text: String) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration like \"30s\" or \"5m\": {e}"))
}

/// A duration longer than zero.
pub fn positive_duration(text: String) -> Result<Duration, String> {
    duration(text.clone()).and_then(|d| {
        if d.is_zero() {
            Err(format!("{text:?} must be longer than zero"))
        } else {
            Ok(d)
        }
    })
}

/// A duration of at most `max`.
pub fn at_most(text: String, max: Duration) -> Result<Duration, String> {
    duration(text.clone()).and_then(|d| {
        if d > max {
            Err(format!("{text:?} is longer than {max:?}"))
        } else {
            Ok(d)
        }
    })
}

/// A duration of at least `min`.
pub fn at_least(text: String, min: Duration) -> Result<Duration, String> {
    duration(text.clone()).and_then(|d| {
        if d < min {
            Err(format!("{text:?} is below {min:?}"))
        } else {
            Ok(d)
        }
    })
}

pub fn socket_addr(text: String) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("{text:?} is not a socket address like \"0.0.0.0:4851\" or \"[::1]:4851\"")
    })
}

/// Text that stays unset when empty.
pub fn optional(text: String) -> Result<Option<String>, String> {
    let text = text.trim();
    Ok((!text.is_empty()).then(|| text.to_string()))
}

/// `text` with any `user:password@` before its host replaced by `***@`, for anything that shows a configured
/// URL: the scheme, if any, is kept, and the userinfo is whatever precedes the last `@` of the authority.
pub fn without_userinfo(text: &str) -> String {
    let (scheme, rest) = match text.find("://") {
        Some(i) => text.split_at(i + 3),
        None => ("", text),
    };
    let authority = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority].rfind('@') {
        Some(at) => format!("{scheme}***@{}", &rest[at + 1..]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> (Vec<KeyError>, toml::Table) {
        (Vec::new(), text.parse().unwrap())
    }

    #[test]
    fn environment_text_reads_as_numbers_booleans_and_lists() {
        let (mut problems, table) = section(
            "n = \"1024\"\nb = \"true\"\nl = \"10.0.0.0/8, ::1\"\nd = \"30s\"\nt = [\"a\"]",
        );
        let mut s = Section::new("x", table, &mut problems);
        assert_eq!(s.value("n", 0u64), Some(1024));
        assert_eq!(s.value("b", false), Some(true));
        assert_eq!(
            s.value("l", Vec::<String>::new()),
            Some(vec!["10.0.0.0/8".to_string(), "::1".to_string()])
        );
        assert_eq!(s.value("d", String::new()).as_deref(), Some("30s"));
        assert_eq!(
            s.value("t", Vec::<String>::new()),
            Some(vec!["a".to_string()])
        );
        let shown = s.finish();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(shown["n"], toml::Value::Integer(1024));
    }

    #[test]
    fn wrong_types_and_unknown_keys_are_problems_of_their_key() {
        let (mut problems, table) = section("n = \"many\"\ntypo = 1");
        let mut s = Section::new("x", table, &mut problems);
        assert_eq!(s.value("n", 0u64), None);
        assert_eq!(s.value("absent", 7u64), Some(7));
        s.finish();
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["x.n", "x.typo"]);
        assert_eq!(problems[1].problem, "unknown key");
    }
}
