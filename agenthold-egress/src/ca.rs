//! The installation's certificate authority (E14) and the leaf certificates it mints for intercepted hosts.
//!
//! The CA is generated on first start at `<dir>/ca.crt` with its key beside it (`ca.key`, mode 0600, never
//! leaves the gateway) and reused afterwards. Leaf certificates are minted per host on demand, valid for a
//! short time, and kept in a bounded LRU cache so a repeat handshake costs no signature. All leaves share
//! one key pair generated at start (it is never written anywhere): minting is then a single ECDSA
//! signature, and a stolen leaf is useless a day later.
// enforces: E14

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::num::NonZeroUsize;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::{Error, Result};

/// How long a minted leaf certificate is valid.
const LEAF_VALIDITY: Duration = Duration::from_secs(48 * 3600);
/// Reissue a cached leaf after this long (well before it expires).
const LEAF_REFRESH: Duration = Duration::from_secs(24 * 3600);
/// Leaves kept in the cache.
const LEAF_CACHE: usize = 1024;
/// How long a new CA is valid.
const CA_VALIDITY_DAYS: i64 = 3650;

/// The CA and its leaf cache.
pub struct CertificateAuthority {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    cert_path: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    leaf_key: KeyPair,
    leaf_signer: Arc<dyn rustls::sign::SigningKey>,
    cache: Mutex<lru::LruCache<String, (Arc<CertifiedKey>, Instant)>>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

fn tls_error(problem: impl std::fmt::Display) -> Error {
    Error::Tls {
        problem: problem.to_string(),
    }
}

impl CertificateAuthority {
    /// Load the CA from `dir` (`ca.crt`, `ca.key`), creating both on first start.
    ///
    /// # Errors
    /// When the files cannot be read or written, the key file is readable by others, or they do not hold
    /// a CA certificate and its key.
    pub fn load_or_create(dir: &Path) -> Result<Self> {
        let cert_path = dir.join("ca.crt");
        let key_path = dir.join("ca.key");
        if !key_path.exists() {
            create(dir, &cert_path, &key_path)?;
        }
        let meta =
            fs::metadata(&key_path).map_err(|e| Error::io(format!("stat {}", key_path.display()), e))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(tls_error(format!(
                "{} is readable by group or others; run `chmod 600 {}`",
                key_path.display(),
                key_path.display()
            )));
        }
        let key_pem = fs::read_to_string(&key_path)
            .map_err(|e| Error::io(format!("read {}", key_path.display()), e))?;
        let cert_pem = fs::read_to_string(&cert_path)
            .map_err(|e| Error::io(format!("read {}", cert_path.display()), e))?;
        let key =
            KeyPair::from_pem(&key_pem).map_err(|e| tls_error(format!("{}: {e}", key_path.display())))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .map_err(|e| tls_error(format!("{}: {e}", cert_path.display())))?;
        let cert_der = rustls_pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| tls_error(format!("{}: {e}", cert_path.display())))?;
        let leaf_key = KeyPair::generate().map_err(tls_error)?;
        let leaf_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let leaf_signer = rustls::crypto::ring::sign::any_ecdsa_type(&leaf_der).map_err(tls_error)?;
        let cap = NonZeroUsize::new(LEAF_CACHE).unwrap_or(NonZeroUsize::MIN);
        Ok(Self {
            cert_pem,
            cert_der,
            cert_path,
            issuer,
            leaf_key,
            leaf_signer,
            cache: Mutex::new(lru::LruCache::new(cap)),
        })
    }

    /// The CA certificate in PEM (what sandboxes trust).
    #[must_use]
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Where the CA certificate is stored.
    #[must_use]
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// A certificate for `host` (normalised name), from the cache or freshly minted.
    ///
    /// # Errors
    /// When rcgen cannot build the certificate (an invalid name).
    pub fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>> {
        let now = Instant::now();
        {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((leaf, minted)) = cache.get(host)
                && now.duration_since(*minted) < LEAF_REFRESH
            {
                return Ok(Arc::clone(leaf));
            }
        }
        let leaf = Arc::new(self.mint(host)?);
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .put(host.to_owned(), (Arc::clone(&leaf), now));
        Ok(leaf)
    }

    fn mint(&self, host: &str) -> Result<CertifiedKey> {
        let mut params = CertificateParams::new(vec![host.to_owned()]).map_err(tls_error)?;
        let now = time::OffsetDateTime::now_utc();
        // An hour of slack for clocks that run behind.
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + LEAF_VALIDITY;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        params.subject_alt_names = vec![SanType::DnsName(host.try_into().map_err(tls_error)?)];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(tls_error)?;
        Ok(CertifiedKey::new(
            vec![cert.der().clone(), self.cert_der.clone()],
            Arc::clone(&self.leaf_signer),
        ))
    }
}

