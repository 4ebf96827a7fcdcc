//! The sandbox environment contract (E14): the one list of variables every sandbox gets, what each holds,
//! and the sandbox's resolv.conf.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};

use crate::nft::Ports;

/// What a variable of a sandbox's environment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvValue {
    /// `http://<.2>:<explicit port>`: the explicit proxy.
    Proxy,
    /// [`NO_PROXY`]: what never goes through the proxy. The only kind a sandbox's own configuration may
    /// replace (it may know more local names).
    NoProxy,
    /// The bundle (the image's system roots plus the installation's CA), for variables that *replace* a
    /// client's trust store: pointing them at the CA alone would break every other host.
    CaBundle,
    /// The installation's CA alone, for variables that *add* to a client's own roots.
    CaCert,
}

/// Hosts that never go through the proxy (`NO_PROXY`, `no_proxy`): the sandbox's own loopback.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// The sandbox environment contract: every variable [`sandbox_env`] sets and what it holds. Both spellings
/// of the proxy variables, because clients disagree (curl reads `http_proxy` only in lower case, Go and
/// Python read both).
pub const SANDBOX_ENV: [(&str, EnvValue); 12] = [
    ("HTTPS_PROXY", EnvValue::Proxy),
    ("HTTP_PROXY", EnvValue::Proxy),
    ("https_proxy", EnvValue::Proxy),
    ("http_proxy", EnvValue::Proxy),
    ("NO_PROXY", EnvValue::NoProxy),
    ("no_proxy", EnvValue::NoProxy),
    // OpenSSL's default CA file: Python's ssl (and httpx, urllib), Ruby, Go's crypto/x509, rustls-native-certs.
    ("SSL_CERT_FILE", EnvValue::CaBundle),
    // Python requests (and pip) use it instead of certifi's bundle.
    ("REQUESTS_CA_BUNDLE", EnvValue::CaBundle),
    // curl's CA bundle; requests reads it too.
    ("CURL_CA_BUNDLE", EnvValue::CaBundle),
    // git's `http.sslCAInfo`.
    ("GIT_SSL_CAINFO", EnvValue::CaBundle),
    // The AWS CLI and SDKs.
    ("AWS_CA_BUNDLE", EnvValue::CaBundle),
    // Node adds these certificates to its bundled roots.
    ("NODE_EXTRA_CA_CERTS", EnvValue::CaCert),
];

const fn reserved_count() -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < SANDBOX_ENV.len() {
        if !matches!(SANDBOX_ENV[i].1, EnvValue::NoProxy) {
            n += 1;
        }
        i += 1;
    }
    n
}

const fn reserved() -> [&'static str; reserved_count()] {
    let mut out = [""; reserved_count()];
    let (mut i, mut n) = (0, 0);
    while i < SANDBOX_ENV.len() {
        if !matches!(SANDBOX_ENV[i].1, EnvValue::NoProxy) {
            out[n] = SANDBOX_ENV[i].0;
            n += 1;
        }
        i += 1;
    }
    out
}

/// The variables of [`SANDBOX_ENV`] a sandbox's own configuration may not set (all but `NO_PROXY`).
pub const RESERVED_ENV: [&str; reserved_count()] = reserved();

/// The sandbox's `/etc/resolv.conf`: its only resolver is the gateway's `.2` (DNS to any address is
/// redirected there anyway; naming it keeps glibc from trying anything else). No search domains, so
/// `ndots:0`; short timeouts, because an answer that does not come at once will not come later.
#[must_use]
pub fn resolv_conf(gateway: Ipv4Addr) -> String {
    format!("nameserver {gateway}\noptions ndots:0 timeout:2 attempts:2\n")
}

/// Where a sandbox finds the installation's CA, as paths the sandbox sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaPaths {
    /// The CA certificate alone (PEM).
    pub cert: String,
    /// The image's system roots followed by the CA (PEM).
    pub bundle: String,
}

impl CaPaths {
    /// The CA at `cert`, the bundle at `bundle`.
    #[must_use]
    pub fn new(cert: impl Into<String>, bundle: impl Into<String>) -> Self {
        Self {
            cert: cert.into(),
            bundle: bundle.into(),
        }
    }
}

/// The environment of a sandbox served at `gateway` (its `.2`) on `ports`, with the CA files at `ca`: every
/// variable of [`SANDBOX_ENV`], each holding what its [`EnvValue`] says.
#[must_use]
pub fn sandbox_env(gateway: Ipv4Addr, ports: Ports, ca: &CaPaths) -> BTreeMap<String, String> {
    sandbox_env_via(SocketAddr::from((gateway, ports.explicit)), ca)
}

/// The same environment for a sandbox that reaches the gateway's explicit proxy at `explicit_proxy`
/// rather than at its `.2` (a custom runtime that serves an agent on a listener of its own, such as
/// `examples/src/bin/custom_runtime.rs`).
#[must_use]
pub fn sandbox_env_via(explicit_proxy: SocketAddr, ca: &CaPaths) -> BTreeMap<String, String> {
    let proxy = format!("http://{explicit_proxy}");
    SANDBOX_ENV
        .iter()
        .map(|&(name, value)| {
            let value = match value {
                EnvValue::Proxy => proxy.clone(),
                EnvValue::NoProxy => NO_PROXY.to_owned(),
                EnvValue::CaBundle => ca.bundle.clone(),
                EnvValue::CaCert => ca.cert.clone(),
            };
            (name.to_owned(), value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> CaPaths {
        CaPaths::new("/x/ca.crt", "/x/bundle.pem")
    }

    // covers: E14
    #[test]
    fn every_variable_is_set_and_points_where_it_should() {
        let env = sandbox_env(Ipv4Addr::new(10, 213, 7, 2), Ports::default(), &ca());
        assert_eq!(env.len(), SANDBOX_ENV.len());
        for key in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            assert_eq!(env[key], "http://10.213.7.2:15002", "{key}");
        }
        for key in ["NO_PROXY", "no_proxy"] {
            assert_eq!(env[key], "localhost,127.0.0.1,::1", "{key}");
        }
        // These replace the client's trust store: the bundle, or every other host would fail.
        for key in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            "AWS_CA_BUNDLE",
        ] {
            assert_eq!(env[key], "/x/bundle.pem", "{key}");
        }
        // Node adds these to its own roots: the CA alone.
        assert_eq!(env["NODE_EXTRA_CA_CERTS"], "/x/ca.crt");
    }

    #[test]
    fn the_resolver_is_the_gateway() {
        let text = resolv_conf(Ipv4Addr::new(10, 213, 7, 2));
        let nameservers: Vec<&str> = text.lines().filter(|l| l.starts_with("nameserver")).collect();
        assert_eq!(nameservers, ["nameserver 10.213.7.2"]);
        assert!(!text.contains("search"), "{text}");
    }

    #[test]
    fn only_no_proxy_may_be_set_by_a_sandbox() {
        assert_eq!(RESERVED_ENV.len(), SANDBOX_ENV.len() - 2);
        for (name, value) in SANDBOX_ENV {
            assert_eq!(RESERVED_ENV.contains(&name), value != EnvValue::NoProxy, "{name}");
        }
    }

    #[test]
    fn the_explicit_port_is_the_configured_one() {
        let ports = Ports {
            explicit: 3128,
            ..Ports::default()
        };
        let env = sandbox_env(Ipv4Addr::new(192, 168, 9, 2), ports, &ca());
        assert_eq!(env["HTTPS_PROXY"], "http://192.168.9.2:3128");
    }
}
