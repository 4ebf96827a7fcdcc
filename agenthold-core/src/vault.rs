//! Encryption of secret values at rest (E10, S15): the [`MasterKey`] and the [`Vault`] that seals and opens
//! secret values with XChaCha20-Poly1305 under it.
//!
//! # Sealed format
//!
//! ```text
//! version (1 byte, = 2) || nonce (24 bytes, random per seal) || ciphertext (len of value) || tag (16 bytes)
//! ```
//!
//! A sealed value is [`SEALED_OVERHEAD`] (41) bytes longer than the value. The associated data (AAD) binds
//! the value to the secret it belongs to *and to where it may go* (S15):
//!
//! ```text
//! "agenthold-vault-v2\0" || str(secret id) || u32(rule count) || rule...
//! rule = str("header")        || hosts || str(header) || str(template source)
//!      | str("login")         || hosts || str(header) || u32(n) || str(path prefix)...
//!      | str("token_refresh") || hosts || str(token path) || str(access secret)
//! hosts = u32(n) || str(host)...   (an exact name, `*.suffix`, in the rule's order)
//! str(x) = u32(byte length of x) || x          u32 = 4 bytes, big endian
//! ```
//!
//! This encoding is the vault's own (not the rules' JSON form), so it changes only with this format's
//! version. A store writer without the master key can therefore neither copy a sealed value onto another
//! secret (id) nor point a secret at other hosts, another header or another template (rules): either
//! fails [`Vault::open`] with [`Error::Decrypt`] naming the secret, and the value is never returned.
//!
//! # The format before rules were bound (version 1) and its migration
//!
//! Version 1 (agenthold before S15) had the same layout with version byte `1` and AAD = the secret id
//! only. [`Vault::open`] refuses it ([`Error::LegacySealed`]); [`Vault::migrate`] opens it once under the
//! old AAD (so tampering with the bytes or the id is still detected), then seals the value again in the
//! current format under the rules stored beside it. Whoever keeps the records decides when that happens:
//! the sandbox runtime migrates every record when it starts and then records in the store
//! ([`LEGACY_MIGRATION_TABLE`]) that the migration is done, after which it refuses version 1 records. The
//! upgrade is one way: nothing ever seals version 1 again, and an older agenthold cannot open version 2.
//! Version 1 carries no rules, so a version 1 value that is still around (an old backup of the store) must
//! be treated as unbound: see `docs/secrets.md`.
//!
//! # Master key
//!
//! 32 bytes, from `AGENTHOLD_MASTER_KEY` (standard base64 with padding, 44 characters; generate one with
//! `head -c 32 /dev/urandom | base64`) when that variable is set, otherwise from the key file
//! (`secrets.master_key_file`, default `<data_dir>/master.key`) holding exactly 32 raw bytes with mode 0600.
//! The file is created from the operating system's random generator on first start. Back it up: without
//! it no secret can be decrypted.
// enforces: E10 S15

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use chacha20poly1305::aead::{AeadInOut, Generate, KeyInit};
use chacha20poly1305::{Tag, XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

use crate::error::{Error, Result};
use crate::ids::SecretId;
use crate::policy::HostPattern;
use crate::secret::{RuleKind, SecretRule, SecretValue};
use crate::store::Store;

/// Name of the environment variable that carries the master key (base64), taking precedence over the file.
pub const MASTER_KEY_ENV: &str = "AGENTHOLD_MASTER_KEY";

/// Length of the master key in bytes.
pub const MASTER_KEY_LEN: usize = 32;

/// Version byte at the start of every value sealed now: AAD = secret id and rules.
pub const SEALED_VERSION: u8 = 2;

/// Version byte of values sealed before rules were bound (AAD = secret id only); only [`Vault::migrate`]
/// opens them.
pub const LEGACY_SEALED_VERSION: u8 = 1;

/// Store table of the vault's own bookkeeping: key [`LEGACY_MIGRATION_KEY`] exists once every version 1
/// record of the store was migrated (see the [module documentation](self)).
pub const LEGACY_MIGRATION_TABLE: &str = "vault";

/// Key in [`LEGACY_MIGRATION_TABLE`] recording that version 1 records were migrated.
pub const LEGACY_MIGRATION_KEY: &[u8] = b"legacy_migrated";

/// Domain separation at the start of every version 2 AAD.
const AAD_CONTEXT: &[u8] = b"agenthold-vault-v2\0";

/// Length of the random nonce stored in every sealed value.
pub const NONCE_LEN: usize = 24;

/// Length of the Poly1305 authentication tag at the end of every sealed value.
pub const TAG_LEN: usize = 16;

/// How many bytes longer a sealed value is than the value: version byte, nonce and tag.
pub const SEALED_OVERHEAD: usize = 1 + NONCE_LEN + TAG_LEN;

const GENERATE_HINT: &str = "generate one with `head -c 32 /dev/urandom | base64`";

/// The 32-byte key that every secret value is encrypted under. Zeroized on drop; its `Debug` never shows
/// the key, and it has no `Display`, `Serialize` or accessor for the bytes.
pub struct MasterKey(Zeroizing<[u8; MASTER_KEY_LEN]>);

impl MasterKey {
    /// A key from raw bytes (the caller's copy is not zeroized by this call).
    #[must_use]
    pub fn from_bytes(bytes: [u8; MASTER_KEY_LEN]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// A fresh key from the operating system's random generator.
    ///
    /// # Errors
    /// [`Error::MasterKey`] when the random generator fails.
    pub fn generate() -> Result<Self> {
        let mut key = Zeroizing::new([0u8; MASTER_KEY_LEN]);
        getrandom::fill(key.as_mut_slice()).map_err(|e| Error::MasterKey {
            source_name: "operating system random generator".into(),
            problem: format!("could not generate a master key: {e}"),
        })?;
        Ok(Self(key))
    }

    /// A key from the value of `AGENTHOLD_MASTER_KEY`: standard base64 with padding of exactly 32 bytes.
    /// Leading and trailing whitespace (a newline from a secret file) is ignored.
    ///
    /// # Errors
    /// [`Error::MasterKey`] naming `AGENTHOLD_MASTER_KEY` when the value is empty, not base64, or does not
    /// decode to 32 bytes. The message never contains the value.
    pub fn from_base64(value: &str) -> Result<Self> {
        let fail = |problem: String| Error::MasterKey {
            source_name: MASTER_KEY_ENV.into(),
            problem,
        };
        let value = value.trim();
        if value.is_empty() {
            return Err(fail(format!(
                "is set but empty; unset it to use the key file, or set it to 32 bytes in standard base64 \
                 ({GENERATE_HINT})"
            )));
        }
        let decoded = Zeroizing::new(base64::engine::general_purpose::STANDARD.decode(value).map_err(
            |_| {
                fail(format!(
                    "is not valid standard base64 (with '=' padding) of 32 bytes; {GENERATE_HINT}"
                ))
            },
        )?);
        let key: [u8; MASTER_KEY_LEN] = decoded.as_slice().try_into().map_err(|_| {
            fail(format!(
                "decodes to {} bytes, expected {MASTER_KEY_LEN} bytes; {GENERATE_HINT}",
                decoded.len()
            ))
        })?;
        Ok(Self::from_bytes(key))
    }

    /// Load the master key: from `env_value` (the value of `AGENTHOLD_MASTER_KEY`, see
    /// [`MasterKey::from_base64`]) when it is present, otherwise from `key_file`.
    ///
    /// The key file holds exactly 32 raw bytes and must not be accessible to group or others (mode 0600 or
    /// stricter). When it does not exist it is created with mode 0600 (parent directories with mode 0700)
    /// from the operating system's random generator: written and synced under a temporary name, then
    /// linked into place, so neither a partial key nor a readable one is ever visible. When the
    /// environment value is present the file is neither read nor created.
    ///
    /// # Errors
    /// [`Error::MasterKey`] for a bad environment value, a key file with permissions looser than 0600
    /// (the message says `chmod 600 PATH`) or a length other than 32 bytes; [`Error::Io`] when the file or
    /// its directory cannot be read or written.
    pub fn load(key_file: &Path, env_value: Option<&str>) -> Result<Self> {
        if let Some(value) = env_value {
            return Self::from_base64(value);
        }
        if key_file.as_os_str().is_empty() {
            return Err(Error::MasterKey {
                source_name: "secrets.master_key_file".into(),
                problem: "the key file path is empty".into(),
            });
        }
        match File::open(key_file) {
            Ok(file) => read_key_file(key_file, file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => create_key_file(key_file),
            Err(e) => Err(Error::io(key_file, e)),
        }
    }

    /// [`MasterKey::load`] with the value of `AGENTHOLD_MASTER_KEY` read from the process environment (it
    /// is never set or removed). A value that is not valid Unicode is refused.
    ///
    /// # Errors
    /// As [`MasterKey::load`].
    pub fn load_from_env_or_file(key_file: &Path) -> Result<Self> {
        match std::env::var_os(MASTER_KEY_ENV) {
            None => Self::load(key_file, None),
            Some(value) => match value.to_str() {
                Some(value) => Self::load(key_file, Some(value)),
                None => Err(Error::MasterKey {
                    source_name: MASTER_KEY_ENV.into(),
                    problem: format!("is not valid UTF-8; {GENERATE_HINT}"),
                }),
            },
        }
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

/// Read and check an existing key file (permissions from the open handle, so the file checked is the
/// file read).
fn read_key_file(path: &Path, mut file: File) -> Result<MasterKey> {
    let fail = |problem: String| Error::MasterKey {
        source_name: path.display().to_string(),
        problem,
    };
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(fail("is not a regular file".into()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(fail(format!(
            "permissions {mode:04o} let group or others access the master key; restrict them with \
             `chmod 600 {}`",
            path.display()
        )));
    }
    let len = meta.len();
    if len != MASTER_KEY_LEN as u64 {
        let hint = if (43..=45).contains(&len) {
            " (the file holds raw bytes, not base64: put a base64 key in AGENTHOLD_MASTER_KEY instead)"
        } else {
            ""
        };
        return Err(fail(format!(
            "expected {MASTER_KEY_LEN} bytes, found {len}{hint}; restore the file from its backup, or \
             remove it to generate a new key (secrets sealed under the old key are then lost)"
        )));
    }
    let mut key = Zeroizing::new([0u8; MASTER_KEY_LEN]);
    file.read_exact(key.as_mut_slice())
        .map_err(|e| Error::io(path, e))?;
    Ok(MasterKey(key))
}

/// Create a new key file atomically; when another process wins the race, load its key instead.
fn create_key_file(path: &Path) -> Result<MasterKey> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| Error::io(&dir, e))?;
    let key = MasterKey::generate()?;
    let tmp = temp_path(path)?;
    let written = write_new_file(&tmp, key.0.as_slice());
    let linked = written.and_then(|()| match fs::hard_link(&tmp, path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io(path, e)),
    });
    // The temporary name never outlives this call, whatever happened.
    let _ = fs::remove_file(&tmp);
    if !linked? {
        return match File::open(path) {
            Ok(file) => read_key_file(path, file),
            Err(e) => Err(Error::io(path, e)),
        };
    }
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(&dir, e))?;
    tracing::info!(path = %path.display(), "created a new master key; back this file up");
    Ok(key)
}

/// Create `path` (which must not exist) with mode 0600, write `bytes` and sync.
fn write_new_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(path, e))
}

