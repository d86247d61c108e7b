//! The state file.

use super::*;

fn state_text() -> impl Strategy<Value = Vec<u8>> + Clone {
    let number = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        select(
            &[
                "1",
                "2",
                "0",
                "-1",
                "1.5",
                "18446744073709551616",
                "null",
                "\"1\""
            ][..]
        )
        .prop_map(String::from),
    ];
    let last_purge = prop_oneof![
        Just("null".to_string()),
        (watermark(), number.clone()).prop_map(|(w, at)| format!(
            r#"{{"watermark":{},"backed_up_at_ms":{at}}}"#,
            serde_json::to_string(&w).expect("a string serializes")
        )),
    ];
    let file = (
        prop_oneof![3 => Just("1".to_string()), 1 => number.clone()],
        number,
        proptest::option::of(last_purge),
        select(&["", "", r#","extra":1"#][..]),
    )
        .prop_map(|(version, delay, last_purge, extra)| {
            let last_purge = last_purge.map_or(String::new(), |p| format!(r#","last_purge":{p}"#));
            format!(r#"{{"version":{version},"cleanup_delay_ms":{delay}{last_purge}{extra}}}"#)
                .into_bytes()
        });
    prop_oneof![
        1 => bytes(b"{}[]\",:0123456789 ", 100),
        4 => file.clone(),
        2 => mutated(file, b"{}[]\",:0123456789 "),
    ]
}

/// A state file is small JSON read whole: a watermark copy, serde_json's scratch, and an error message.
#[test]
fn state_file() {
    fuzz("state_file", state_text().prop_map(Text), |text| {
        match bounded("state::decode", text.len(), (1024, 4), || {
            state::decode(&text)
        })? {
            Ok(saved) => {
                if let Some(purge) = &saved.last_purge {
                    prop_assert!(!purge.watermark.is_empty());
                }
            }
            Err(reason) => message_is_clear("state::decode", &reason)?,
        }
        Ok(())
    });
}
