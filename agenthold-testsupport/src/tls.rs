//! A throwaway certificate authority for upstream servers in tests.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate authority generated in memory (ECDSA P-256), trusted by nothing but the test that made
/// it: hand [`TestCa::pem`] or [`TestCa::root_store`] to the client (or to the gateway as an extra trust
/// anchor), and [`TestCa::issue`] leaf certificates to upstream servers.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    /// Generates a new CA ("agenthold test CA").
    pub fn new() -> Self {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "agenthold test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("generate the test CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-sign the test CA");
        Self { issuer }
    }

    /// The CA certificate, PEM (for `curl --cacert`, `SSL_CERT_FILE`, …).
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate, DER.
    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A root store that trusts only this CA.
    pub fn root_store(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.der())
            .expect("the test CA is a valid trust anchor");
        roots
    }

    /// A rustls client configuration that trusts only this CA, offering `alpn` (e.g. `[b"h2"]`).
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(self.root_store())
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// Issues a server certificate for `names` (DNS names or IP addresses, the first one also the common
    /// name): the chain (leaf only) and its private key.
    pub fn issue(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let sans: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(sans).expect("valid subject alternative names");
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, *first);
        }
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("generate a leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign the leaf certificate");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![cert.der().clone()], key)
    }

    /// A rustls server configuration presenting a certificate for `names`, speaking h2 and HTTP/1.1
    /// (preferred in that order through ALPN).
    pub fn server_config(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let (chain, key) = self.issue(names);
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the issued certificate matches its key");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// The crypto provider, named explicitly: tests must not depend on which provider some other crate in
/// the process installed as the default.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[cfg(test)]
mod tests {
    use rustls::client::danger::ServerCertVerifier;

    use super::*;

    #[test]
    fn issued_certificates_verify_against_the_ca() {
        let ca = TestCa::new();
        assert!(ca.pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let (chain, _key) = ca.issue(&["upstream.test", "127.0.0.1"]);
        let roots = Arc::new(ca.root_store());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .unwrap();
        let now = rustls_pki_types::UnixTime::now();
        for name in ["upstream.test", "127.0.0.1"] {
            let name = rustls_pki_types::ServerName::try_from(name).unwrap();
            verifier
                .verify_server_cert(&chain[0], &[], &name, &[], now)
                .unwrap();
        }
        let other = rustls_pki_types::ServerName::try_from("other.test").unwrap();
        assert!(
            verifier
                .verify_server_cert(&chain[0], &[], &other, &[], now)
                .is_err()
        );
    }
}