/// Generate a CA and write it: the key with mode 0600 from the first byte, the certificate world-readable.
/// Several processes starting at once on a fresh data directory agree on one CA: creation happens under an
/// exclusive lock on `ca.lock`, and whoever gets it second finds the CA made.
fn create(dir: &Path, cert_path: &Path, key_path: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let lock_path = dir.join("ca.lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| Error::io(format!("open {}", lock_path.display()), e))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::io(format!("lock {}", lock_path.display()), e.into()))?;
    if key_path.exists() {
        return Ok(());
    }
    let key = KeyPair::generate().map_err(tls_error)?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "agenthold egress CA");
    name.push(DnType::OrganizationName, "agenthold");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(CA_VALIDITY_DAYS);
    let cert = params.self_signed(&key).map_err(tls_error)?;
    let write = |path: &Path, bytes: &[u8], mode: u32| -> Result<()> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let _ = fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
        fs::rename(&tmp, path).map_err(|e| Error::io(format!("rename to {}", path.display()), e))
    };
    // The certificate first: a crash in between leaves no key, so the next start simply creates both.
    write(cert_path, cert.pem().as_bytes(), 0o644)?;
    write(key_path, key.serialize_pem().as_bytes(), 0o600)
}

/// Resolves the server certificate of an intercepted connection from its SNI.
#[derive(Debug)]
pub(crate) struct LeafResolver(pub(crate) Arc<CertificateAuthority>);

impl rustls::server::ResolvesServerCert for LeafResolver {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = agenthold_core::policy::normalize_name(hello.server_name()?).ok()?;
        match self.0.leaf(&name) {
            Ok(leaf) => Some(leaf),
            Err(e) => {
                tracing::warn!(host = %name, error = %e, "cannot mint a certificate");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: E14
    #[test]
    fn created_once_then_reused_with_a_private_key() {
        let dir = tempfile_dir();
        let ca = CertificateAuthority::load_or_create(&dir).unwrap();
        let key_mode = fs::metadata(dir.join("ca.key")).unwrap().permissions().mode() & 0o777;
        assert_eq!(key_mode, 0o600);
        let again = CertificateAuthority::load_or_create(&dir).unwrap();
        assert_eq!(ca.cert_pem(), again.cert_pem());
        fs::set_permissions(dir.join("ca.key"), fs::Permissions::from_mode(0o644)).unwrap();
        let err = CertificateAuthority::load_or_create(&dir)
            .unwrap_err()
            .to_string();
        assert!(err.contains("chmod 600"), "{err}");
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn leaves_are_cached_and_chain_to_the_ca() {
        use rustls::client::danger::ServerCertVerifier;
        let dir = tempfile_dir();
        let ca = CertificateAuthority::load_or_create(&dir).unwrap();
        let a = ca.leaf("api.example.test").unwrap();
        let b = ca.leaf("api.example.test").unwrap();
        assert!(Arc::ptr_eq(&a, &b), "second handshake must not mint again");
        assert_eq!(a.cert.len(), 2);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(a.cert[1].clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let name = rustls_pki_types::ServerName::try_from("api.example.test").unwrap();
        verifier
            .verify_server_cert(&a.cert[0], &[], &name, &[], rustls_pki_types::UnixTime::now())
            .unwrap();
        let other = rustls_pki_types::ServerName::try_from("other.example.test").unwrap();
        assert!(
            verifier
                .verify_server_cert(&a.cert[0], &[], &other, &[], rustls_pki_types::UnixTime::now())
                .is_err()
        );
        let _ = fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("agenthold-ca-{}", agenthold_core::AgentId::random()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}
