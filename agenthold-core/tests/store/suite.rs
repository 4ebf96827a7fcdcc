//! The conformance suite: every function holds for every backend (instantiated by `conformance!`).

use std::path::Path;

use agenthold_core::store::Store;
use agenthold_core::{Error, ErrorKind};

use super::{Opener, block_on, del, put};

// covers: C2
pub(crate) async fn get_missing(store: &dyn Store) {
    assert_eq!(store.get("never", b"k").await.unwrap(), None, "missing table");
    assert!(store.scan_prefix("never", b"").await.unwrap().is_empty());
    assert!(
        !store.delete("never", b"k").await.unwrap(),
        "delete in a missing table"
    );
    assert_eq!(store.get("never", b"k").await.unwrap(), None);
    store.put("some", b"k", b"v").await.unwrap();
    assert_eq!(store.get("some", b"other").await.unwrap(), None, "missing key");
    assert_eq!(
        store.get("some", b"").await.unwrap(),
        None,
        "empty key never written"
    );
}

// covers: C2
pub(crate) async fn put_get_overwrite(store: &dyn Store) {
    store.put("t", b"k", b"one").await.unwrap();
    assert_eq!(store.get("t", b"k").await.unwrap().as_deref(), Some(&b"one"[..]));
    store.put("t", b"k", b"a longer second value").await.unwrap();
    assert_eq!(
        store.get("t", b"k").await.unwrap().as_deref(),
        Some(&b"a longer second value"[..])
    );
    store.put("t", b"k", b"").await.unwrap();
    assert_eq!(
        store.get("t", b"k").await.unwrap(),
        Some(Vec::new()),
        "empty value is not absence"
    );
    store.put("t", b"", b"empty key").await.unwrap();
    assert_eq!(
        store.get("t", b"").await.unwrap().as_deref(),
        Some(&b"empty key"[..])
    );
    let binary: Vec<u8> = (0..=255u8).collect();
    store.put("t", &binary, &binary).await.unwrap();
    assert_eq!(store.get("t", &binary).await.unwrap(), Some(binary.clone()));
    let big: Vec<u8> = (0..1_500_000u32).map(|i| (i % 251) as u8).collect();
    store.put("t", b"big", &big).await.unwrap();
    assert_eq!(store.get("t", b"big").await.unwrap(), Some(big));
}

// covers: C2
pub(crate) async fn delete_reports_presence(store: &dyn Store) {
    store.put("t", b"k", b"v").await.unwrap();
    assert!(!store.delete("t", b"absent").await.unwrap());
    assert!(
        store.delete("t", b"k").await.unwrap(),
        "first delete finds the key"
    );
    assert!(
        !store.delete("t", b"k").await.unwrap(),
        "second delete finds nothing"
    );
    assert_eq!(store.get("t", b"k").await.unwrap(), None);
    store.put("t", b"k", b"again").await.unwrap();
    assert_eq!(
        store.get("t", b"k").await.unwrap().as_deref(),
        Some(&b"again"[..])
    );
}

// covers: C2
pub(crate) async fn scan_prefix_order_and_bounds(store: &dyn Store) {
    let keys: Vec<Vec<u8>> = vec![
        b"abd".to_vec(),
        vec![0xff, 0xff],
        vec![],
        vec![0x01, 0xff],
        b"a".to_vec(),
        vec![0xff],
        vec![0x01],
        vec![0x01, 0xff, 0xff],
        vec![0x00],
        vec![0xff, 0xff, 0x01],
        b"abc".to_vec(),
        vec![0x02],
        vec![0x01, 0x00],
        b"ab".to_vec(),
        vec![0xff, 0x00],
        b"ac".to_vec(),
        vec![0xfe, 0xff, 0xff],
        b"b".to_vec(),
    ];
    for (i, key) in keys.iter().enumerate() {
        store
            .put("scan", key, format!("value {i}").as_bytes())
            .await
            .unwrap();
    }
    // Another table's keys never show up.
    store
        .put("scan-other", &[0x01, 0x01], b"elsewhere")
        .await
        .unwrap();
    let mut sorted = keys.clone();
    sorted.sort();
    let prefixes: Vec<Vec<u8>> = vec![
        vec![],
        vec![0x00],
        vec![0x01],
        vec![0x01, 0xff],
        vec![0x01, 0xff, 0xff, 0xff],
        vec![0xfe],
        vec![0xff],
        vec![0xff, 0xff],
        vec![0xff, 0xff, 0xff],
        b"a".to_vec(),
        b"ab".to_vec(),
        b"abc".to_vec(),
        b"abz".to_vec(),
        b"c".to_vec(),
    ];
    for prefix in &prefixes {
        let got = store.scan_prefix("scan", prefix).await.unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = sorted
            .iter()
            .filter(|k| k.starts_with(prefix))
            .map(|k| {
                let i = keys.iter().position(|x| x == k).unwrap();
                (k.clone(), format!("value {i}").into_bytes())
            })
            .collect();
        assert_eq!(got, want, "prefix {prefix:02x?}");
    }
    assert_eq!(
        store.scan_prefix("scan", b"").await.unwrap().len(),
        keys.len(),
        "empty prefix: all"
    );
}

