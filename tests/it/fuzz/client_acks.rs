//! Client acks.

use super::*;

fn ack() -> impl Strategy<Value = Vec<u8>> + Clone {
    let number = prop_oneof![
        3 => any::<u64>().prop_map(|n| n.to_string()),
        1 => select(&[
            "0", "-1", "-0", "01", "1.5", "1e3", "18446744073709551615", "18446744073709551616",
            "\"1\"", "null", "true", "[1]", "{}", "", "99999999999999999999999",
        ][..]).prop_map(String::from),
    ];
    let space = select(&["", "", "", " ", "\n", "\t ", "\r\n"][..]);
    let extra = select(&["", "", "", ",\"x\":1", ",\"ack\":2", ",", "}"][..]);
    let plain = (number, space, extra)
        .prop_map(|(n, s, extra)| format!("{s}{{{s}\"ack\"{s}:{s}{n}{s}{extra}}}{s}").into_bytes());
    prop_oneof![
        2 => bytes(b"{}\"ack:0123456789-. ", 48),
        4 => plain.clone(),
        2 => mutated(plain, b"{}\":,0123456789 "),
    ]
}

/// An ack is at most a JSON object's worth of copies: serde_json's scratch for escaped keys, and the error text.
#[test]
fn client_ack() {
    fuzz("client_ack", ack().prop_map(Text), |text| {
        match bounded("decode_ack", text.len(), (512, 2), || {
            protocol::decode_ack(&text)
        })? {
            Ok(id) => {
                // Exactly an object with the single key `ack` holding that number.
                let value: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
                    TestCaseError::fail(format!("accepted an ack that is not JSON: {e}"))
                })?;
                let object = value
                    .as_object()
                    .ok_or_else(|| TestCaseError::fail("not an object"))?;
                prop_assert_eq!(object.len(), 1);
                prop_assert_eq!(object.get("ack").and_then(|v| v.as_u64()), Some(id));
            }
            Err(err) => message_is_clear("decode_ack", &err.to_string())?,
        }
        Ok(())
    });
}
