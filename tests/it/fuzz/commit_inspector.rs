//! The commit inspector.

use super::*;

/// Whitespace as JSON allows it between tokens, usually none.
pub(super) fn ws_choice() -> impl Strategy<Value = &'static str> + Clone {
    prop_oneof![6 => Just(""), 1 => select(&[" ", "\n", "\t", " \r\n  "][..])]
}

/// A JSON string literal: mostly plain, sometimes with escapes and characters that look like structure.
fn json_string() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        4 => "[a-zA-Z0-9_/.:-]{0,16}".prop_map(|s| format!("\"{s}\"")),
        1 => "\\PC{0,8}".prop_map(|s| serde_json::to_string(&s).expect("a string serializes")),
        1 => select(&[r#""]}{[,""#, r#""a\"b""#, r#""\\""#, r#""\u0041\n""#, r#""\/""#][..]).prop_map(String::from),
    ]
}

/// A JSON value of the kinds row data holds, nested a little.
fn json_value() -> impl Strategy<Value = String> + Clone {
    let leaf = prop_oneof![
        json_string(),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_filter_map("JSON has no NaN or infinity", |f| {
            f.is_finite()
                .then(|| serde_json::to_string(&f).expect("a number serializes"))
        }),
        select(
            &[
                "true",
                "false",
                "null",
                "1e400",
                "-0",
                "12345678901234567890123"
            ][..]
        )
        .prop_map(String::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(","))),
            vec((json_string(), inner), 0..4).prop_map(|fields| {
                let fields: Vec<String> = fields
                    .into_iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    })
}

/// A change-stream frame as Zero's change-streamer writes it (`{"id":N,"msg":[tag, …]}`, either key order) and
/// the commit it carries, if it is one.
pub(super) fn change_frame() -> impl Strategy<Value = (String, Option<(u64, String)>)> + Clone {
    let body = (json_value(), json_value());
    let message = prop_oneof![
        3 => (body.clone(), watermark()).prop_map(|((a, _), w)| (
            format!(
                r#"["commit",{{"tag":"commit","flags":0,"commitLsn":"16/B374D9A0","extra":{a}}},{{"watermark":{}}}]"#,
                serde_json::to_string(&w).expect("a string serializes")
            ),
            Some(w),
        )),
        1 => (body.clone(), watermark()).prop_map(|((a, _), w)| (
            format!(
                r#"["begin",{{"tag":"begin","json":"p","x":{a}}},{{"commitWatermark":{}}}]"#,
                serde_json::to_string(&w).expect("a string serializes")
            ),
            None,
        )),
        3 => body.clone().prop_map(|(a, b)| (
            format!(r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"t"}},"new":{a},"old":{b}}}]"#),
            None,
        )),
        1 => select(&[
            r#"["rollback",{"tag":"rollback"}]"#,
            r#"["status",{"tag":"status"}]"#,
            r#"["error",{"type":"error","message":"x"}]"#,
            r#"["commitx",{},{"watermark":"0a"}]"#,
        ][..]).prop_map(|m| (m.to_string(), None)),
    ];
    (
        message,
        any::<u64>(),
        any::<bool>(),
        ws_choice(),
        ws_choice(),
    )
        .prop_map(|((message, watermark), id, id_first, a, b)| {
            let text = if id_first {
                format!("{a}{{{b}\"id\"{a}:{b}{id}{a},{b}\"msg\"{a}:{b}{message}{a}}}{b}")
            } else {
                format!("{a}{{{b}\"msg\"{a}:{b}{message}{a},{b}\"id\"{a}:{b}{id}{a}}}{b}")
            };
            (text, watermark.map(|w| (id, w)))
        })
}

/// What the inspector must say about a frame, if the frame is of Zero's shape.
#[derive(Debug, Clone)]
struct Relayed {
    frame: Text,
    /// `Some`: unmutated, so known to be this commit (`Some(Some(…))`) or another message (`Some(None)`).
    expected: Option<Option<(u64, String)>>,
}

fn relayed() -> impl Strategy<Value = Relayed> + Clone {
    prop_oneof![
        1 => bytes(b"{}[]\",:0123456789 commitwatermarkid\\", 200).prop_map(|frame| Relayed { frame: Text(frame), expected: None }),
        4 => change_frame().prop_map(|(text, commit)| Relayed { frame: Text(text.into_bytes()), expected: Some(commit) }),
        3 => mutated(
            change_frame().prop_map(|(text, _)| text.into_bytes()),
            b"{}[]\",:0123456789 \\",
        ).prop_map(|frame| Relayed { frame: Text(frame), expected: None }),
    ]
}

/// The inspector scans in place and parses only what ack tracking needs: at most the message tag and watermark
/// are copied, plus serde_json's scratch for an escaped string.
#[test]
fn commit_inspector() {
    fuzz(
        "commit_inspector",
        relayed(),
        |Relayed { frame, expected }| {
            let found = bounded("inspect", frame.len(), (512, 4), || {
                inspect::inspect(&frame)
            })?;
            match expected {
                Some(Some((id, watermark))) => {
                    prop_assert_eq!(found, inspect::Downstream::Commit { id, watermark })
                }
                Some(None) => prop_assert_eq!(found, inspect::Downstream::Other),
                None => {
                    // A commit found in valid JSON is the commit the JSON holds.
                    if let (inspect::Downstream::Commit { id, watermark }, Ok(value)) =
                        (&found, serde_json::from_slice::<serde_json::Value>(&frame))
                    {
                        prop_assert_eq!(value["id"].as_u64(), Some(*id));
                        prop_assert_eq!(value["msg"][0].as_str(), Some("commit"));
                        prop_assert_eq!(
                            value["msg"][2]["watermark"].as_str(),
                            Some(watermark.as_str())
                        );
                    }
                }
            }
            Ok(())
        },
    );
}
