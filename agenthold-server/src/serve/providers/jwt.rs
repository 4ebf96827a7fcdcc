//! Compact JWS (ID tokens): split, decode, and verify the signature with `ring` from the JWK's components
//! (no RSA private-key code is linked, so RUSTSEC-2023-0071 does not apply). Accepted algorithms: RS256,
//! RS384, RS512, PS256, PS384, PS512, ES256, ES384 and EdDSA (Ed25519); `none` and the HMAC ones never.
// enforces: S6

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::Value;

/// The algorithms an ID token may be signed with.
pub(crate) const ALGORITHMS: [&str; 9] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

/// One key of a JWK set (the public members this verifier reads).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Jwk {
    /// Key id.
    pub(crate) kid: Option<String>,
    /// `RSA`, `EC` or `OKP`.
    pub(crate) kty: String,
    /// The algorithm the key is for, when stated.
    pub(crate) alg: Option<String>,
    /// `sig` or `enc`, when stated.
    #[serde(rename = "use")]
    pub(crate) use_: Option<String>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

/// A JWK set.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct JwkSet {
    /// Its keys.
    pub(crate) keys: Vec<Jwk>,
}

/// The parts of a compact JWS.
#[derive(Debug)]
pub(crate) struct Jws {
    /// The header's `alg`.
    pub(crate) alg: String,
    /// The header's `kid`, if any.
    pub(crate) kid: Option<String>,
    /// The payload, parsed.
    pub(crate) claims: Value,
    signing_input: Vec<u8>,
    signature: Vec<u8>,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    crit: Option<Value>,
}

/// Split and decode a compact JWS; nothing is verified yet.
pub(crate) fn parse(token: &str) -> Result<Jws, String> {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err("the ID token is not a compact JWS (three parts)".into());
    };
    let decode = |part: &str, what: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| format!("the ID token's {what} is not base64url"))
    };
    let header: Header = serde_json::from_slice(&decode(h, "header")?)
        .map_err(|_| "the ID token's header is not JSON with an alg".to_owned())?;
    if header.crit.is_some() {
        return Err("the ID token's header has crit extensions, which are not supported".into());
    }
    let claims: Value = serde_json::from_slice(&decode(p, "payload")?)
        .map_err(|_| "the ID token's payload is not JSON".to_owned())?;
    if !claims.is_object() {
        return Err("the ID token's payload is not a JSON object".into());
    }
    Ok(Jws {
        alg: header.alg,
        kid: header.kid,
        claims,
        signing_input: format!("{h}.{p}").into_bytes(),
        signature: decode(s, "signature")?,
    })
}

impl Jwk {
    /// Whether this key can verify `alg` (by key type, curve and a stated `alg`/`use`).
    pub(crate) fn fits(&self, alg: &str) -> bool {
        if self.use_.as_deref().is_some_and(|u| u != "sig") || self.alg.as_deref().is_some_and(|a| a != alg) {
            return false;
        }
        match (self.kty.as_str(), alg) {
            ("RSA", a) => a.starts_with("RS") || a.starts_with("PS"),
            ("EC", "ES256") => self.crv.as_deref() == Some("P-256"),
            ("EC", "ES384") => self.crv.as_deref() == Some("P-384"),
            ("OKP", "EdDSA") => self.crv.as_deref() == Some("Ed25519"),
            _ => false,
        }
    }