// covers: C2
pub(crate) async fn tables_are_independent(store: &dyn Store) {
    // Names that are prefixes of one another, or that a backend might use internally.
    let tables = ["a", "a-b", "a_b", "ab", "__sled__default", "0"];
    for table in tables {
        store.put(table, b"k", table.as_bytes()).await.unwrap();
    }
    for table in tables {
        assert_eq!(
            store.get(table, b"k").await.unwrap().as_deref(),
            Some(table.as_bytes())
        );
        assert_eq!(
            store.scan_prefix(table, b"").await.unwrap(),
            vec![(b"k".to_vec(), table.as_bytes().to_vec())]
        );
    }
    assert!(store.delete("a", b"k").await.unwrap());
    assert_eq!(store.get("a", b"k").await.unwrap(), None);
    for table in &tables[1..] {
        assert_eq!(
            store.get(table, b"k").await.unwrap().as_deref(),
            Some(table.as_bytes()),
            "{table}"
        );
    }
    let longest = "x".repeat(64);
    store.put(&longest, b"k", b"v").await.unwrap();
    assert_eq!(
        store.get(&longest, b"k").await.unwrap().as_deref(),
        Some(&b"v"[..])
    );
}

// covers: C2
pub(crate) async fn batch_applies_all_in_order(store: &dyn Store) {
    store.put("one", b"old", b"old").await.unwrap();
    store.put("two", b"gone", b"x").await.unwrap();
    store.batch(Vec::new()).await.unwrap();
    store
        .batch(vec![
            put("one", b"a", b"1"),
            put("two", b"b", b"2"),
            put("three", b"c", b"3"),
            del("one", b"old"),
            del("two", b"gone"),
            del("never", b"x"),
            // Later operations on the same key win.
            put("one", b"twice", b"first"),
            put("one", b"twice", b"second"),
            put("two", b"put-then-delete", b"x"),
            del("two", b"put-then-delete"),
            del("three", b"delete-then-put"),
            put("three", b"delete-then-put", b"back"),
        ])
        .await
        .unwrap();
    assert_eq!(store.get("one", b"a").await.unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(store.get("two", b"b").await.unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(
        store.get("three", b"c").await.unwrap().as_deref(),
        Some(&b"3"[..])
    );
    assert_eq!(store.get("one", b"old").await.unwrap(), None);
    assert_eq!(store.get("two", b"gone").await.unwrap(), None);
    assert_eq!(
        store.get("one", b"twice").await.unwrap().as_deref(),
        Some(&b"second"[..])
    );
    assert_eq!(store.get("two", b"put-then-delete").await.unwrap(), None);
    assert_eq!(
        store.get("three", b"delete-then-put").await.unwrap().as_deref(),
        Some(&b"back"[..])
    );
}

// covers: C2
pub(crate) async fn batch_with_invalid_table_applies_nothing(store: &dyn Store) {
    store.put("one", b"keep", b"kept").await.unwrap();
    let before_one = store.scan_prefix("one", b"").await.unwrap();
    let err = store
        .batch(vec![
            put("one", b"new", b"x"),
            del("one", b"keep"),
            put("two", b"new", b"x"),
            put("Not A Table", b"k", b"v"),
            put("one", b"after", b"x"),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidId {
                kind: "table name",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::BadInput);
    assert_eq!(
        store.scan_prefix("one", b"").await.unwrap(),
        before_one,
        "nothing applied"
    );
    assert!(
        store.scan_prefix("two", b"").await.unwrap().is_empty(),
        "nothing applied"
    );
    let err = store
        .batch(vec![del("one", b"keep"), del("", b"k")])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInput);
    assert_eq!(
        store.get("one", b"keep").await.unwrap().as_deref(),
        Some(&b"kept"[..])
    );
}

// covers: C2
pub(crate) async fn invalid_table_names_rejected(store: &dyn Store) {
    let long = "x".repeat(65);
    let bad = [
        "",
        "Upper",
        "a b",
        "a/b",
        "a.b",
        "..",
        "table/x",
        "é",
        "a\0b",
        long.as_str(),
    ];
    for table in bad {
        let check = |result: agenthold_core::Result<()>, op: &str| {
            let err = result.expect_err(&format!("{op} on {table:?} must fail"));
            assert!(
                matches!(&err, Error::InvalidId { kind: "table name", value, .. } if value == table),
                "{op} on {table:?}: {err:?}"
            );
        };
        check(store.get(table, b"k").await.map(drop), "get");
        check(store.put(table, b"k", b"v").await, "put");
        check(store.delete(table, b"k").await.map(drop), "delete");
        check(store.scan_prefix(table, b"").await.map(drop), "scan_prefix");
        check(store.batch(vec![put(table, b"k", b"v")]).await, "batch");
    }
}

// covers: C2
pub(crate) async fn concurrent_writers(store: &dyn Store) {
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                for i in 0..25u8 {
                    block_on(store.put("conc", &[t, i], &[i, t])).unwrap();
                    if i % 5 == 0 {
                        block_on(
                            store.batch(vec![put("conc", &[t, i, 0], b"b"), put("conc2", &[t, i], b"b")]),
                        )
                        .unwrap();
                    }
                }
            });
        }
    });
    assert_eq!(
        store.scan_prefix("conc", b"").await.unwrap().len(),
        4 * 25 + 4 * 5
    );
    assert_eq!(store.scan_prefix("conc2", b"").await.unwrap().len(), 4 * 5);
    assert_eq!(store.get("conc", &[3, 24]).await.unwrap(), Some(vec![24, 3]));
}

