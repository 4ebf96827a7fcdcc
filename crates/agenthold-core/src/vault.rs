//! Encryption of secret values at rest (E10).
// Implementation pending (issue 2, item 7).