/// A unique temporary name next to `path`.
fn temp_path(path: &Path) -> Result<PathBuf> {
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix).map_err(|e| Error::MasterKey {
        source_name: path.display().to_string(),
        problem: format!("operating system random generator failed: {e}"),
    })?;
    let name = path
        .file_name()
        .map_or_else(|| "master.key".into(), |n| n.to_string_lossy());
    let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
    Ok(path.with_file_name(format!(".{name}.tmp-{}-{suffix}", std::process::id())))
}

/// Seals and opens secret values under the master key with XChaCha20-Poly1305 (see the
/// [module documentation](self) for the format).
pub struct Vault {
    // Zeroizes its copy of the key on drop (chacha20poly1305's `zeroize` feature).
    cipher: XChaCha20Poly1305,
}

impl Vault {
    /// A vault under `key`. The key is consumed: its bytes are zeroized when this returns and the vault
    /// holds the only copy.
    #[must_use]
    pub fn new(key: MasterKey) -> Self {
        let MasterKey(bytes) = key;
        let cipher = XChaCha20Poly1305::new(&(*bytes).into());
        Self { cipher }
    }

    /// Encrypt `value` for the secret `id` whose injection rules are `rules`, with a fresh random nonce. The
    /// id and the rules are bound into the AAD: [`Vault::open`] succeeds only with both unchanged.
    ///
    /// # Panics
    /// When the operating system's random generator fails (a nonce from a broken generator could repeat,
    /// which is worse than stopping), or for a value longer than 256 GiB.
    #[must_use]
    pub fn seal(&self, id: &SecretId, rules: &[SecretRule], value: &SecretValue) -> Vec<u8> {
        self.seal_with(SEALED_VERSION, &aad(id, rules), value)
    }