// covers: C2
/// Everything written is there after the store is closed and opened again (twice).
pub(crate) fn survives_reopen(open: Opener, root: &Path) {
    let data_dir = root.join("nested").join("data");
    {
        let store = open(&data_dir).unwrap();
        block_on(async {
            store.put("agents", b"a1", b"first").await.unwrap();
            store.put("agents", b"a2", b"second").await.unwrap();
            store.put("agents", b"a3", b"third").await.unwrap();
            assert!(store.delete("agents", b"a2").await.unwrap());
            store
                .batch(vec![
                    put("secrets", b"s1", b"sealed"),
                    put("agents", b"a1", b"updated"),
                ])
                .await
                .unwrap();
        });
    }
    for _ in 0..2 {
        let store = open(&data_dir).unwrap();
        block_on(async {
            assert_eq!(
                store.scan_prefix("agents", b"").await.unwrap(),
                vec![
                    (b"a1".to_vec(), b"updated".to_vec()),
                    (b"a3".to_vec(), b"third".to_vec())
                ]
            );
            assert_eq!(
                store.get("secrets", b"s1").await.unwrap().as_deref(),
                Some(&b"sealed"[..])
            );
            assert_eq!(store.get("never", b"s1").await.unwrap(), None);
        });
    }
}

// covers: C2
/// A second handle on an open database is refused with a store error, not a panic.
pub(crate) fn second_open_is_an_error(open: Opener, root: &Path) {
    let first = open(root).unwrap();
    let err = open(root).map(drop).unwrap_err();
    assert!(matches!(err, Error::Store { .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Storage);
    drop(first);
    open(root).unwrap();
}

// covers: C2
/// Two handles on one database (two server replicas) see each other's writes at once.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn second_open_shares_the_data(open: Opener, root: &Path) {
    let first = open(root).unwrap();
    let second = open(root).unwrap();
    block_on(async {
        first.put("shared", b"k", b"from first").await.unwrap();
        assert_eq!(
            second.get("shared", b"k").await.unwrap().as_deref(),
            Some(&b"from first"[..])
        );
        second
            .batch(vec![put("shared", b"k", b"from second"), del("shared", b"gone")])
            .await
            .unwrap();
        assert_eq!(
            first.scan_prefix("shared", b"").await.unwrap(),
            vec![(b"k".to_vec(), b"from second".to_vec())]
        );
    });
}

/// Sealed secrets kept in this backend (E10, S15): a writer of the store without the master key who
/// changes the rules stored beside a sealed value, or moves the value to another record, makes it fail to
/// open; the one-way migration mark survives a reopen.
// covers: S15, E10
pub(crate) fn vault_records_bind_their_rules(open: Opener, dir: &Path) {
    use agenthold_core::SecretId;
    use agenthold_core::secret::{SecretRule, SecretValue};
    use agenthold_core::vault::{MasterKey, Vault, legacy_migrated, mark_legacy_migrated};

    let vault = Vault::new(MasterKey::from_bytes([3; 32]));
    let rule = |host: &str| SecretRule::header(&[host], "authorization", "Bearer {{.Value}}").unwrap();
    // A record as a platform would keep it: the rules in the clear beside the sealed value.
    let record = |rules: &[SecretRule], sealed: &[u8]| {
        serde_json::to_vec(&serde_json::json!({"rules": rules, "sealed": sealed})).unwrap()
    };
    let read = |bytes: Vec<u8>| -> (Vec<SecretRule>, Vec<u8>) {
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        (
            serde_json::from_value(v["rules"].clone()).unwrap(),
            serde_json::from_value(v["sealed"].clone()).unwrap(),
        )
    };
    let (a, b) = (SecretId::new("a").unwrap(), SecretId::new("b").unwrap());
    {
        let store = open(dir).unwrap();
        assert!(
            !block_on(legacy_migrated(&*store)).unwrap(),
            "a new store is not marked"
        );
        let sealed_a = vault.seal(&a, &[rule("api.example.test")], &SecretValue::from("value-a"));
        let sealed_b = vault.seal(&b, &[rule("evil.test")], &SecretValue::from("value-b"));
        block_on(store.put("secrets", b"a", &record(&[rule("api.example.test")], &sealed_a))).unwrap();
        block_on(store.put("secrets", b"b", &record(&[rule("evil.test")], &sealed_b))).unwrap();
        block_on(mark_legacy_migrated(&*store)).unwrap();
    }
    {
        // The writer: a's rules now name evil.test; b's value is moved under a second key with a's rules.
        let store = open(dir).unwrap();
        assert!(
            block_on(legacy_migrated(&*store)).unwrap(),
            "the mark survives a reopen"
        );
        let (_, sealed_a) = read(block_on(store.get("secrets", b"a")).unwrap().unwrap());
        let (_, sealed_b) = read(block_on(store.get("secrets", b"b")).unwrap().unwrap());
        block_on(store.put("secrets", b"a", &record(&[rule("evil.test")], &sealed_a))).unwrap();
        block_on(store.put("secrets", b"a2", &record(&[rule("api.example.test")], &sealed_b))).unwrap();
    }
    let store = open(dir).unwrap();
    let (rules, sealed) = read(block_on(store.get("secrets", b"a")).unwrap().unwrap());
    assert!(
        matches!(vault.open(&a, &rules, &sealed), Err(Error::Decrypt { ref id }) if id == "a"),
        "redirected rules must not open"
    );
    let (rules, sealed) = read(block_on(store.get("secrets", b"a2")).unwrap().unwrap());
    assert!(
        vault.open(&a, &rules, &sealed).is_err(),
        "a moved value must not open"
    );
    let (rules, sealed) = read(block_on(store.get("secrets", b"b")).unwrap().unwrap());
    assert_eq!(vault.open(&b, &rules, &sealed).unwrap().expose(), b"value-b");
}