    /// Whether `jws`'s signature verifies with this key.
    pub(crate) fn verifies(&self, jws: &Jws) -> bool {
        if !ALGORITHMS.contains(&jws.alg.as_str()) || !self.fits(&jws.alg) {
            return false;
        }
        let b64 = |v: &Option<String>| v.as_deref().and_then(|s| URL_SAFE_NO_PAD.decode(s).ok());
        let (msg, sig) = (jws.signing_input.as_slice(), jws.signature.as_slice());
        let rsa = |params: &'static signature::RsaParameters| match (b64(&self.n), b64(&self.e)) {
            (Some(n), Some(e)) => RsaPublicKeyComponents { n: &n, e: &e }
                .verify(params, msg, sig)
                .is_ok(),
            _ => false,
        };
        let ec = |alg: &'static signature::EcdsaVerificationAlgorithm, len: usize| match (
            b64(&self.x),
            b64(&self.y),
        ) {
            (Some(x), Some(y)) if x.len() == len && y.len() == len => {
                let mut point = Vec::with_capacity(1 + 2 * len);
                point.push(4);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                UnparsedPublicKey::new(alg, point).verify(msg, sig).is_ok()
            }
            _ => false,
        };
        match jws.alg.as_str() {
            "RS256" => rsa(&signature::RSA_PKCS1_2048_8192_SHA256),
            "RS384" => rsa(&signature::RSA_PKCS1_2048_8192_SHA384),
            "RS512" => rsa(&signature::RSA_PKCS1_2048_8192_SHA512),
            "PS256" => rsa(&signature::RSA_PSS_2048_8192_SHA256),
            "PS384" => rsa(&signature::RSA_PSS_2048_8192_SHA384),
            "PS512" => rsa(&signature::RSA_PSS_2048_8192_SHA512),
            "ES256" => ec(&signature::ECDSA_P256_SHA256_FIXED, 32),
            "ES384" => ec(&signature::ECDSA_P384_SHA384_FIXED, 48),
            "EdDSA" => b64(&self.x).is_some_and(|x| {
                UnparsedPublicKey::new(&signature::ED25519, x)
                    .verify(msg, sig)
                    .is_ok()
            }),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use ring::rand::SystemRandom;
    use ring::signature::{
        ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, RSA_PKCS1_SHA256,
        RSA_PSS_SHA256, RsaKeyPair, RsaPublicKeyComponents,
    };

    use super::*;

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn jwk(json: Value) -> Jwk {
        serde_json::from_value(json).unwrap()
    }

    // covers: S6
    #[test]
    fn es256_and_eddsa_verify_and_tampering_fails() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let point = pair.public_key().as_ref();
        let key = jwk(serde_json::json!({"kty": "EC", "crv": "P-256", "kid": "k1",
            "x": b64(&point[1..33]), "y": b64(&point[33..])}));
        let input = format!(
            "{}.{}",
            b64(br#"{"alg":"ES256","kid":"k1"}"#),
            b64(br#"{"sub":"a"}"#)
        );
        let sig = pair.sign(&rng, input.as_bytes()).unwrap();
        let token = format!("{input}.{}", b64(sig.as_ref()));
        let jws = parse(&token).unwrap();
        assert_eq!((jws.alg.as_str(), jws.kid.as_deref()), ("ES256", Some("k1")));
        assert!(key.verifies(&jws));
        let forged = format!(
            "{}.{}.{}",
            b64(br#"{"alg":"ES256","kid":"k1"}"#),
            b64(br#"{"sub":"b"}"#),
            b64(sig.as_ref())
        );
        assert!(!key.verifies(&parse(&forged).unwrap()));
        // alg none, HMAC, or a key of another type never verify.
        let none = format!("{}.{}.", b64(br#"{"alg":"none"}"#), b64(br#"{"sub":"a"}"#));
        assert!(!key.verifies(&parse(&none).unwrap()));
        let rsa = jwk(serde_json::json!({"kty": "RSA", "n": "AQAB", "e": "AQAB"}));
        assert!(!rsa.verifies(&jws));

        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let key =
            jwk(serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": b64(pair.public_key().as_ref())}));
        let input = format!("{}.{}", b64(br#"{"alg":"EdDSA"}"#), b64(br#"{"sub":"a"}"#));
        let token = format!("{input}.{}", b64(pair.sign(input.as_bytes()).as_ref()));
        assert!(key.verifies(&parse(&token).unwrap()));
        for bad in ["", "a.b", "a.b.c.d", "!!.e30.e30"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    /// A 2048-bit RSA test key (PKCS#1 RSAPrivateKey DER, base64), made with `openssl genpkey` for this test only.
    const RSA_TEST_KEY: &str = include_str!("testdata/rsa-2048.der.b64");

    // covers: S6
    #[test]
    fn rs256_and_ps256_verify_from_the_jwk_components() {
        let der = base64::engine::general_purpose::STANDARD
            .decode(RSA_TEST_KEY.trim())
            .unwrap();
        let pair = RsaKeyPair::from_der(&der).unwrap();
        let public: RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
        let key =
            jwk(serde_json::json!({"kty": "RSA", "kid": "r1", "n": b64(&public.n), "e": b64(&public.e)}));
        let rng = SystemRandom::new();
        for (alg, padding) in [
            ("RS256", &RSA_PKCS1_SHA256 as &dyn ring::signature::RsaEncoding),
            ("PS256", &RSA_PSS_SHA256),
        ] {
            let input = format!(
                "{}.{}",
                b64(format!(r#"{{"alg":"{alg}"}}"#).as_bytes()),
                b64(br#"{"sub":"a"}"#)
            );
            let mut sig = vec![0; pair.public().modulus_len()];
            pair.sign(padding, &rng, input.as_bytes(), &mut sig).unwrap();
            let token = format!("{input}.{}", b64(&sig));
            assert!(key.verifies(&parse(&token).unwrap()), "{alg}");
            sig[0] ^= 1;
            let bad = format!("{input}.{}", b64(&sig));
            assert!(!key.verifies(&parse(&bad).unwrap()), "{alg}");
        }
        // A key stated for another algorithm is not used.
        let rs384_only =
            jwk(serde_json::json!({"kty": "RSA", "alg": "RS384", "n": b64(&public.n), "e": b64(&public.e)}));
        assert!(!rs384_only.fits("RS256"));
    }
}