    /// Decrypt `sealed` for the secret `id` with the injection rules `rules`.
    ///
    /// # Errors
    /// [`Error::LegacySealed`] for a value sealed before rules were bound (see [`Vault::migrate`]);
    /// [`Error::Decrypt`] when the bytes are too short, carry an unknown version, were tampered with, were
    /// sealed under another master key, for another secret id, or with other rules.
    pub fn open(&self, id: &SecretId, rules: &[SecretRule], sealed: &[u8]) -> Result<SecretValue> {
        if sealed.first() == Some(&LEGACY_SEALED_VERSION) {
            return Err(Error::LegacySealed { id: id.to_string() });
        }
        self.open_with(SEALED_VERSION, id, &aad(id, rules), sealed)
    }

    /// The one-way upgrade of a version 1 value (AAD = `id` only): open it under the old AAD, then seal it
    /// again for `id` and `rules` in the current format. Returns the value and the new sealed bytes, which
    /// the caller stores in place of the old ones.
    ///
    /// Call it only while migrating records that predate the current format: a version 1 value binds no
    /// rules, so whatever `rules` are given here become its rules.
    ///
    /// # Errors
    /// [`Error::Decrypt`] when `sealed` is not a version 1 value that opens for `id` under this key.
    pub fn migrate(
        &self,
        id: &SecretId,
        rules: &[SecretRule],
        sealed: &[u8],
    ) -> Result<(SecretValue, Vec<u8>)> {
        let value = self.open_with(LEGACY_SEALED_VERSION, id, id.as_str().as_bytes(), sealed)?;
        let resealed = self.seal(id, rules, &value);
        Ok((value, resealed))
    }

