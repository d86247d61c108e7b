use super::*;

#[test]
fn routes_match_zeros_patterns() {
    assert_eq!(route("/"), Route::Root);
    assert_eq!(route("/keepalive"), Route::Keepalive);
    assert_eq!(route("/status"), Route::Status);
    assert_eq!(
        route("/replication/v3/snapshot"),
        Route::Snapshot(Version::Number(3))
    );
    assert_eq!(
        route("/replication/v12/changes"),
        Route::Changes(Version::Number(12))
    );
    assert_eq!(
        route("/replication/three/snapshot"),
        Route::Snapshot(Version::Invalid("/replication/three/snapshot".into()))
    );
    assert_eq!(
        route("/replication/v/changes"),
        Route::Changes(Version::Invalid("/replication/v/changes".into()))
    );
    for path in [
        "/replication/v3/snapshot/",
        "/replication//snapshot",
        "/replication/v3/x/snapshot",
        "/replication/v3/snapshots",
        "/prefix/replication/v3/snapshot",
        "/replication/v3",
        "/keepalive/",
        "",
    ] {
        assert_eq!(route(path), Route::NotFound, "{path}");
    }
    assert_eq!(
        route("/replication/v99999999999999999999999/snapshot"),
        Route::Snapshot(Version::Number(u64::MAX))
    );
}

#[test]
fn snapshot_checks_in_zeros_order() {
    let v = |n| Version::Number(n);
    assert_eq!(
        check_snapshot(&v(3), Some("taskID=t1"), None),
        Ok((3, "t1".into()))
    );
    assert_eq!(
        check_snapshot(&v(6), Some("taskID=a%2Fb+c"), None),
        Ok((6, "a/b c".into()))
    );
    assert_eq!(
        check_snapshot(&v(3), Some("taskID=first&taskID=second"), None),
        Ok((3, "first".into()))
    );
    assert_eq!(
        check_snapshot(&v(3), None, None),
        Err(MISSING_TASK_ID.into())
    );
    assert_eq!(
        check_snapshot(&v(3), Some("taskID="), None),
        Err(MISSING_TASK_ID.into())
    );
    assert_eq!(
        check_snapshot(&v(3), Some("%%%&&="), None),
        Err(MISSING_TASK_ID.into())
    );
    assert_eq!(
        check_snapshot(&v(7), Some("taskID=t1"), None),
        Err("Error: Cannot service client at protocol v7. Supported protocols: [v3 ... v6]".into())
    );
    assert_eq!(
        check_snapshot(&v(2), None, None),
        Err("Error: Cannot service client at protocol v2. Supported protocols: [v3 ... v6]".into())
    );
    assert_eq!(
        check_snapshot(
            &Version::Invalid("/replication/x/snapshot".into()),
            None,
            None
        ),
        Err("Error: invalid path: /replication/x/snapshot".into())
    );
}

#[test]
fn changes_versions_one_to_six_are_forwarded() {
    for n in 1..=6 {
        assert_eq!(check_changes(&Version::Number(n), None), Ok(()));
    }
    assert_eq!(
        check_changes(&Version::Number(0), None),
        Err("Error: Cannot service client at protocol v0. Supported protocols: [v1 ... v6]".into())
    );
    assert_eq!(
        check_changes(&Version::Number(7), None),
        Err("Error: Cannot service client at protocol v7. Supported protocols: [v1 ... v6]".into())
    );
    assert_eq!(
        check_changes(&Version::Invalid("/replication/vx/changes".into()), None),
        Err("Error: invalid path: /replication/vx/changes".into())
    );
}

#[test]
fn a_known_upstream_range_narrows_both_routes_before_anything_else_is_checked() {
    let v = |n| Version::Number(n);
    let zero_1_10 = Some(&(4..=6));
    let refused = "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]";
    // The version is checked before the taskID, as Zero does.
    assert_eq!(check_snapshot(&v(3), None, zero_1_10), Err(refused.into()));
    assert_eq!(
        check_snapshot(&v(3), Some("taskID=t1"), zero_1_10),
        Err(refused.into())
    );
    assert_eq!(
        check_snapshot(&v(6), Some("taskID=t1"), zero_1_10),
        Ok((6, "t1".into()))
    );
    assert_eq!(check_changes(&v(3), zero_1_10), Err(refused.into()));
    assert_eq!(check_changes(&v(4), zero_1_10), Ok(()));
    // Zero 0.20: v3 as before; a v4 snapshot would be refused on /changes, so it is refused here.
    let zero_0_20 = Some(&(1..=3));
    assert_eq!(
        check_snapshot(&v(3), Some("taskID=t1"), zero_0_20),
        Ok((3, "t1".into()))
    );
    assert_eq!(
        check_snapshot(&v(4), Some("taskID=t1"), zero_0_20),
        Err("Error: Cannot service client at protocol v4. Supported protocols: [v3 ... v3]".into())
    );
    assert_eq!(check_changes(&v(1), zero_0_20), Ok(()));
    // A path Zero cannot read is refused as before.
    assert_eq!(
        check_changes(
            &Version::Invalid("/replication/vx/changes".into()),
            zero_1_10
        ),
        Err("Error: invalid path: /replication/vx/changes".into())
    );
}

