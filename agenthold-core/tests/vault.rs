//! The vault and the master key (E10, S15): sealing, tamper detection, id and rule binding, the one-way
//! migration of the old format, key files and the `AGENTHOLD_MASTER_KEY` value.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use agenthold_core::secret::{Preset, SecretRule};
use agenthold_core::vault::{
    LEGACY_SEALED_VERSION, MasterKey, NONCE_LEN, SEALED_OVERHEAD, SEALED_VERSION, Vault, is_legacy,
};
use agenthold_core::{Error, SecretId, SecretValue};
use base64::Engine;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn id(s: &str) -> SecretId {
    SecretId::new(s).unwrap()
}

/// The rules every secret here is sealed with unless a test says otherwise.
fn rules() -> Vec<SecretRule> {
    vec![SecretRule::header(&["api.example.test"], "authorization", "Bearer {{.Value}}").unwrap()]
}

fn vault(byte: u8) -> Vault {
    Vault::new(MasterKey::from_bytes([byte; 32]))
}

fn is_decrypt_error(result: agenthold_core::Result<SecretValue>, expected_id: &str) -> bool {
    matches!(result, Err(Error::Decrypt { id }) if id == expected_id)
}

fn master_key_problem(result: agenthold_core::Result<MasterKey>) -> (String, String) {
    match result {
        Err(Error::MasterKey { source_name, problem }) => (source_name, problem),
        other => panic!("expected Error::MasterKey, got {other:?}"),
    }
}

/// A sealing/opening probe: whether `key` opens what `reference` sealed.
fn same_key(key: MasterKey, reference: MasterKey) -> bool {
    let sealed = Vault::new(reference).seal(&id("probe"), &rules(), &SecretValue::from("probe"));
    Vault::new(key).open(&id("probe"), &rules(), &sealed).is_ok()
}