    fn seal_with(&self, version: u8, aad: &[u8], value: &SecretValue) -> Vec<u8> {
        let nonce = XNonce::generate();
        let plain = value.expose();
        let mut out = Vec::with_capacity(plain.len() + SEALED_OVERHEAD);
        out.push(version);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let body = &mut out[1 + NONCE_LEN..];
        // Encryption fails only for messages longer than XChaCha20's 256 GiB limit.
        #[allow(clippy::expect_used)]
        let tag = self
            .cipher
            .encrypt_inout_detached(&nonce, aad, body.into())
            .expect("secret value longer than 256 GiB");
        out.extend_from_slice(&tag);
        out
    }

    fn open_with(&self, version: u8, id: &SecretId, aad: &[u8], sealed: &[u8]) -> Result<SecretValue> {
        let fail = || Error::Decrypt { id: id.to_string() };
        if sealed.len() < SEALED_OVERHEAD || sealed[0] != version {
            return Err(fail());
        }
        let (nonce, rest) = sealed[1..].split_at(NONCE_LEN);
        let (ciphertext, tag) = rest.split_at(rest.len() - TAG_LEN);
        let nonce = XNonce::try_from(nonce).map_err(|_| fail())?;
        let tag = Tag::try_from(tag).map_err(|_| fail())?;
        let mut plain = Zeroizing::new(ciphertext.to_vec());
        self.cipher
            .decrypt_inout_detached(&nonce, aad, plain.as_mut_slice().into(), &tag)
            .map_err(|_| fail())?;
        Ok(SecretValue::new(std::mem::take(&mut *plain)))
    }
}

