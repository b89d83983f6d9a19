//! The web page at `/`: one HTML file compiled into the binary (`web/index.html`: a chat over
//! `/v1/chat/completions` and the live panel over `/v1/live`), nothing fetched from elsewhere.
//! The page itself is public, like `/health`; everything it shows comes through `/v1/`, which
//! asks for the API key when the server has one (the page then asks the user for it).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The page.
const PAGE: &str = include_str!("web/index.html");

/// `GET /`.
pub(super) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            // Its script and style are inline; it connects only to this origin.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
                 frame-ancestors 'none'",
            ),
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
