//! The `/status` answer the `status` command reads.

use super::*;

fn report() -> impl Strategy<Value = status::Report> + Clone {
    let text = prop_oneof![
        6 => "[a-z0-9 -]{0,12}",
        1 => "\\PC{0,20}",
        1 => (0usize..500).prop_map(|n| "w".repeat(n)),
    ];
    let seconds = prop_oneof![
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()),
        select(&[0.0, -1.0, 59.5, 3600.0, 1e20, f64::MAX][..]),
    ];
    let subscriber = (
        text.clone(),
        proptest::option::of(text.clone()),
        seconds.clone(),
        any::<bool>(),
    )
        .prop_map(
            |(id, task_id, lag_seconds, caught_up)| status::SubscriberEntry {
                id,
                task_id,
                lag_seconds,
                caught_up,
                ..Default::default()
            },
        );
    let reservation = (
        text.clone(),
        seconds.clone(),
        proptest::option::of(text.clone()),
    )
        .prop_map(|(task_id, age_seconds, floor)| status::ReservationEntry {
            task_id,
            age_seconds,
            floor,
            ..Default::default()
        });
    let backup = (text.clone(), proptest::option::of(seconds.clone())).prop_map(
        |(watermark, age_seconds)| status::BackupEntry {
            watermark,
            age_seconds,
            ..Default::default()
        },
    );
    (
        text,
        seconds,
        vec(backup, 0..8),
        vec(reservation, 0..8),
        vec(subscriber, 0..16),
    )
        .prop_map(
            |(version, uptime_seconds, backups, reservations, subscribers)| status::Report {
                version,
                uptime_seconds,
                backups,
                reservations,
                subscribers,
                ..Default::default()
            },
        )
}

/// Peak heap of reading a `/status` answer per input byte: `{}` and its comma (3 bytes) become a subscriber entry of
/// 224 bytes, and the list of them holds its old and its new buffer (3 times the entries) while it grows.
const READ_PER_BYTE: usize = 256;

/// Peak heap of rendering a report per input byte of its answer: each entry becomes a row of six cells (about 160
/// bytes while the table is built, 3 bytes of answer at least) and a line of the table, whose columns are padded to
/// at most 64 characters, in a text that doubles as it grows.
const RENDER_PER_BYTE: usize = 128;

/// Pieces of a subscriber list: many small entries, some with long ids.
const ENTRIES: &[&[u8]] = &[b",{}", b",{}", b",{}", br#",{"id":"xxxxxxxxxxxxxxxx"}"#];

#[test]
fn status_answer() {
    let answer = report().prop_map(|r| serde_json::to_vec(&r).expect("a report serializes"));
    let input = prop_oneof![
        1 => bytes(b"{}[]\",:0123456789 ", 200),
        // One long id among many entries: a table whose columns followed it would grow with the square of this.
        1 => (0usize..2000, vec(select(ENTRIES), 0..600)).prop_map(|(long, parts)| {
            let mut answer = format!(r#"{{"subscribers":[{{"id":"{}"}}"#, "w".repeat(long)).into_bytes();
            answer.extend(parts.concat());
            answer.extend_from_slice(b"]}");
            answer
        }),
        4 => answer.clone(),
        2 => mutated(answer, b"{}[]\",:0123456789 "),
    ];
    fuzz("status_answer", input.prop_map(Text), |body| {
        match bounded(
            "status_cli::read_report",
            body.len(),
            (4096, READ_PER_BYTE),
            || status_cli::read_report(&body),
        )? {
            Ok((_, report)) => {
                let shown = bounded(
                    "status_cli::render",
                    body.len(),
                    (16 << 10, RENDER_PER_BYTE),
                    || status_cli::render(&report),
                )?;
                prop_assert!(!shown.is_empty());
            }
            Err(err) => message_is_clear("status_cli::read_report", &err.to_string())?,
        }
        Ok(())
    });
}
