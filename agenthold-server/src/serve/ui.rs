//! The web UI (issue 12): the Vite + Svelte single-page app of `agenthold-server/ui`, built to `ui/dist` and
//! embedded in the binary. `/assets/*` are its content-hashed files (cached for a year); every other `GET` of a
//! path that is not the API's or a login flow's answers `index.html`, so the app's history routing works on
//! reload. A binary built without the UI (no Node at build time) answers a page saying how to build it.
//!
//! Every UI page carries a strict CSP: scripts and styles only from this origin, nothing inline (S6). The
//! terminal page alone (`/w/{ws}/agents/{agent}/terminal`) also allows `<style>` elements that carry a nonce
//! made for that one response: xterm.js injects style elements, and the page stamps them with the nonce it
//! finds in `<meta name="csp-nonce">`. A document's CSP is fixed when it loads, so the app reaches the
//! terminal by a full page load.
// enforces: S6

use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use rust_embed::RustEmbed;

use super::api::ApiError;

/// The built UI (`ui/dist`); empty when the UI was not built before the binary.
#[derive(RustEmbed)]
#[folder = "ui/dist"]
#[allow_missing = true]
struct Assets;

/// The CSP of every UI page.
pub(crate) const UI_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     font-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Paths that belong to the server, never to the app (each with everything under it): an unknown one is a
/// 404, not `index.html`.
const SERVER_PATHS: &[&str] = &[
    "/api",
    "/auth",
    "/hooks",
    "/login/local",
    "/healthz",
    "/readyz",
    "/metrics",
    "/assets",
];

/// `path` is `prefix` or a path below it.
fn is_under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || rest.starts_with('.'))
}

/// The answer for every request no route matched: a UI file, `index.html` for the app's own paths, or the
/// API's 404.
pub(crate) async fn fallback(method: Method, uri: Uri) -> Response {
    let path = uri.path();
    if method != Method::GET && method != Method::HEAD {
        return ApiError::not_found().into_response();
    }
    if let Some(file) = path
        .strip_prefix('/')
        .filter(|p| !p.is_empty() && *p != "index.html")
        .and_then(Assets::get)
    {
        return asset(path, &file);
    }
    if SERVER_PATHS.iter().any(|p| is_under(path, p)) {
        return ApiError::not_found().into_response();
    }
    page(is_terminal_page(path))
}

/// `/w/{ws}/agents/{agent}/terminal` (with or without a trailing slash).
fn is_terminal_page(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    matches!(parts.as_slice(), ["", "w", ws, "agents", agent, "terminal"] if !ws.is_empty() && !agent.is_empty())
}

/// A static file of the build. Hashed names under `assets/` never change content, so they may be cached.
fn asset(path: &str, file: &rust_embed::EmbeddedFile) -> Response {
    let mime = file.metadata.mimetype();
    let mut response = (StatusCode::OK, file.data.clone().into_owned()).into_response();
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(mime) {
        headers.insert(header::CONTENT_TYPE, v);
    }
    let cache = if path.starts_with("/assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(UI_CSP));
    response
}

/// `index.html` (or the not-built page) with the UI's CSP; on the terminal page, with a fresh style nonce.
fn page(terminal: bool) -> Response {
    let index = Assets::get("index.html");
    let html = match &index {
        Some(file) => String::from_utf8_lossy(&file.data).into_owned(),
        None => NOT_BUILT.to_owned(),
    };
    let (html, csp) = match terminal.then(nonce).flatten() {
        Some(nonce) => (
            html.replacen(
                "<head>",
                &format!("<head><meta name=\"csp-nonce\" content=\"{nonce}\">"),
                1,
            ),
            format!("{UI_CSP}; style-src-elem 'self' 'nonce-{nonce}'"),
        ),
        None => (html, UI_CSP.to_owned()),
    };
    let mut response = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response();
    if let Ok(v) = HeaderValue::from_str(&csp) {
        response.headers_mut().insert(header::CONTENT_SECURITY_POLICY, v);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// 128 random bits for one response's CSP nonce; `None` (the page then has no nonce, and the terminal's
/// styles are refused) only if the operating system has no randomness to give.
fn nonce() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(STANDARD_NO_PAD.encode(bytes))
}

/// What a binary built without the UI answers.
const NOT_BUILT: &str = concat!(
    "<!doctype html><html><head><meta charset=utf-8><title>agenthold</title></head><body>",
    "<h1>agenthold</h1><p>This server was built without its web UI. Build the UI and then the server ",
    "(<code>make ui</code>, then <code>cargo build -p agenthold-server</code>; the UI needs Node.js 20 and npm). ",
    "The API works without it: <code>/api/v1</code>, described at ",
    "<a href=\"/api/v1/openapi.json\">/api/v1/openapi.json</a>.</p></body></html>"
);

#[cfg(test)]
mod tests {
    use super::*;

    // covers: S6
    #[test]
    fn only_the_terminal_page_is_the_terminal_page() {
        assert!(is_terminal_page("/w/ws1/agents/a1/terminal"));
        assert!(is_terminal_page("/w/ws1/agents/a1/terminal/"));
        for path in [
            "/",
            "/w/ws1/agents/a1",
            "/w/ws1/agents/a1/terminal/x",
            "/w//agents/a1/terminal",
            "/x/w/ws1/agents/a1/terminal",
            "/w/ws1/agents//terminal",
        ] {
            assert!(!is_terminal_page(path), "{path}");
        }
    }

    // covers: S6
    #[tokio::test]
    async fn the_terminal_page_alone_gets_a_fresh_style_nonce() {
        let csp = |r: &Response| {
            r.headers()
                .get(header::CONTENT_SECURITY_POLICY)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let plain = fallback(Method::GET, Uri::from_static("/w/a/agents/b")).await;
        assert_eq!(csp(&plain), UI_CSP);
        assert!(!csp(&plain).contains("nonce"));
        let one = csp(&fallback(Method::GET, Uri::from_static("/w/a/agents/b/terminal")).await);
        let two = csp(&fallback(Method::GET, Uri::from_static("/w/a/agents/b/terminal")).await);
        assert!(one.contains("style-src-elem 'self' 'nonce-"), "{one}");
        assert_ne!(one, two, "a nonce is made per response");
        for csp in [&one, &two] {
            assert!(
                csp.contains("script-src 'self';") && !csp.contains("unsafe"),
                "{csp}"
            );
        }
    }

    #[tokio::test]
    async fn server_paths_and_other_methods_are_not_the_app() {
        for (method, path) in [
            (Method::GET, "/api/v1/nope"),
            (Method::GET, "/auth/nope"),
            (Method::GET, "/healthzz/x"),
            (Method::GET, "/assets/missing.js"),
            (Method::POST, "/w/a"),
        ] {
            let r = fallback(method.clone(), Uri::try_from(path).unwrap()).await;
            if path == "/healthzz/x" {
                assert_eq!(r.status(), StatusCode::OK, "{path} is an app path");
            } else {
                assert_eq!(r.status(), StatusCode::NOT_FOUND, "{method} {path}");
            }
        }
    }
}
