//! Replays the `dns_message` fuzz target's seeds and committed regression inputs through its check.

use std::path::Path;

use super::fuzz_check;

/// Run every file of `fuzz/<folder>/dns_message` through the check; the number of files.
fn replay(folder: &str) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(folder)
        .join("dns_message");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut count = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_file() {
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| fuzz_check::check(&data));
            assert!(outcome.is_ok(), "fuzz input {} fails the check", path.display());
            count += 1;
        }
    }
    count
}

#[test]
fn fuzz_seeds_pass_the_check() {
    assert!(replay("seeds") >= 5, "the dns_message seeds are missing");
}

#[test]
fn fuzz_regressions_pass_the_check() {
    replay("regressions");
}
