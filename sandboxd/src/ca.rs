//! The installation's CA inside the sandbox (E14): `/.agenthold/ca-bundle.pem` (system roots + CA) for the
//! `SSL_CERT_FILE` family of variables, and the CA in the image's own trust store where the image has one.
//! Idempotent across restarts: the CA goes into the system bundle inside a marker block that is replaced, never
//! appended twice. Nothing here stops the boot; problems are returned as messages for the log.
// enforces: E14

use std::path::{Path, PathBuf};

use crate::layout::{CA_BUNDLE, CA_FILE, LOCAL_CA_DIR, Layout, SYSTEM_BUNDLES, write_atomic};

/// First line of the block sandboxd adds to a system bundle.
const BLOCK_BEGIN: &str = "# agenthold CA (added by sandboxd at boot; replaced on every boot)";
/// Last line of that block.
const BLOCK_END: &str = "# end agenthold CA";
/// PEM armour of a certificate.
const PEM_BEGIN: &str = "-----BEGIN CERTIFICATE-----";
/// PEM armour of a certificate.
const PEM_END: &str = "-----END CERTIFICATE-----";

/// What [`install`] did, for the log and for tests.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// The system bundle found, if any.
    pub(crate) system_bundle: Option<PathBuf>,
    /// Problems met on the way (each already says which file).
    pub(crate) problems: Vec<String>,
}

/// The base64 bodies (whitespace removed) of every certificate in a PEM text, in order.
fn cert_bodies(pem: &str) -> Vec<String> {
    let mut bodies = Vec::new();
    let mut current: Option<String> = None;
    for line in pem.lines() {
        let line = line.trim();
        if line == PEM_BEGIN {
            current = Some(String::new());
        } else if line == PEM_END {
            if let Some(body) = current.take().filter(|b| !b.is_empty()) {
                bodies.push(body);
            }
        } else if let Some(body) = current.as_mut() {
            body.extend(line.chars().filter(|c| !c.is_whitespace()));
        }
    }
    bodies
}

/// Whether every certificate of `ca` already appears in `bundle` (compared by content, not by formatting).
fn contains_all(bundle: &str, ca: &str) -> bool {
    let present = cert_bodies(bundle);
    cert_bodies(ca).iter().all(|body| present.contains(body))
}

/// `bundle` without sandboxd's marker block (an unterminated block runs to the end of the text).
fn strip_block(bundle: &str) -> String {
    let mut out = String::with_capacity(bundle.len());
    let mut inside = false;
    for line in bundle.split_inclusive('\n') {
        let bare = line.trim_end();
        if !inside && bare == BLOCK_BEGIN {
            inside = true;
        } else if inside && bare == BLOCK_END {
            inside = false;
        } else if !inside {
            out.push_str(line);
        }
    }
    out
}

