//! TLS configurations of the gateway: the client side that talks to upstreams (always verified: webpki
//! roots plus the system store, plus test-only extra anchors) and the server side that terminates
//! intercepted connections with leaves minted by the installation's CA.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::ca::{CertificateAuthority, LeafResolver};
use crate::error::{Error, Result};

/// ALPN protocols offered on both sides of an intercepted connection, preferred first.
pub(crate) const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The client configuration for upstream TLS. Upstream certificates are always verified; `extra_pem`
/// (the `dangerous` test anchor) adds trust, it never removes verification.
pub(crate) fn client_config(extra_pem: Option<&[u8]>) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    // The system store holds what an operator added (a corporate root); unreadable entries are skipped.
    let native = rustls_native_certs::load_native_certs();
    let _ = roots.add_parsable_certificates(native.certs);
    if let Some(pem) = extra_pem {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| Error::Tls {
                problem: format!("extra upstream CA: {e}"),
            })?;
            roots.add(cert).map_err(|e| Error::Tls {
                problem: format!("extra upstream CA: {e}"),
            })?;
            added += 1;
        }
        if added == 0 {
            return Err(Error::Tls {
                problem: "extra upstream CA: no certificate in the PEM".into(),
            });
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls {
            problem: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// `config` offering only `http/1.1` by ALPN.
pub(crate) fn http1_only(config: &Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    let mut config = rustls::ClientConfig::clone(config);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// The server configuration for intercepted connections: leaves per SNI from `ca`, ALPN h2 and http/1.1.
pub(crate) fn server_config(ca: Arc<CertificateAuthority>) -> Result<Arc<rustls::ServerConfig>> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls {
            problem: e.to_string(),
        })?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(LeafResolver(ca)));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
