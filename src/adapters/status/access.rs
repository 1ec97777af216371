//! Who may read the status API and page: anyone the listener lets connect (the default; the
//! host install listens on loopback only), or only a request with a bearer token, which is
//! either the configured one (a file or an environment variable, re-read when it changes) or
//! one the Kubernetes API server says is valid (a TokenReview, its answer kept a minute).
//! Connections from a loopback address may be let in without a token: inside a pod that is
//! `kubectl port-forward`, which the API server already authorized.
//!
//! `/metrics`, `/healthz` and `/readyz` are not behind this: scrapers and probes reach them
//! as before.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use crate::adapters::backend::RotatingSecret;

/// How long a TokenReview's yes is believed.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
/// How long its no is.
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Tokens remembered at most; past that the oldest answers are forgotten.
const REMEMBERED: usize = 1_024;

/// Why a request was not let in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a bearer token is required (Authorization: Bearer ...)")]
    NoToken,
    #[error("the bearer token is not accepted")]
    BadToken,
    #[error("the token cannot be checked now: {0}")]
    Unchecked(String),
}

/// Checks tokens with the API server.
pub struct TokenReviewer {
    client: kube::Client,
    answers: Mutex<HashMap<String, (bool, Instant)>>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client) -> TokenReviewer {
        TokenReviewer { client, answers: Mutex::default() }
    }

    fn remembered(&self, token: &str, now: Instant) -> Option<bool> {
        let answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        let (allowed, at) = answers.get(token)?;
        let fresh = now.saturating_duration_since(*at) < if *allowed { ALLOWED_FOR } else { REFUSED_FOR };
        fresh.then_some(*allowed)
    }

    fn remember(&self, token: &str, allowed: bool, now: Instant) {
        let mut answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        if answers.len() >= REMEMBERED {
            answers.retain(|_, (allowed, at)| {
                now.saturating_duration_since(*at) < if *allowed { ALLOWED_FOR } else { REFUSED_FOR }
            });
            if answers.len() >= REMEMBERED {
                answers.clear();
            }
        }
        answers.insert(token.to_string(), (allowed, now));
    }

    async fn authenticated(&self, token: &str) -> Result<bool, Refusal> {
        let now = Instant::now();
        if let Some(allowed) = self.remembered(token, now) {
            return Ok(allowed);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: None },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            // The error names the API call, never the token.
            .map_err(|err| Refusal::Unchecked(format!("TokenReview failed: {err}")))?;
        let allowed = answer.status.and_then(|s| s.authenticated).unwrap_or(false);
        self.remember(token, allowed, now);
        Ok(allowed)
    }
}

/// The access rule. See the module comment.
pub struct Access {
    token: Option<RotatingSecret>,
    reviewer: Option<TokenReviewer>,
    open_on_loopback: bool,
}

/// Equal without saying where they differ, so that the time taken does not tell.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Access {
    /// Everyone the listener lets connect.
    pub fn open() -> Access {
        Access { token: None, reviewer: None, open_on_loopback: true }
    }

    pub fn new(token: Option<RotatingSecret>, reviewer: Option<TokenReviewer>, open_on_loopback: bool) -> Access {
        Access { token, reviewer, open_on_loopback }
    }

    /// Whether any token is asked for at all.
    pub fn needs_token(&self) -> bool {
        self.token.is_some() || self.reviewer.is_some()
    }

    /// Lets a request from `peer` with this `Authorization` header in, or says why not.
    pub async fn check(&self, peer: IpAddr, authorization: Option<&str>) -> Result<(), Refusal> {
        if !self.needs_token() || (self.open_on_loopback && peer.is_loopback()) {
            return Ok(());
        }
        let token = authorization
            .and_then(|value| value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::NoToken)?;
        if let Some(expected) = &self.token {
            if same(expected.current().await.expose().as_bytes(), token.as_bytes()) {
                return Ok(());
            }
        }
        match &self.reviewer {
            Some(reviewer) if reviewer.authenticated(token).await? => Ok(()),
            _ => Err(Refusal::BadToken),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::rules::SecretSource;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
    }

    #[tokio::test]
    async fn a_configured_token_is_asked_for_except_on_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        let token = RotatingSecret::load(&SecretSource::File(path)).unwrap();
        let access = Access::new(Some(token), None, true);
        let remote: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(access.check(remote, None).await, Err(Refusal::NoToken));
        assert_eq!(access.check(remote, Some("Bearer nope")).await, Err(Refusal::BadToken));
        assert_eq!(access.check(remote, Some("Basic czNjcmV0")).await, Err(Refusal::NoToken));
        assert_eq!(access.check(remote, Some("Bearer s3cret")).await, Ok(()));
        assert_eq!(access.check("127.0.0.1".parse().unwrap(), None).await, Ok(()));
        assert_eq!(access.check("::1".parse().unwrap(), None).await, Ok(()));
        let strict = Access::new(access.token.clone(), None, false);
        assert_eq!(strict.check("127.0.0.1".parse().unwrap(), None).await, Err(Refusal::NoToken));
        assert_eq!(Access::open().check(remote, None).await, Ok(()));
    }
}
