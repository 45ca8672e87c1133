//! The API key: with `--api-key`, every `/v1/*` request needs `Authorization: Bearer KEY`
//! (401 otherwise, saying whether the key was missing or wrong).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// Equal bytes, in a time that depends on the lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a request's headers carry `key` (`Err`: why not).
pub fn check(key: &str, authorization: Option<&[u8]>) -> Result<(), ApiError> {
    let Some(value) = authorization else {
        return Err(ApiError::unauthorized(
            "missing API key: send `Authorization: Bearer <key>`",
        ));
    };
    let token = value
        .strip_prefix(b"Bearer ")
        .or_else(|| value.strip_prefix(b"bearer "))
        .ok_or_else(|| ApiError::unauthorized("the Authorization header must be `Bearer <key>`"))?;
    if same(token.trim_ascii(), key.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::unauthorized("incorrect API key"))
    }
}

/// Middleware: lets a request through when no key is set or it carries the key.
pub async fn require_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(key) = &state.options.api_key {
        let header = request.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
        if let Err(e) = check(key, header) {
            return e.into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        assert!(check("k1", Some(b"Bearer k1")).is_ok());
        assert!(check("k1", Some(b"Bearer k2")).is_err());
        assert!(check("k1", Some(b"Bearer k12")).is_err());
        assert!(check("k1", Some(b"k1")).is_err());
        let e = check("k1", None).expect_err("missing");
        assert!(e.message.contains("missing"), "{e}");
    }
}