/// `text` followed by a newline if it does not end with one (and is not empty).
fn with_newline(mut text: String) -> String {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// The marker block holding `ca`.
fn block(ca: &str) -> String {
    format!(
        "{BLOCK_BEGIN}\n{}{BLOCK_END}\n",
        with_newline(ca.trim().to_owned())
    )
}

/// Reads the CA, builds the bundle and updates the image's trust store. Never fails; see [`Report`].
pub(crate) fn install(layout: &Layout) -> Report {
    let mut report = Report::default();
    let ca_path = layout.path(CA_FILE);
    let ca = match std::fs::read_to_string(&ca_path) {
        Ok(ca) if !cert_bodies(&ca).is_empty() => ca,
        Ok(_) => {
            report
                .problems
                .push(format!("{}: no PEM certificate in it", ca_path.display()));
            return report;
        }
        Err(err) => {
            report.problems.push(format!("{}: {err}", ca_path.display()));
            return report;
        }
    };
    let ca_pem = with_newline(ca.trim().to_owned());

    let system = SYSTEM_BUNDLES
        .iter()
        .map(|p| layout.path(p))
        .find(|p| p.is_file());
    let original = match system.as_deref().map(std::fs::read_to_string) {
        Some(Ok(text)) => text,
        Some(Err(err)) => {
            report.problems.push(format!(
                "{}: {err}",
                system.as_deref().unwrap_or(Path::new("")).display()
            ));
            String::new()
        }
        None => String::new(),
    };
    report.system_bundle.clone_from(&system);

    // The sandbox's own bundle: the system roots as shipped (without an older agenthold block) + the CA.
    let mut bundle = with_newline(strip_block(&original));
    if !contains_all(&bundle, &ca_pem) {
        bundle.push_str(&ca_pem);
    }
    let bundle_path = layout.path(CA_BUNDLE);
    if let Err(err) = write_atomic(&bundle_path, bundle.as_bytes(), 0o644) {
        report.problems.push(format!("{}: {err}", bundle_path.display()));
    }

    if let Some(path) = &system
        && !contains_all(&original, &ca_pem)
        && let Err(err) = update_system_bundle(path, &original, &ca_pem)
    {
        report.problems.push(format!(
            "{} (CA not added to the image's trust store): {err}",
            path.display()
        ));
    }

    let local_dir = layout.path(LOCAL_CA_DIR);
    if local_dir.is_dir() {
        let local = local_dir.join("agenthold.crt");
        if std::fs::read_to_string(&local).ok().as_deref() != Some(ca_pem.as_str())
            && let Err(err) = write_atomic(&local, ca_pem.as_bytes(), 0o644)
        {
            report.problems.push(format!("{}: {err}", local.display()));
        }
    }
    report
}

/// Puts `ca` into the system bundle at `path` (which does not contain it yet): appended in a marker block, or
/// the existing block (an older CA) replaced. Writes in place, so a symlinked bundle keeps its target.
fn update_system_bundle(path: &Path, original: &str, ca: &str) -> std::io::Result<()> {
    use std::io::Write as _;

    let stripped = strip_block(original);
    if stripped.len() == original.len() {
        let mut file = std::fs::OpenOptions::new().append(true).open(path)?;
        let sep = if original.is_empty() || original.ends_with('\n') {
            ""
        } else {
            "\n"
        };
        file.write_all(format!("{sep}{}", block(ca)).as_bytes())?;
        file.sync_all()
    } else {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)?;
        file.write_all(format!("{}{}", with_newline(stripped), block(ca)).as_bytes())?;
        file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA1: &str = "-----BEGIN CERTIFICATE-----\nQUFBQQ==\nQkJC\n-----END CERTIFICATE-----\n";
    const CA2: &str = "-----BEGIN CERTIFICATE-----\nQ0NDQw==\n-----END CERTIFICATE-----\n";
    const ROOT: &str = "-----BEGIN CERTIFICATE-----\nUk9PVA==\n-----END CERTIFICATE-----\n";

    #[test]
    fn compares_by_content() {
        let reflowed =
            "junk\n-----BEGIN CERTIFICATE-----\r\nQUFB\r\nQQ==QkJC\r\n-----END CERTIFICATE-----\r\n";
        assert!(contains_all(reflowed, CA1));
        assert!(!contains_all(ROOT, CA1));
        assert_eq!(
            cert_bodies(&format!("{ROOT}{CA1}")),
            vec!["Uk9PVA==".to_owned(), "QUFBQQ==QkJC".to_owned()]
        );
    }

    #[test]
    fn block_is_stripped_exactly() {
        let with = format!("{ROOT}{}", block(CA1));
        assert_eq!(strip_block(&with), ROOT);
        assert_eq!(strip_block(ROOT), ROOT);
        assert_eq!(strip_block(&format!("{ROOT}{BLOCK_BEGIN}\n{CA1}")), ROOT);
    }

    fn sandbox_root(system: Option<&str>) -> (tempfile::TempDir, Layout) {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(dir.path().to_owned());
        std::fs::create_dir_all(layout.path(sandboxd::contract::DIR)).expect("mkdir");
        if let Some(system) = system {
            std::fs::create_dir_all(layout.path("/etc/ssl/certs")).expect("mkdir");
            std::fs::write(layout.path(SYSTEM_BUNDLES[0]), system).expect("write");
        }
        (dir, layout)
    }

    #[test]
    fn install_is_idempotent_and_replaces_an_old_ca() {
        let (_dir, layout) = sandbox_root(Some(ROOT));
        std::fs::write(layout.path(CA_FILE), CA1).expect("write");
        for _ in 0..2 {
            let report = install(&layout);
            assert!(report.problems.is_empty(), "{:?}", report.problems);
        }
        let system = std::fs::read_to_string(layout.path(SYSTEM_BUNDLES[0])).expect("read");
        assert_eq!(system, format!("{ROOT}{}", block(CA1)));
        assert_eq!(
            std::fs::read_to_string(layout.path(CA_BUNDLE)).expect("read"),
            format!("{ROOT}{CA1}")
        );

        std::fs::write(layout.path(CA_FILE), CA2).expect("write");
        assert!(install(&layout).problems.is_empty());
        let system = std::fs::read_to_string(layout.path(SYSTEM_BUNDLES[0])).expect("read");
        assert_eq!(system, format!("{ROOT}{}", block(CA2)));
        assert_eq!(
            std::fs::read_to_string(layout.path(CA_BUNDLE)).expect("read"),
            format!("{ROOT}{CA2}")
        );
    }

    #[test]
    fn no_system_bundle_is_fine() {
        let (_dir, layout) = sandbox_root(None);
        std::fs::write(layout.path(CA_FILE), CA1).expect("write");
        let report = install(&layout);
        assert!(
            report.problems.is_empty() && report.system_bundle.is_none(),
            "{report:?}"
        );
        assert_eq!(
            std::fs::read_to_string(layout.path(CA_BUNDLE)).expect("read"),
            CA1
        );
    }

    #[test]
    fn missing_or_bad_ca_is_reported() {
        let (_dir, layout) = sandbox_root(Some(ROOT));
        assert_eq!(install(&layout).problems.len(), 1);
        std::fs::write(layout.path(CA_FILE), "garbage").expect("write");
        assert_eq!(install(&layout).problems.len(), 1);
        assert_eq!(
            std::fs::read_to_string(layout.path(SYSTEM_BUNDLES[0])).expect("read"),
            ROOT
        );
    }
}
