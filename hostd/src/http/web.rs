//! The web page at `/`: one HTML file compiled into the binary (`web/index.html`: a chat over
//! `/v1/chat/completions` and the live panel over `/v1/live`), nothing fetched from elsewhere.
//! The page itself is public, like `/health`; everything it shows comes through `/v1/`, which
//! asks for the API key when the server has one (the page then asks the user for it).
//!
//! Its content security policy allows exactly the page's own inline script and stylesheet (by
//! their SHA-256, computed once from the compiled-in file), connections to this origin only,
//! and nothing else: no other script, style, frame, form target or image but `data:`.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// The page.
const PAGE: &str = include_str!("web/index.html");

/// The page's `Content-Security-Policy`.
static POLICY: LazyLock<String> = LazyLock::new(|| policy(PAGE));

/// `'sha256-…'` of the text between `open` and `close` (the first such element).
fn inline_hash(page: &str, open: &str, close: &str) -> String {
    let body = page
        .split_once(open)
        .and_then(|(_, rest)| rest.split_once(close))
        .map_or("", |(body, _)| body);
    let digest = Sha256::digest(body.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The policy for `page`: its inline `<script>` and `<style>` by hash, this origin only.
fn policy(page: &str) -> String {
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        inline_hash(page, "<script>", "</script>"),
        inline_hash(page, "<style>", "</style>"),
    )
}

/// `GET /`.
pub(super) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, POLICY.as_str()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        PAGE,
    )
        .into_response()
}

/// `GET /favicon.ico`: none (a browser asks for it; a 204 keeps its console clean).
pub(super) async fn favicon() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_exactly_the_pages_one_script_and_one_style() {
        assert_eq!(
            PAGE.matches("<script").count(),
            1,
            "one inline script, no src"
        );
        assert_eq!(PAGE.matches("<style").count(), 1);
        assert!(
            !PAGE.contains(" style=\""),
            "inline style attributes need 'unsafe-inline'"
        );
        for handler in [
            " onclick=",
            " onload=",
            " oninput=",
            " onchange=",
            " onsubmit=",
        ] {
            assert!(
                !PAGE.contains(handler),
                "inline handlers need 'unsafe-inline': {handler}"
            );
        }
        let p = policy(PAGE);
        assert!(!p.contains("unsafe"), "{p}");
        // A different script gets a different hash: the policy would refuse an injected one.
        let other = PAGE.replacen("<script>", "<script>alert(1);", 1);
        assert_ne!(policy(&other), p);
        // SHA-256 of "" is the well-known 47DEQpj8… value: the hash is of the element's text.
        assert!(
            policy("<script></script><style></style>")
                .contains("'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='")
        );
    }
}
