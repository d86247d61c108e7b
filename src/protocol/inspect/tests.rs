use super::*;

fn commit(id: u64, watermark: &str) -> Downstream {
    Downstream::Commit {
        id,
        watermark: watermark.into(),
    }
}

const COMMIT_MSG: &str = r#"["commit",{"tag":"commit","flags":0,"commitLsn":"16/B374D9A0","commitEndLsn":"16/B374D9D0","commitTime":1746600001234567},{"watermark":"718sh0nts"}]"#;

#[test]
fn commits_are_found_in_both_key_orders() {
    assert_eq!(
        inspect(format!(r#"{{"id":4,"msg":{COMMIT_MSG}}}"#).as_bytes()),
        commit(4, "718sh0nts")
    );
    assert_eq!(
        inspect(format!(r#"{{"msg":{COMMIT_MSG},"id":4}}"#).as_bytes()),
        commit(4, "718sh0nts")
    );
}

#[test]
fn whitespace_is_allowed_anywhere_json_allows_it() {
    let spaced = " {\n \"msg\" :\t[ \"commit\" , { \"tag\" : \"commit\" } ,\r\n { \"watermark\" : \"0b\" } ] ,\n \"id\" : 7 } ";
    assert_eq!(inspect(spaced.as_bytes()), commit(7, "0b"));
    let spaced = "{ \"id\" : 8 , \"msg\" : [ \"commit\" , {} , {\"watermark\":\"0c\"} ] }";
    assert_eq!(inspect(spaced.as_bytes()), commit(8, "0c"));
}

#[test]
fn other_messages_are_not_commits() {
    for frame in [
        r#"{"msg":["status",{"tag":"status"}],"id":1}"#,
        r#"{"id":2,"msg":["begin",{"tag":"begin"},{"commitWatermark":"0b"}]}"#,
        r#"{"msg":["rollback",{"tag":"rollback"}],"id":5}"#,
        r#"{"msg":["error",{"type":2,"message":"earliest supported watermark is 0b (requested 0a)"}],"id":1}"#,
    ] {
        assert_eq!(inspect(frame.as_bytes()), Downstream::Other, "{frame}");
    }
}

#[test]
fn the_word_commit_inside_data_is_not_a_commit() {
    for frame in [
        r#"{"msg":["data",{"tag":"insert","new":{"note":"commit","x":"[\"commit\","}}],"id":3}"#,
        r#"{"id":3,"msg":["data",{"tag":"insert","new":{"commit":"commit"}},{"watermark":"zz"}]}"#,
        r#"{"msg":["data",{"tag":"update","new":{"s":"{\"msg\":[\"commit\",{},{\"watermark\":\"zz\"}],\"id\":9}"}}],"id":3}"#,
        r#"{"msg":["commits",{},{"watermark":"zz"}],"id":3}"#,
    ] {
        assert_eq!(inspect(frame.as_bytes()), Downstream::Other, "{frame}");
    }
}

#[test]
fn big_numbers_and_nul_escapes_do_not_disturb_the_scan() {
    let data =
        r#"{"msg":["data",{"tag":"insert","new":{"big":9007199254740993,"s":"a\u0000b"}}],"id":3}"#;
    assert_eq!(inspect(data.as_bytes()), Downstream::Other);
    let commit_frame = r#"{"msg":["commit",{"tag":"commit","xid":18446744073709551617},{"watermark":"0d"}],"id":12345678901}"#;
    assert_eq!(inspect(commit_frame.as_bytes()), commit(12345678901, "0d"));
}

#[test]
fn later_additions_to_a_commit_are_ignored() {
    assert_eq!(
        inspect(br#"{"msg":["commit",{},{"watermark":"0f","x":[1]},{"more":true}],"id":10,"extra":{"a":[]}}"#),
        commit(10, "0f")
    );
}

#[test]
fn unusual_heads_fall_back_to_a_full_parse() {
    // An extra key before msg, and an escaped tag: not Zero's shape, still read correctly.
    assert_eq!(
        inspect(br#"{"v":1,"id":9,"msg":["commit",{},{"watermark":"0e"}]}"#),
        commit(9, "0e")
    );
    assert_eq!(
        inspect(br#"{"id":9,"msg":["comm\u0069t",{},{"watermark":"0e"}]}"#),
        commit(9, "0e")
    );
    assert_eq!(
        inspect(br#"{"v":1,"msg":["data",{}],"id":9}"#),
        Downstream::Other
    );
}

#[test]
fn garbage_is_unreadable_and_never_panics() {
    for frame in [
        &b""[..],
        b"{",
        b"{\"msg\"",
        b"{\"msg\":[\"commit\"",
        b"{\"msg\":[\"commit\",{}],\"id\":1}",
        b"{\"msg\":[\"commit\",{},{}],\"id\":1}",
        b"{\"msg\":[\"commit\",{},{\"watermark\":1}],\"id\":1}",
        b"{\"msg\":[\"commit\",{},{\"watermark\":\"0a\"}],\"id\":-1}",
        b"{\"msg\":[\"commit\",{},{\"watermark\":\"0a\"}],\"id\":1.5}",
        b"{\"msg\":[\"commit\",{},{\"watermark\":\"0a\"}]}",
        b"{\"id\":1,\"id\":2,\"msg\":[\"commit\",{},{\"watermark\":\"0a\"}]}",
        b"{\"id\":1,\"msg\":[]}",
        b"{\"id\":1,\"msg\":{}}",
        b"[1,2]",
        b"\xff\xfe",
        b"{\"id\":1,\"msg\":[\"commit\"\xff]}",
        b"null",
    ] {
        assert_eq!(
            inspect(frame),
            Downstream::Unreadable,
            "{}",
            String::from_utf8_lossy(frame)
        );
    }
}

#[test]
fn the_fast_path_reads_what_a_parser_reads() {
    let middles = [
        r#"{}"#,
        r#"{"tag":"commit","s":"a\"]}[{,","n":[1,[2,{"x":"}"}]],"big":18446744073709551617}"#,
        r#"{"u":"\u0000\\"}"#,
        r#"null"#,
        r#"123.5e-3"#,
        r#""text""#,
    ];
    for middle in middles {
        for frame in [
            format!(r#"{{"msg":["commit",{middle},{{"watermark":"0g"}}],"id":21}}"#),
            format!(r#"{{"id":21,"msg":["commit",{middle},{{"watermark":"0g"}}]}}"#),
            format!(" {{ \"id\" : 21 , \"msg\" : [ \"commit\" , {middle} , {{ \"watermark\" : \"0g\" }} ] }} "),
        ] {
            let head = read_head(frame.as_bytes());
            let Some(Head::Commit { id, at }) = head else {
                panic!("{frame}");
            };
            assert_eq!(
                read_commit(frame.as_bytes(), id, at),
                Some(commit(21, "0g")),
                "{frame}"
            );
            assert_eq!(parse_full(frame.as_bytes()), commit(21, "0g"), "{frame}");
        }
    }
    // Shapes the fast path leaves to the parser, which still reads them.
    for frame in [
        r#"{"msg":["commit",{},{"watermark":"0g","x":1}],"id":21}"#,
        r#"{"msg":["commit",{},{"watermark":"0g"},{}],"id":21}"#,
        r#"{"msg":["commit",{},{"watermark":"0g"}],"id":21,"x":1}"#,
        r#"{"msg":["commit",{},{"watermark":"0g"}],"id":2.1e1}"#,
    ] {
        let Some(Head::Commit { id, at }) = read_head(frame.as_bytes()) else {
            panic!("{frame}");
        };
        assert_eq!(read_commit(frame.as_bytes(), id, at), None, "{frame}");
    }
    assert_eq!(
        inspect(br#"{"msg":["commit",{},{"watermark":"0g","x":1}],"id":21}"#),
        commit(21, "0g")
    );
    // An id that is not a u64 is never a commit's.
    assert_eq!(
        inspect(br#"{"id":01,"msg":["commit",{},{"watermark":"0g"}]}"#),
        Downstream::Unreadable
    );
    assert_eq!(
        inspect(br#"{"id":18446744073709551616,"msg":["commit",{},{"watermark":"0g"}]}"#),
        Downstream::Unreadable
    );
}

proptest::proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
        let _ = inspect(&bytes);
    }

    #[test]
    fn arbitrary_json_heads_never_panic(head in "[{}\\[\\]\":, a-z0-9]{0,40}") {
        let _ = inspect(head.as_bytes());
    }

    #[test]
    fn arbitrary_commit_bodies_never_panic(body in "[{}\\[\\]\"\\\\:, a-z0-9]{0,40}") {
        for frame in [
            format!(r#"{{"msg":["commit",{body}"#),
            format!(r#"{{"id":1,"msg":["commit",{body}"#),
        ] {
            let _ = inspect(frame.as_bytes());
        }
    }
}

#[test]
fn a_word_has_a_byte_exactly_when_one_of_its_bytes_is_it() {
    for byte in [0u8, b'"', b'\\', b'{', b']', 0x80, 0xff] {
        for at in 0..8 {
            for other in [
                0u8,
                1,
                byte.wrapping_sub(1),
                byte.wrapping_add(1),
                0x7f,
                0x80,
                0xff,
            ] {
                let mut bytes = [other; 8];
                if other == byte {
                    continue;
                }
                assert_eq!(
                    has_byte(u64::from_le_bytes(bytes), byte),
                    0,
                    "{bytes:?} {byte}"
                );
                bytes[at] = byte;
                assert_ne!(
                    has_byte(u64::from_le_bytes(bytes), byte),
                    0,
                    "{bytes:?} {byte}"
                );
            }
        }
    }
}

proptest::proptest! {
    /// Eight bytes at a time finds what a byte at a time finds, wherever the search starts and the words fall.
    #[test]
    fn find_agrees_with_a_byte_at_a_time(
        bytes in proptest::collection::vec(proptest::sample::select(&b"ab\"\\{}[]"[..]), 0..40),
        from in 0usize..44,
    ) {
        let hit = |b: u8| b == b'"' || b == b'\\';
        let found = find(&bytes, from, |w| has_byte(w, b'"') | has_byte(w, b'\\') != 0, hit);
        let expected = bytes.get(from..).and_then(|rest| rest.iter().position(|&b| hit(b)).map(|at| from + at));
        proptest::prop_assert_eq!(found, expected);
    }

    /// Zero's own head, matched as fixed text, says what the key-by-key reading says of the same frame.
    #[test]
    fn zeros_head_reads_as_the_general_head_does(
        id in "[0-9]{1,21}",
        tag in "(commit|begin|data|status|commi|commitx|co\\\\u006dmit)",
        rest in "[{}\\[\\]\",:a-z0-9]{0,20}",
    ) {
        let frame = format!(r#"{{"id":{id},"msg":["{tag}"{rest}"#);
        let general = |frame: &[u8]| {
            // The key-by-key reading alone: a space before the first key keeps the fixed text from matching.
            let spaced = [b"{ ".as_slice(), &frame[1..]].concat();
            match read_head(&spaced) {
                Some(Head::Commit { id, at }) => Some((true, id, at - 1)),
                Some(Head::Other) => Some((false, None, 0)),
                None => None,
            }
        };
        let fast = match zero_head(frame.as_bytes()) {
            Some(Head::Commit { id, at }) => Some((true, id, at)),
            Some(Head::Other) => Some((false, None, 0)),
            None => None,
        };
        match fast {
            Some(fast) => proptest::prop_assert_eq!(Some(fast), general(frame.as_bytes())),
            // Left to the general reading, which then finds nothing it can read either.
            None => proptest::prop_assert_eq!(general(frame.as_bytes()), None),
        }
    }
}