/// Whether `sealed` is a version 1 value (sealed before rules were bound), which [`Vault::migrate`] upgrades.
#[must_use]
pub fn is_legacy(sealed: &[u8]) -> bool {
    sealed.first() == Some(&LEGACY_SEALED_VERSION)
}

/// Whether `store` recorded that its version 1 records were migrated ([`mark_legacy_migrated`]); from then
/// on a version 1 record there is refused rather than migrated.
///
/// # Errors
/// When the store fails.
pub async fn legacy_migrated(store: &dyn Store) -> Result<bool> {
    Ok(store
        .get(LEGACY_MIGRATION_TABLE, LEGACY_MIGRATION_KEY)
        .await?
        .is_some())
}

/// Record in `store` that every version 1 record was migrated (call it after the last one was stored again;
/// it is durable when this returns).
///
/// # Errors
/// When the store fails.
pub async fn mark_legacy_migrated(store: &dyn Store) -> Result<()> {
    store
        .put(LEGACY_MIGRATION_TABLE, LEGACY_MIGRATION_KEY, &[SEALED_VERSION])
        .await
}

/// The version 2 AAD of a secret: see the [module documentation](self).
fn aad(id: &SecretId, rules: &[SecretRule]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 96 * rules.len());
    out.extend_from_slice(AAD_CONTEXT);
    put_str(&mut out, id.as_str());
    put_len(&mut out, rules.len());
    for rule in rules {
        // Every field of every kind is bound: a new field or kind must be added here (the destructuring
        // patterns below list every field, so the compiler points at this function).
        let SecretRule { hosts, kind } = rule;
        match kind {
            RuleKind::Header {
                header,
                template,
                also_in,
            } => {
                put_str(&mut out, "header");
                put_hosts(&mut out, hosts);
                put_str(&mut out, header);
                put_str(&mut out, template.source());
                // Only when present, so that a rule without it binds what it always bound.
                if !also_in.is_empty() {
                    put_str(&mut out, "also_in");
                    for list in [&also_in.headers, &also_in.query] {
                        put_len(&mut out, list.len());
                        for name in list {
                            put_str(&mut out, name);
                        }
                    }
                }
            }
            RuleKind::Login {
                header,
                path_prefixes,
            } => {
                put_str(&mut out, "login");
                put_hosts(&mut out, hosts);
                put_str(&mut out, header);
                put_len(&mut out, path_prefixes.len());
                for prefix in path_prefixes {
                    put_str(&mut out, prefix);
                }
            }
            RuleKind::TokenRefresh { path, access_secret } => {
                put_str(&mut out, "token_refresh");
                put_hosts(&mut out, hosts);
                put_str(&mut out, path);
                put_str(&mut out, access_secret);
            }
        }
    }
    out
}