#[test]
fn subscriber_context_is_read_like_zero() {
    let q = "taskID=0042ea&id=serving-replicator-4242&mode=serving&watermark=718sh0nk8\
             &replicaVersion=618ocqq8&initial=true";
    assert_eq!(
        parse_subscriber_context(Some(q)),
        SubscriberContext {
            id: Some("serving-replicator-4242".into()),
            task_id: Some("0042ea".into()),
            mode: Mode::Serving,
            replica_version: Some("618ocqq8".into()),
            watermark: Some("718sh0nk8".into()),
            initial: true,
        }
    );
    // Percent-decoding and '+'; the first occurrence wins even when it is empty; unknown keys are ignored.
    let ctx = parse_subscriber_context(Some(
        "id=rm-1%2Fbackup+1&taskID=&taskID=t2&mode=backup&initial=TRUE&x=1&id=second",
    ));
    assert_eq!(ctx.id.as_deref(), Some("rm-1/backup 1"));
    assert_eq!(ctx.task_id, None);
    assert_eq!(ctx.mode, Mode::Backup);
    assert!(!ctx.initial);
    assert_eq!(ctx.watermark, None);
    assert_eq!(parse_subscriber_context(None), SubscriberContext::default());
    assert_eq!(
        parse_subscriber_context(Some("&&=&%%")),
        SubscriberContext::default()
    );
    assert_eq!(
        parse_subscriber_context(Some("mode=Backup&initial=1")).mode,
        Mode::Serving
    );
    assert!(parse_subscriber_context(Some("initial=tru%65")).initial);
    assert!(!parse_subscriber_context(Some("initial=&initial=true")).initial);
}

#[test]
fn only_the_initial_value_zero_reads_is_rewritten() {
    let q = "taskID=t1&id=rm-1%2Fbackup-replicator-1234&mode=backup&watermark=0a&replicaVersion=01&initial=true";
    assert_eq!(
        suppress_initial(q),
        "taskID=t1&id=rm-1%2Fbackup-replicator-1234&mode=backup&watermark=0a&replicaVersion=01&initial=false"
    );
    assert_eq!(suppress_initial("initial=true&id=x"), "initial=false&id=x");
    assert_eq!(suppress_initial("initial=tru%65"), "initial=false");
    assert_eq!(
        suppress_initial("%69nitial=true&a=b"),
        "%69nitial=false&a=b"
    );
    assert_eq!(
        suppress_initial("&&initial=true&&initial=true"),
        "&&initial=false&&initial=true"
    );
    for unchanged in [
        "",
        "id=x",
        "initial=false",
        "initial=",
        "initial",
        "initial=TRUE",
        "initial=true1",
        "initial=&initial=true",
        "initials=true",
        "x=initial%3Dtrue",
    ] {
        assert!(
            matches!(suppress_initial(unchanged), Cow::Borrowed(s) if s == unchanged),
            "{unchanged}"
        );
    }
}

#[test]
fn status_frame_is_id_first_without_whitespace() {
    assert_eq!(
        snapshot_status_v3("s3://acme-zero/replica"),
        r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica"}]}"#
    );
    assert_eq!(
        snapshot_status_v3("file:///a \"b\"\\"),
        r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"file:///a \"b\"\\"}]}"#
    );
}

#[test]
fn v4_status_adds_replica_version_and_min_watermark() {
    assert_eq!(
        snapshot_status_v4("s3://acme-zero/replica", "618ocqq8", "718sh0nk8", None),
        r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica","replicaVersion":"618ocqq8","minWatermark":"718sh0nk8"}]}"#
    );
}

#[test]
fn v4_status_carries_the_replica_size_when_known() {
    assert_eq!(
        snapshot_status_v4(
            "s3://acme-zero/replica",
            "618ocqq8",
            "718sh0nk8",
            Some(4096)
        ),
        r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica","replicaVersion":"618ocqq8","minWatermark":"718sh0nk8","replicaSize":4096}]}"#
    );
}

#[test]
fn acks_are_strict() {
    assert_eq!(decode_ack(br#"{"ack":1}"#), Ok(1));
    assert_eq!(decode_ack(br#" { "ack" : 42 } "#), Ok(42));
    assert_eq!(decode_ack(br#"{"ack":0}"#), Ok(0));
    assert_eq!(decode_ack(br#"{"ack":18446744073709551615}"#), Ok(u64::MAX));
    for bad in [
        &br#"{"ack":1,"x":2}"#[..],
        br#"{"ack":"1"}"#,
        br#"{"ack":-1}"#,
        br#"{"ack":1.5}"#,
        br#"{"ack":01}"#,
        br#"{"ack":18446744073709551616}"#,
        br#"{"ack":1}}"#,
        br#"{"ack":}"#,
        br#"{}"#,
        br#"[1]"#,
        b"ack 1",
        b"",
    ] {
        assert!(decode_ack(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn close_reasons_are_cut_like_zeros() {
    assert_eq!(close_reason("short"), "short");
    let exact = "x".repeat(123);
    assert_eq!(close_reason(&exact), exact);
    let long = "y".repeat(200);
    assert_eq!(close_reason(&long), format!("{}...", "y".repeat(120)));
    // Multi-byte characters: 120 chars would be 240 bytes, so characters are dropped until it fits.
    let wide = "é".repeat(100);
    let cut = close_reason(&wide);
    assert!(cut.len() <= 123 && cut.ends_with("..."), "{cut}");
    assert_eq!(cut, format!("{}...", "é".repeat(60)));
}