fn write_mode(path: &Path, bytes: &[u8], mode: u32) {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

// covers: E10
#[test]
fn round_trip() {
    let v = vault(1);
    for value in ["", "sk-ant-api03-xyz", &"x".repeat(10_000)] {
        let sealed = v.seal(&id("anthropic"), &rules(), &SecretValue::from(value));
        assert_eq!(sealed.len(), value.len() + SEALED_OVERHEAD);
        assert_eq!(sealed[0], SEALED_VERSION);
        assert_eq!(
            v.open(&id("anthropic"), &rules(), &sealed).unwrap().expose(),
            value.as_bytes()
        );
    }
}

// covers: E10
#[test]
fn sealed_value_does_not_contain_the_plaintext() {
    let sealed = vault(1).seal(&id("s"), &rules(), &SecretValue::from("very-secret-token-value"));
    assert!(!sealed.windows(6).any(|w| w == b"secret"));
}

// covers: E10
#[test]
fn two_seals_of_the_same_value_differ() {
    let v = vault(1);
    let value = SecretValue::from("same value");
    let a = v.seal(&id("s"), &rules(), &value);
    let b = v.seal(&id("s"), &rules(), &value);
    assert_ne!(a, b);
    assert_ne!(a[1..=NONCE_LEN], b[1..=NONCE_LEN], "fresh nonce per seal");
    assert_eq!(
        v.open(&id("s"), &rules(), &a).unwrap(),
        v.open(&id("s"), &rules(), &b).unwrap()
    );
}

// covers: E10
#[test]
fn ciphertext_copied_onto_another_id_fails() {
    let v = vault(1);
    let sealed = v.seal(&id("github"), &rules(), &SecretValue::from("ghp_token"));
    assert!(is_decrypt_error(
        v.open(&id("gitlab"), &rules(), &sealed),
        "gitlab"
    ));
    assert!(v.open(&id("github"), &rules(), &sealed).is_ok());
}

// covers: E10
#[test]
fn wrong_master_key_fails_with_a_clear_error() {
    let sealed = vault(1).seal(&id("s"), &rules(), &SecretValue::from("value"));
    let err = vault(2).open(&id("s"), &rules(), &sealed).unwrap_err();
    assert!(matches!(err, Error::Decrypt { ref id } if id == "s"), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("secret s") && msg.contains("wrong master key"),
        "{msg}"
    );
    // Generated keys are distinct too.
    assert!(!same_key(
        MasterKey::generate().unwrap(),
        MasterKey::generate().unwrap()
    ));
}

// covers: E10
#[test]
fn every_flipped_bit_and_byte_fails() {
    let v = vault(3);
    let sealed = v.seal(&id("s"), &rules(), &SecretValue::from("0123456789"));
    for pos in 0..sealed.len() {
        for bit in 0..8 {
            let mut tampered = sealed.clone();
            tampered[pos] ^= 1 << bit;
            assert!(
                is_decrypt_error(v.open(&id("s"), &rules(), &tampered), "s"),
                "bit {bit} of byte {pos}"
            );
        }
        let mut tampered = sealed.clone();
        tampered[pos] ^= 0xff;
        assert!(
            is_decrypt_error(v.open(&id("s"), &rules(), &tampered), "s"),
            "byte {pos}"
        );
    }
}

// covers: E10
#[test]
fn truncated_and_extended_blobs_fail() {
    let v = vault(3);
    let sealed = v.seal(&id("s"), &rules(), &SecretValue::from("0123456789"));
    for len in 0..sealed.len() {
        assert!(
            is_decrypt_error(v.open(&id("s"), &rules(), &sealed[..len]), "s"),
            "length {len}"
        );
    }
    let mut longer = sealed.clone();
    longer.push(0);
    assert!(is_decrypt_error(v.open(&id("s"), &rules(), &longer), "s"));
    for unknown in [0, 3, 0xff] {
        let mut other_version = sealed.clone();
        other_version[0] = unknown;
        assert!(is_decrypt_error(v.open(&id("s"), &rules(), &other_version), "s"));
    }
    // Relabelled as the old format: refused as such by `open`, and `migrate` finds it does not open.
    let mut relabelled = sealed;
    relabelled[0] = LEGACY_SEALED_VERSION;
    assert!(matches!(
        v.open(&id("s"), &rules(), &relabelled),
        Err(Error::LegacySealed { ref id }) if id == "s"
    ));
    assert!(matches!(
        v.migrate(&id("s"), &rules(), &relabelled),
        Err(Error::Decrypt { ref id }) if id == "s"
    ));
}

/// Every way a store writer could redirect a sealed value by changing the rules stored beside it.
fn redirected_rule_sets() -> Vec<(&'static str, Vec<SecretRule>)> {
    let header =
        |hosts: &[&str], header: &str, template: &str| SecretRule::header(hosts, header, template).unwrap();
    let original = "Bearer {{.Value}}";
    vec![
        (
            "other host",
            vec![header(&["evil.test"], "authorization", original)],
        ),
        (
            "host added",
            vec![header(
                &["api.example.test", "evil.test"],
                "authorization",
                original,
            )],
        ),
        ("host repeated", {
            let mut r = rules();
            let first = r[0].hosts[0].clone();
            r[0].hosts.insert(0, first);
            r
        }),
        (
            "wildcard",
            vec![header(&["*.example.test"], "authorization", original)],
        ),
        (
            "other header",
            vec![header(&["api.example.test"], "x-echo", original)],
        ),
        (
            "other template",
            vec![header(
                &["api.example.test"],
                "authorization",
                "{{base64 .Value}}",
            )],
        ),
        (
            "template prefix",
            vec![header(&["api.example.test"], "authorization", "Basic {{.Value}}")],
        ),
        ("rule added", {
            let mut r = rules();
            r.push(header(&["evil.test"], "authorization", original));
            r
        }),
        ("no rules", Vec::new()),
        ("preset", Preset::GitHub.rules()),
        (
            "login",
            vec![SecretRule::login(&["api.example.test"], "authorization", &[]).unwrap()],
        ),
        (
            "login paths",
            vec![SecretRule::login(&["api.example.test"], "authorization", &["/a"]).unwrap()],
        ),
        (
            "token refresh",
            vec![SecretRule::token_refresh(&["api.example.test"], "/oauth/token", "s").unwrap()],
        ),
    ]
}

// covers: S15, E10
#[test]
fn a_value_opens_only_with_the_rules_it_was_sealed_with() {
    let v = vault(4);
    let sealed = v.seal(&id("s"), &rules(), &SecretValue::from("sk-value"));
    assert_eq!(v.open(&id("s"), &rules(), &sealed).unwrap().expose(), b"sk-value");
    for (what, redirected) in redirected_rule_sets() {
        let err = v.open(&id("s"), &redirected, &sealed).unwrap_err();
        assert!(
            matches!(err, Error::Decrypt { ref id } if id == "s"),
            "{what}: {err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("secret s") && msg.contains("rules"), "{what}: {msg}");
        assert!(!msg.contains("sk-value"), "{what}: {msg}");
    }
    // Rules that merely spell the same thing differently are the same rules (they are normalised when parsed).
    let respelled =
        vec![SecretRule::header(&["API.Example.Test."], "Authorization", "Bearer {{.Value}}").unwrap()];
    assert!(v.open(&id("s"), &respelled, &sealed).is_ok());
    // Presets bind like any rule set.
    let gh = v.seal(&id("gh"), &Preset::GitHub.rules(), &SecretValue::from("ghp"));
    assert!(v.open(&id("gh"), &Preset::GitHub.rules(), &gh).is_ok());
    assert!(v.open(&id("gh"), &Preset::GitLab.rules(), &gh).is_err());
}

// covers: S15, E10
#[test]
fn values_swapped_between_two_secrets_fail() {
    let v = vault(4);
    let other_rules = vec![SecretRule::header(&["evil.test"], "authorization", "{{.Value}}").unwrap()];
    let a = v.seal(&id("a"), &rules(), &SecretValue::from("value-a"));
    let b = v.seal(&id("b"), &other_rules, &SecretValue::from("value-b"));
    // Each record keeps its id and rules and takes the other's sealed value, or its rules too.
    assert!(is_decrypt_error(v.open(&id("a"), &rules(), &b), "a"));
    assert!(is_decrypt_error(v.open(&id("b"), &other_rules, &a), "b"));
    assert!(is_decrypt_error(v.open(&id("a"), &other_rules, &b), "a"));
    assert!(is_decrypt_error(v.open(&id("a"), &other_rules, &a), "a"));
}

/// What the vault sealed before rules were bound (version 1: AAD = the id only), built with the cipher
/// directly as that version did.
fn legacy_seal(key: [u8; 32], id: &str, value: &[u8]) -> Vec<u8> {
    use chacha20poly1305::aead::{AeadInOut, KeyInit};
    use chacha20poly1305::{XChaCha20Poly1305, XNonce};
    let cipher = XChaCha20Poly1305::new(&key.into());
    let nonce = XNonce::from([9u8; 24]);
    let mut out = vec![1u8];
    out.extend_from_slice(&nonce);
    out.extend_from_slice(value);
    let tag = cipher
        .encrypt_inout_detached(&nonce, id.as_bytes(), (&mut out[1 + NONCE_LEN..]).into())
        .unwrap();
    out.extend_from_slice(&tag);
    out
}

// covers: S15, E10
#[test]
fn an_old_value_migrates_once_and_then_opens_only_with_its_rules() {
    let v = vault(5);
    let old = legacy_seal([5; 32], "s", b"sk-old");
    assert!(is_legacy(&old));
    // `open` never accepts the old format: it binds no rules.
    assert!(matches!(
        v.open(&id("s"), &rules(), &old),
        Err(Error::LegacySealed { ref id }) if id == "s"
    ));
    // The migration checks the old AAD (id) and key...
    assert!(is_decrypt_error(
        v.migrate(&id("t"), &rules(), &old).map(|(v, _)| v),
        "t"
    ));
    assert!(is_decrypt_error(
        vault(6).migrate(&id("s"), &rules(), &old).map(|(v, _)| v),
        "s"
    ));
    let mut tampered = old.clone();
    tampered[30] ^= 1;
    assert!(is_decrypt_error(
        v.migrate(&id("s"), &rules(), &tampered).map(|(v, _)| v),
        "s"
    ));
    // ...and re-seals in the current format, bound to the rules given.
    let (value, resealed) = v.migrate(&id("s"), &rules(), &old).unwrap();
    assert_eq!(value.expose(), b"sk-old");
    assert_eq!(resealed[0], SEALED_VERSION);
    assert!(!is_legacy(&resealed));
    assert_eq!(v.open(&id("s"), &rules(), &resealed).unwrap().expose(), b"sk-old");
    for (what, redirected) in redirected_rule_sets() {
        assert!(
            is_decrypt_error(v.open(&id("s"), &redirected, &resealed), "s"),
            "{what}"
        );
    }
    // A current value is not "migrated" again.
    assert!(is_decrypt_error(
        v.migrate(&id("s"), &rules(), &resealed).map(|(v, _)| v),
        "s"
    ));
}

// covers: E10
#[test]
fn key_file_is_created_0600_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/data/master.key");
    let first = MasterKey::load(&path, None).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 32);
    assert_eq!(
        fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o077,
        0
    );
    // No temporary file is left behind.
    assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
    let second = MasterKey::load(&path, None).unwrap();
    assert!(same_key(first, second));
    let bytes: [u8; 32] = fs::read(&path).unwrap().try_into().unwrap();
    assert!(same_key(
        MasterKey::load(&path, None).unwrap(),
        MasterKey::from_bytes(bytes)
    ));
}