fn put_hosts(out: &mut Vec<u8>, hosts: &[HostPattern]) {
    put_len(out, hosts.len());
    for host in hosts {
        match host {
            HostPattern::Exact(name) => put_str(out, name),
            HostPattern::Subdomains(suffix) => put_str(out, &format!("*.{suffix}")),
            // Rules refuse addresses; bound anyway, in a form no name can take.
            HostPattern::Network(net) => put_str(out, &format!("net:{net}")),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    // Lengths are of ids, names, templates and rule lists: far below 4 GiB.
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
}

impl fmt::Debug for Vault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Vault(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_layout_is_version_nonce_ciphertext_tag() {
        let vault = Vault::new(MasterKey::from_bytes([7; 32]));
        let id = SecretId::new("s1").unwrap();
        let sealed = vault.seal(&id, &[], &SecretValue::from("hello"));
        assert_eq!(sealed.len(), 5 + SEALED_OVERHEAD);
        assert_eq!(sealed[0], SEALED_VERSION);
        assert_ne!(&sealed[1 + NONCE_LEN..1 + NONCE_LEN + 5], b"hello");
    }

    #[test]
    fn aad_is_length_prefixed_and_binds_every_field() {
        let id = SecretId::new("s1").unwrap();
        let rule = |hosts: &[&str], header: &str, template: &str| {
            SecretRule::header(hosts, header, template).unwrap()
        };
        let base = aad(&id, &[rule(&["a.test"], "x-key", "{{.Value}}")]);
        let mut expected = AAD_CONTEXT.to_vec();
        for part in [
            &[0, 0, 0, 2][..],
            b"s1",
            &[0, 0, 0, 1],
            &[0, 0, 0, 6],
            b"header",
            &[0, 0, 0, 1],
        ] {
            expected.extend_from_slice(part);
        }
        for part in [
            &[0, 0, 0, 6][..],
            b"a.test",
            &[0, 0, 0, 5],
            b"x-key",
            &[0, 0, 0, 10],
            b"{{.Value}}",
        ] {
            expected.extend_from_slice(part);
        }
        assert_eq!(base, expected);
        // Moving bytes between fields changes the AAD (no two rule sets share one).
        let others = [
            aad(&id, &[rule(&["a.tes"], "tx-key", "{{.Value}}")]),
            aad(&id, &[rule(&["a.test", "b.test"], "x-key", "{{.Value}}")]),
            aad(&id, &[rule(&["*.a.test"], "x-key", "{{.Value}}")]),
            aad(
                &id,
                &[
                    rule(&["a.test"], "x-key", "{{.Value}}"),
                    rule(&["a.test"], "x-key", "{{.Value}}"),
                ],
            ),
            aad(&id, &[]),
            aad(
                &SecretId::new("s2").unwrap(),
                &[rule(&["a.test"], "x-key", "{{.Value}}")],
            ),
            aad(&id, &[SecretRule::login(&["a.test"], "x-key", &[]).unwrap()]),
            aad(
                &id,
                &[SecretRule::token_refresh(&["a.test"], "/t", "x-key").unwrap()],
            ),
            // A store writer cannot add places the placeholder is replaced in (E13).
            aad(
                &id,
                &[rule(&["a.test"], "x-key", "{{.Value}}")
                    .with_also_in(crate::secret::AlsoIn::new(&["x-other"], &[]).unwrap())
                    .unwrap()],
            ),
            aad(
                &id,
                &[rule(&["a.test"], "x-key", "{{.Value}}")
                    .with_also_in(crate::secret::AlsoIn::new(&[], &["x-other"]).unwrap())
                    .unwrap()],
            ),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(other, &base, "case {i}");
        }
    }

    #[test]
    fn base64_key_with_trailing_newline_is_accepted() {
        let b64 = base64::engine::general_purpose::STANDARD.encode([1u8; 32]);
        assert!(MasterKey::from_base64(&format!("{b64}\n")).is_ok());
        // Unpadded base64 is refused: the documented encoding is padded.
        assert!(MasterKey::from_base64(b64.trim_end_matches('=')).is_err());
    }
}
