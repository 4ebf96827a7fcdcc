//! Rebuild the server when the web UI's build output changes: the UI is embedded from `ui/dist`
//! (`src/serve/ui.rs`), and a new build writes files with new content-hashed names, which the embedding
//! alone would not notice.

fn main() {
    // A directory is watched with everything inside it. Before the UI is built, watch its parent, whose
    // entries change when `dist` appears.
    // (A path that does not exist would rebuild every time: with no `ui` at all, watch only this file.)
    for watched in ["ui/dist", "ui"] {
        if std::path::Path::new(watched).is_dir() {
            println!("cargo:rerun-if-changed={watched}");
            break;
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