// covers: E10
#[test]
fn loose_permissions_are_refused() {
    for mode in [0o644, 0o640, 0o604, 0o660, 0o610] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        write_mode(&path, &[9; 32], mode);
        let (source, problem) = master_key_problem(MasterKey::load(&path, None));
        assert_eq!(source, path.display().to_string());
        assert!(
            problem.contains(&format!("chmod 600 {}", path.display())),
            "{mode:o}: {problem}"
        );
        assert!(problem.contains(&format!("{mode:04o}")), "{problem}");
    }
    // Stricter than 0600 is fine.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    write_mode(&path, &[9; 32], 0o400);
    assert!(same_key(
        MasterKey::load(&path, None).unwrap(),
        MasterKey::from_bytes([9; 32])
    ));
}

// covers: E10
#[test]
fn wrong_length_file_is_refused() {
    for len in [0usize, 16, 31, 33, 44, 64] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        write_mode(&path, &vec![1; len], 0o600);
        let (_, problem) = master_key_problem(MasterKey::load(&path, None));
        assert!(
            problem.contains(&format!("expected 32 bytes, found {len}")),
            "{problem}"
        );
    }
}

// covers: E10
#[test]
fn a_directory_at_the_key_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    fs::create_dir(&path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
    assert!(MasterKey::load(&path, None).is_err());
}

