//! The committed OpenAPI document of the web UI (`agenthold-server/ui/openapi.json`) is the server's own:
//! the UI's typed client (`ui/src/lib/api/schema.d.ts`, `npm run gen`) is generated from it, so an API change
//! that is not carried over to the UI fails here instead of in a browser.
//!
//! `AGENTHOLD_UPDATE_OPENAPI=1 cargo test -p agenthold-server --test integration openapi_snapshot` rewrites
//! the file; then run `npm run gen` in `agenthold-server/ui` and commit both.

use std::path::PathBuf;

/// Where the UI keeps its copy of the document.
fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ui/openapi.json")
}

/// The document as the file holds it: pretty JSON with a final newline.
fn rendered() -> String {
    let doc = serde_json::to_value(agenthold_server::Server::openapi()).expect("the document serialises");
    let mut text = serde_json::to_string_pretty(&doc).expect("JSON renders");
    text.push('\n');
    text
}

#[test]
fn ui_openapi_document_matches_the_server() {
    let path = committed_path();
    let now = rendered();
    if std::env::var_os("AGENTHOLD_UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::write(&path, &now).expect("write ui/openapi.json");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == now,
        "{} is not the server's OpenAPI document. Update it with\n  \
         AGENTHOLD_UPDATE_OPENAPI=1 cargo test -p agenthold-server --test integration openapi_snapshot\n\
         then regenerate the UI's types with `npm run gen` in agenthold-server/ui and commit both files.",
        path.display()
    );
}
