//! Opaque credential values (tokens, session cookies, login links): 256 bits from the operating system's
//! generator, base64url without padding; only their SHA-256 is ever stored.

use agenthold_core::ErrorKind;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};

/// Length of a 256-bit value in base64url without padding.
pub(crate) const ENCODED_LEN: usize = 43;

/// `len` random bytes from the operating system's generator.
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::backend(ErrorKind::Internal, "operating system random number generator", e))?;
    Ok(bytes)
}

/// A fresh 256-bit value, base64url without padding (43 characters).
pub(crate) fn new_value() -> Result<String> {
    Ok(URL_SAFE_NO_PAD.encode(random_bytes::<32>()?))
}

/// A fresh identifier that is not secret (token ids): 80 bits, 20 hex digits.
pub(crate) fn new_id() -> Result<String> {
    Ok(hex::encode(random_bytes::<10>()?))
}

/// Whether `value` is a well-formed 256-bit value as [`new_value`] makes them: exactly 43 characters of the
/// base64url alphabet that decode canonically to 32 bytes. Checked before any store lookup.
pub(crate) fn is_well_formed(value: &str) -> bool {
    value.len() == ENCODED_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && URL_SAFE_NO_PAD.decode(value).is_ok_and(|bytes| bytes.len() == 32)
}

/// The store key of a presented value: lower-case hex of its SHA-256.
pub(crate) fn hash_hex(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_values_are_well_formed_and_distinct() -> Result<()> {
        let a = new_value()?;
        let b = new_value()?;
        assert_eq!(a.len(), ENCODED_LEN);
        assert!(is_well_formed(&a), "{a}");
        assert_ne!(a, b);
        assert_eq!(new_id()?.len(), 20);
        Ok(())
    }

    #[test]
    fn malformed_values_are_refused() -> Result<()> {
        let good = new_value()?;
        let long = format!("{good}A");
        let short = &good[..42];
        let padded = format!("{short}=");
        let plus = format!("+{}", &good[1..]);
        let space = format!(" {}", &good[1..]);
        // The last character of 43 carries 2 spare bits; a non-zero spare bit is not canonical.
        let noncanonical = format!("{}B", &good[..42]);
        let multibyte = format!("é{}", &good[2..]);
        for bad in [
            "",
            short,
            &long,
            &padded,
            &plus,
            &space,
            &noncanonical,
            &multibyte,
        ] {
            assert!(!is_well_formed(bad), "{bad:?}");
        }
        Ok(())
    }

    #[test]
    fn the_hash_is_sha256_hex() {
        assert_eq!(
            hash_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