// covers: E10
#[test]
fn env_key_wins_over_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let env = B64.encode([5u8; 32]);
    // Missing file: the env key is used and no file is created.
    let key = MasterKey::load(&path, Some(&env)).unwrap();
    assert!(!path.exists());
    assert!(same_key(key, MasterKey::from_bytes([5; 32])));
    // Existing file with another key: the env key still wins.
    write_mode(&path, &[6; 32], 0o600);
    let key = MasterKey::load(&path, Some(&env)).unwrap();
    assert!(same_key(key, MasterKey::from_bytes([5; 32])));
    // Whitespace around the value (a newline from a secret file) is ignored.
    let key = MasterKey::load(&path, Some(&format!(" {env}\n"))).unwrap();
    assert!(same_key(key, MasterKey::from_bytes([5; 32])));
}

// covers: E10
#[test]
fn bad_env_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let short = B64.encode([5u8; 31]);
    let long = B64.encode([5u8; 33]);
    let url_safe = base64::engine::general_purpose::URL_SAFE.encode([0xffu8; 32]);
    let padded = B64.encode([5u8; 32]);
    let cases: [(&str, &str); 7] = [
        ("", "empty"),
        ("   ", "empty"),
        ("not base64 at all!", "base64"),
        (&short, "decodes to 31 bytes, expected 32 bytes"),
        (&long, "decodes to 33 bytes, expected 32 bytes"),
        (&url_safe, "base64"),
        (padded.trim_end_matches('='), "base64"),
    ];
    for (value, expected) in cases {
        let (source, problem) = master_key_problem(MasterKey::load(&path, Some(value)));
        assert_eq!(source, "AGENTHOLD_MASTER_KEY");
        assert!(problem.contains(expected), "{value:?}: {problem}");
        assert!(problem.contains("head -c 32 /dev/urandom | base64"), "{problem}");
        assert!(
            value.trim().is_empty() || !problem.contains(value.trim()),
            "message echoes the value"
        );
    }
    assert!(!path.exists());
}

// covers: E10
#[test]
fn debug_output_contains_no_key_or_value_bytes() {
    let key = MasterKey::from_bytes([0xab; 32]);
    let dbg = format!("{key:?} {key:#?}");
    assert!(!dbg.contains("ab") && !dbg.contains("171"), "{dbg}");
    let v = Vault::new(key);
    let dbg = format!("{v:?}");
    assert!(!dbg.contains("ab") && !dbg.contains("171"), "{dbg}");
    let value = v
        .open(
            &id("s"),
            &rules(),
            &v.seal(&id("s"), &rules(), &SecretValue::from("hunter2-sk")),
        )
        .unwrap();
    let dbg = format!("{value:?} {value:#?}");
    assert!(!dbg.contains("hunter2"), "{dbg}");
    let err = master_key_problem(MasterKey::from_base64(&B64.encode([0xcd; 31])));
    assert!(!format!("{err:?}").contains(&B64.encode([0xcd; 31])));
}

// covers: E10
#[test]
fn concurrent_first_loads_agree_on_one_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let keys: Vec<MasterKey> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| MasterKey::load(&path, None).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let bytes: [u8; 32] = fs::read(&path).unwrap().try_into().unwrap();
    for key in keys {
        assert!(same_key(key, MasterKey::from_bytes(bytes)));
    }
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file is left behind"
    );
}
