//! Who may read the status API and page.
//!
//! - With no token configured (neither `token_file`/`token_env` nor `token_review`), anyone the
//!   listener lets connect. The binary's default listener is `127.0.0.1:8080`, so by default
//!   that is the local users; the Helm chart binds all interfaces.
//! - Otherwise a request needs a bearer token: the configured one (a file or an environment
//!   variable, re-read when it changes), or one the Kubernetes API server authenticates (a
//!   TokenReview for the audiences of `token_audiences`) whose user it then authorizes to read
//!   ([`READER_VERB`] [`READER_RESOURCE`] in [`READER_API_GROUP`]: a SubjectAccessReview). A token sent is always checked, and its answer
//!   stands.
//! - `open_on_loopback` lets a request without a token in when it comes from exactly 127.0.0.1
//!   or ::1 (`kubectl port-forward` into a pod arrives so). Off unless set: a sidecar (Istio
//!   connects from 127.0.0.6, Linkerd from 127.0.0.1) or a local reverse proxy makes every
//!   request look local.
//!
//! A request let in without a token must name this daemon in its `Host` header: an IP address,
//! `localhost` (or a name under `.localhost`), or a name of `allowed_hosts`. A web page that
//! rebinds its own name to the daemon's address (DNS rebinding) sends that name, and is refused.
//! A request carrying an accepted token is not held to this: a page cannot send the token.
//!
//! Checking a token with the API server costs the daemon's own API budget (its flow in API
//! Priority and Fairness is the one its watches and `/scale` writes use), so it is bounded:
//! a token longer than [`MAX_TOKEN_BYTES`] is refused before anything else; the answers are kept
//! by a SHA-256 digest of the token (never the token), yeses and noes apart so that a flood of
//! refused tokens never pushes out the accepted ones; and the reviews of tokens not known yet
//! are rate limited by one [`TokenBucket`] for the whole daemon ([`REVIEWS_PER_SECOND`],
//! [`REVIEW_BURST`]). A request over that rate gets 503 with a Retry-After, and no review is sent.
//!
//! `/metrics`, `/healthz` and `/readyz` are not behind any of this: scrapers and probes reach
//! them as before.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use crate::adapters::secret::RotatingSecret;

/// What a reader's token must be allowed (a SubjectAccessReview, cluster-wide): `get` on
/// `status` in the API group `watermarkd.io`. `commands::rbac::STATUS_READER` lists it with the
/// daemon's own permissions, from these.
pub const READER_API_GROUP: &str = "watermarkd.io";
pub const READER_RESOURCE: &str = "status";
pub const READER_VERB: &str = "get";

/// The longest bearer token looked at. A ServiceAccount token is 1 to 2 KB; a longer one is
/// refused unread, so that no review carries it and no memory holds it.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// Reviews of tokens not known yet, per second, for the whole daemon, once the burst is spent.
pub const REVIEWS_PER_SECOND: u32 = 10;
/// Reviews that may be sent at once after a quiet spell.
pub const REVIEW_BURST: u32 = 20;
/// How long a token's yes (authenticated and authorized) is believed.
const ACCEPTED_FOR: Duration = Duration::from_secs(60);
/// How long its no is.
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Answers kept at most, of each kind; past that the oldest of that kind is forgotten.
const REMEMBERED: usize = 1_024;
/// How long a reader whose token found the API server unreachable is asked to wait.
const UNCHECKED_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Why a request was not let in. Each message is fixed: nothing of the request, the token or
/// the API server's answer is in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a bearer token is required (Authorization: Bearer ...)")]
    NoToken,
    #[error("the bearer token is not accepted")]
    BadToken,
    #[error("the bearer token is longer than {MAX_TOKEN_BYTES} bytes")]
    TokenTooLong,
    #[error(
        "the token's user may not read the status: it needs get on status in the API group watermarkd.io \
         (a ClusterRole bound with a ClusterRoleBinding)"
    )]
    Forbidden,
    #[error(
        "this address is not allowed without a token: use an IP address or localhost, add the name to \
         allowed_hosts in the [status] settings, or send a bearer token"
    )]
    HostNotAllowed,
    #[error("too many new tokens to check; retry later")]
    Busy { retry_after: Duration },
    #[error("the token cannot be checked now")]
    Unchecked,
}

impl Refusal {
    /// The HTTP status of the answer.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::NoToken | Refusal::BadToken | Refusal::TokenTooLong => 401,
            Refusal::Forbidden | Refusal::HostNotAllowed => 403,
            Refusal::Busy { .. } | Refusal::Unchecked => 503,
        }
    }

    /// The headers the answer carries besides the security headers: the scheme to use after a
    /// 401, when to come back after a 503.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        match self {
            Refusal::NoToken | Refusal::BadToken | Refusal::TokenTooLong => {
                vec![("www-authenticate", "Bearer realm=\"watermarkd\"".into())]
            }
            Refusal::Busy { retry_after } => vec![("retry-after", whole_seconds(*retry_after).to_string())],
            Refusal::Unchecked => vec![("retry-after", whole_seconds(UNCHECKED_RETRY_AFTER).to_string())],
            Refusal::Forbidden | Refusal::HostNotAllowed => Vec::new(),
        }
    }
}

/// Seconds, rounded up, at least 1 (Retry-After counts whole seconds; 0 invites a busy loop).
fn whole_seconds(duration: Duration) -> u64 {
    (duration.as_secs() + u64::from(duration.subsec_nanos() > 0)).max(1)
}

/// What the access check needs to know of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller<'a> {
    /// The peer of the connection.
    pub peer: IpAddr,
    /// The `Authorization` header, if any.
    pub authorization: Option<&'a str>,
    /// The `Host` header: `None` when there is none, `Some("")` when it is not text.
    pub host: Option<&'a str>,
}

/// A token bucket: `burst` takes at once, then `per_second`. Time is an argument, so that the
/// rule is a function of the instants it is asked at.
///
/// Kept as the instant the bucket would be full again if nothing more were taken (the generic
/// cell rate algorithm): each take moves it one interval later, and a take is refused while it
/// is more than `burst - 1` intervals ahead of now. Exact, in whole nanoseconds.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    interval: Duration,
    tolerance: Duration,
    /// `None`: never taken from, full.
    full_at: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket (`per_second` and `burst` at least 1).
    pub fn new(per_second: u32, burst: u32) -> TokenBucket {
        let interval = Duration::from_secs(1) / per_second.max(1);
        TokenBucket { interval, tolerance: interval.saturating_mul(burst.max(1) - 1), full_at: None }
    }

    /// Takes one at `now` if there is one; otherwise says how long until there is one, and
    /// takes nothing.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let full_at = self.full_at.map_or(now, |at| at.max(now));
        let ahead = full_at.saturating_duration_since(now);
        if ahead > self.tolerance {
            return Err(ahead - self.tolerance);
        }
        self.full_at = Some(full_at.checked_add(self.interval).unwrap_or(full_at));
        Ok(())
    }
}

/// Answers kept by key, each for `keep`, at most `capacity`: when full, the expired go, then the
/// oldest.
#[derive(Debug)]
struct Remembered<K, V> {
    keep: Duration,
    capacity: usize,
    entries: HashMap<K, (V, Instant)>,
}

impl<K: Hash + Eq + Copy, V: Copy> Remembered<K, V> {
    fn new(keep: Duration, capacity: usize) -> Self {
        Remembered { keep, capacity: capacity.max(1), entries: HashMap::new() }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        let (value, at) = self.entries.get(key)?;
        (now.saturating_duration_since(*at) < self.keep).then_some(*value)
    }

    fn insert(&mut self, key: K, value: V, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            let keep = self.keep;
            self.entries.retain(|_, (_, at)| now.saturating_duration_since(*at) < keep);
            if self.entries.len() >= self.capacity {
                let oldest = self.entries.iter().min_by_key(|(_, (_, at))| *at).map(|(key, _)| *key);
                if let Some(oldest) = oldest {
                    self.entries.remove(&oldest);
                }
            }
        }
        self.entries.insert(key, (value, now));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// A token's SHA-256: what the answers are kept by, so that no token is held after its request.
type Digest = [u8; 32];

fn digest(token: &str) -> Digest {
    let sha = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.iter_mut().zip(sha.as_ref()).for_each(|(k, byte)| *k = *byte);
    key
}

/// Why the API server said no.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum No {
    /// The TokenReview: not authenticated (for our audiences).
    Unauthenticated,
    /// The SubjectAccessReview: authenticated, but not allowed to read.
    Forbidden,
}

impl No {
    fn refusal(self) -> Refusal {
        match self {
            No::Unauthenticated => Refusal::BadToken,
            No::Forbidden => Refusal::Forbidden,
        }
    }
}

/// What the reviewer remembers and how fast it may ask.
#[derive(Debug)]
struct Reviews {
    accepted: Remembered<Digest, ()>,
    refused: Remembered<Digest, No>,
    bucket: TokenBucket,
}

/// Checks tokens with the API server: a TokenReview (is it authenticated, for our audiences,
/// and as whom), then a SubjectAccessReview (may that user read the status).
pub struct TokenReviewer {
    client: kube::Client,
    /// The TokenReview's `audiences`; empty: the API server's own.
    audiences: Vec<String>,
    reviews: Mutex<Reviews>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client, audiences: Vec<String>) -> TokenReviewer {
        TokenReviewer {
            client,
            audiences,
            reviews: Mutex::new(Reviews {
                accepted: Remembered::new(ACCEPTED_FOR, REMEMBERED),
                refused: Remembered::new(REFUSED_FOR, REMEMBERED),
                bucket: TokenBucket::new(REVIEWS_PER_SECOND, REVIEW_BURST),
            }),
        }
    }

    /// The remembered answer for `key`, or leave to ask the API server (a take from the bucket).
    fn before_asking(&self, key: &Digest, now: Instant) -> Result<Option<()>, Refusal> {
        let mut reviews = self.reviews.lock().unwrap_or_else(PoisonError::into_inner);
        if reviews.accepted.get(key, now).is_some() {
            return Ok(Some(()));
        }
        if let Some(no) = reviews.refused.get(key, now) {
            return Err(no.refusal());
        }
        reviews.bucket.take(now).map_err(|retry_after| Refusal::Busy { retry_after })?;
        Ok(None)
    }

    fn remember(&self, key: Digest, answer: Result<(), No>, now: Instant) {
        let mut reviews = self.reviews.lock().unwrap_or_else(PoisonError::into_inner);
        match answer {
            Ok(()) => reviews.accepted.insert(key, (), now),
            Err(no) => reviews.refused.insert(key, no, now),
        }
    }

    async fn check(&self, token: &str) -> Result<(), Refusal> {
        let key = digest(token);
        if self.before_asking(&key, Instant::now())?.is_some() {
            return Ok(());
        }
        let answer = self.ask(token).await?;
        self.remember(key, answer, Instant::now());
        answer.map_err(No::refusal)
    }

    /// Asks the API server. Its errors go to the log, never to the reader, who learns only
    /// that the token cannot be checked now (the error names the daemon's own identity and
    /// what it may not do).
    async fn ask(&self, token: &str) -> Result<Result<(), No>, Refusal> {
        let audiences = (!self.audiences.is_empty()).then(|| self.audiences.clone());
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|err| {
                // The error names the API call, never the token.
                tracing::warn!(error = %err, "status: a TokenReview failed; the reader was told only that the token cannot be checked now");
                Refusal::Unchecked
            })?;
        let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(Err(No::Unauthenticated));
        };
        // With audiences asked for, the API server names those the token is good for; an
        // answer naming none of ours (an API server that ignores audiences) is a no.
        if !self.audiences.is_empty() {
            let granted = status.audiences.unwrap_or_default();
            if !granted.iter().any(|a| self.audiences.contains(a)) {
                return Ok(Err(No::Unauthenticated));
            }
        }
        let user = status.user.unwrap_or_default();
        self.may_read(user).await
    }

    async fn may_read(&self, user: UserInfo) -> Result<Result<(), No>, Refusal> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                resource_attributes: Some(ResourceAttributes {
                    group: Some(READER_API_GROUP.to_string()),
                    resource: Some(READER_RESOURCE.to_string()),
                    verb: Some(READER_VERB.to_string()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|err| {
                tracing::warn!(error = %err, "status: a SubjectAccessReview failed; the reader was told only that the token cannot be checked now");
                Refusal::Unchecked
            })?;
        let allowed = answer.status.is_some_and(|s| s.allowed && s.denied != Some(true));
        if !allowed {
            tracing::debug!(
                user = user.username.as_deref().unwrap_or(""),
                "status: a reader's user may not read the status"
            );
            return Ok(Err(No::Forbidden));
        }
        Ok(Ok(()))
    }
}

/// The access rule. See the module comment.
pub struct Access {
    token: Option<RotatingSecret>,
    reviewer: Option<TokenReviewer>,
    open_on_loopback: bool,
    /// Lower case, without a final dot.
    allowed_hosts: Vec<String>,
}

/// Equal without saying where they differ, so that the time taken does not tell.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Exactly this machine's own address, IPv4 or IPv6, also as an IPv4-mapped IPv6 address (how
/// an IPv4 peer of a `[::]` listener arrives). Not the rest of 127.0.0.0/8: a sidecar proxy
/// connects from such addresses (Istio from 127.0.0.6) on behalf of remote clients.
pub fn is_local_peer(peer: IpAddr) -> bool {
    match peer.to_canonical() {
        IpAddr::V4(v4) => v4 == Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => v6 == Ipv6Addr::LOCALHOST,
    }
}

/// A `Host` header's name: without the port and the brackets of an IPv6 address, without a
/// final dot, in lower case; `None` when it is not of that form.
fn host_name(host: &str) -> Option<String> {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => {
            let (inside, after) = rest.split_once(']')?;
            inside.parse::<Ipv6Addr>().ok()?;
            let port = if after.is_empty() { None } else { Some(after.strip_prefix(':')?) };
            (inside, port)
        }
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    if port.is_some_and(|port| !port.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    (!name.is_empty()).then(|| name.to_ascii_lowercase())
}

/// A name as `allowed_hosts` keeps it (lower case, without a final dot), or `None` when it is
/// not a host name (letters, digits, `-` and `.`, no port, no scheme).
pub fn allowed_host(name: &str) -> Option<String> {
    let name = name.trim();
    let name = name.strip_suffix('.').unwrap_or(name);
    let valid = !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !name.starts_with('.')
        && !name.contains("..");
    valid.then(|| name.to_ascii_lowercase())
}

/// Whether a request let in without a token may be answered for this `Host` header: none at
/// all (no browser sends a request without one), an IP address, `localhost` or a name under
/// `.localhost` (which resolve to this machine only), or one of `allowed` (as [`allowed_host`]
/// keeps them), any of them with a port.
pub fn host_allowed(host: Option<&str>, allowed: &[String]) -> bool {
    let Some(host) = host else { return true };
    let Some(name) = host_name(host) else { return false };
    name.parse::<IpAddr>().is_ok() || name == "localhost" || name.ends_with(".localhost") || allowed.contains(&name)
}

/// The bearer token of an `Authorization` header: `None` without one (no header, another
/// scheme, an empty token); refused when it is longer than [`MAX_TOKEN_BYTES`].
fn bearer(authorization: Option<&str>) -> Result<Option<&str>, Refusal> {
    let token = authorization
        .and_then(|value| value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    match token {
        Some(token) if token.len() > MAX_TOKEN_BYTES => Err(Refusal::TokenTooLong),
        other => Ok(other),
    }
}

impl Access {
    /// Everyone the listener lets connect (with a Host header naming it).
    pub fn open() -> Access {
        Access { token: None, reviewer: None, open_on_loopback: false, allowed_hosts: Vec::new() }
    }

    /// `allowed_hosts` as [`allowed_host`] keeps them.
    pub fn new(
        token: Option<RotatingSecret>,
        reviewer: Option<TokenReviewer>,
        open_on_loopback: bool,
        allowed_hosts: Vec<String>,
    ) -> Access {
        Access { token, reviewer, open_on_loopback, allowed_hosts }
    }

    /// Whether any token is asked for at all.
    pub fn needs_token(&self) -> bool {
        self.token.is_some() || self.reviewer.is_some()
    }

    /// Lets `caller` in, or says why not.
    pub async fn check(&self, caller: &Caller<'_>) -> Result<(), Refusal> {
        let token = bearer(caller.authorization)?;
        let without_token = || {
            if host_allowed(caller.host, &self.allowed_hosts) {
                Ok(())
            } else {
                Err(Refusal::HostNotAllowed)
            }
        };
        if !self.needs_token() {
            return without_token();
        }
        let Some(token) = token else {
            return if self.open_on_loopback && is_local_peer(caller.peer) {
                without_token()
            } else {
                Err(Refusal::NoToken)
            };
        };
        if let Some(expected) = &self.token {
            if same(expected.current().await.expose().as_bytes(), token.as_bytes()) {
                return Ok(());
            }
        }
        match &self.reviewer {
            Some(reviewer) => reviewer.check(token).await,
            None => Err(Refusal::BadToken),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::rules::SecretSource;

    fn caller<'a>(peer: &str, authorization: Option<&'a str>, host: Option<&'a str>) -> Caller<'a> {
        Caller { peer: peer.parse().unwrap(), authorization, host }
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
    }

    #[tokio::test]
    async fn a_configured_token_is_asked_for_except_from_this_machine_when_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        let token = RotatingSecret::load(&SecretSource::File(path)).unwrap();
        let access = Access::new(Some(token.clone()), None, true, Vec::new());
        let host = Some("127.0.0.1:8080");
        assert_eq!(access.check(&caller("10.1.2.3", None, host)).await, Err(Refusal::NoToken));
        assert_eq!(access.check(&caller("10.1.2.3", Some("Bearer nope"), host)).await, Err(Refusal::BadToken));
        assert_eq!(access.check(&caller("10.1.2.3", Some("Basic czNjcmV0"), host)).await, Err(Refusal::NoToken));
        assert_eq!(access.check(&caller("10.1.2.3", Some("Bearer s3cret"), host)).await, Ok(()));
        assert_eq!(access.check(&caller("10.1.2.3", Some("bearer s3cret"), host)).await, Ok(()));
        for local in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(access.check(&caller(local, None, host)).await, Ok(()), "{local}");
        }
        // The rest of 127.0.0.0/8 is a sidecar's (Istio: 127.0.0.6), not this machine's user.
        for proxy in ["127.0.0.6", "127.1.2.3", "::ffff:127.0.0.6"] {
            assert_eq!(access.check(&caller(proxy, None, host)).await, Err(Refusal::NoToken), "{proxy}");
        }
        // A token sent from this machine is checked all the same.
        assert_eq!(access.check(&caller("127.0.0.1", Some("Bearer nope"), host)).await, Err(Refusal::BadToken));
        let strict = Access::new(Some(token), None, false, Vec::new());
        assert_eq!(strict.check(&caller("127.0.0.1", None, host)).await, Err(Refusal::NoToken));
        assert_eq!(Access::open().check(&caller("10.1.2.3", None, host)).await, Ok(()));
    }

    #[tokio::test]
    async fn the_host_is_checked_only_for_requests_without_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret").unwrap();
        let token = RotatingSecret::load(&SecretSource::File(path)).unwrap();
        let access = Access::new(Some(token), None, true, vec!["status.example".into()]);
        let rebound = Some("attacker.example:8080");
        assert_eq!(access.check(&caller("127.0.0.1", None, rebound)).await, Err(Refusal::HostNotAllowed));
        assert_eq!(access.check(&caller("127.0.0.1", Some("Bearer s3cret"), rebound)).await, Ok(()));
        assert_eq!(access.check(&caller("127.0.0.1", None, Some("Status.Example."))).await, Ok(()));
        let open = Access::open();
        assert_eq!(open.check(&caller("10.0.0.1", None, rebound)).await, Err(Refusal::HostNotAllowed));
        assert_eq!(open.check(&caller("10.0.0.1", None, Some("10.0.0.9:8080"))).await, Ok(()));
    }

    #[tokio::test]
    async fn a_token_past_the_limit_is_refused_before_anything_else() {
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        let at_limit = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES));
        assert_eq!(bearer(Some(&long)), Err(Refusal::TokenTooLong));
        assert_eq!(bearer(Some(&at_limit)).map(|t| t.map(str::len)), Ok(Some(MAX_TOKEN_BYTES)));
        assert_eq!(Access::open().check(&caller("127.0.0.1", Some(&long), None)).await, Err(Refusal::TokenTooLong));
    }

    #[test]
    fn the_host_rule() {
        let allowed = vec!["watermarkd.example".to_string()];
        for host in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "10.2.3.4:80",
            "[::1]:8080",
            "[::1]",
            "[2001:db8::1]:8080",
            "localhost",
            "LOCALHOST:8080",
            "localhost.:8080",
            "watermarkd.localhost:8080",
            "watermarkd.example",
            "WaterMarkd.Example:443",
            "watermarkd.example.",
            "localhost:",
        ] {
            assert!(host_allowed(Some(host), &allowed), "{host} is allowed");
        }
        for host in [
            "attacker.example",
            "attacker.example:8080",
            "localhost.attacker.example",
            "watermarkd.example.attacker.example",
            "127.0.0.1.nip.io",
            "example.com:80:80",
            "[::1",
            "[::1]x",
            "[not-ip]:80",
            "::1",
            "localhost:80a",
            "",
            ":8080",
        ] {
            assert!(!host_allowed(Some(host), &allowed), "{host} is refused");
        }
        assert!(host_allowed(None, &[]), "no Host header: no browser");
    }

    #[test]
    fn allowed_hosts_are_names_only() {
        assert_eq!(allowed_host("Status.Example.COM."), Some("status.example.com".into()));
        assert_eq!(allowed_host("watermarkd-metrics.watermarkd.svc"), Some("watermarkd-metrics.watermarkd.svc".into()));
        for bad in ["", "http://x", "x:8080", "a b", "*.example", ".example", "a..b", "[::1]"] {
            assert_eq!(allowed_host(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_loopback_peer_is_exactly_this_machine() {
        for local in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert!(is_local_peer(local.parse().unwrap()), "{local}");
        }
        for other in ["127.0.0.6", "127.0.0.2", "::ffff:127.0.0.6", "10.0.0.1", "::", "0.0.0.0", "::2"] {
            assert!(!is_local_peer(other.parse().unwrap()), "{other}");
        }
    }

    #[test]
    fn the_bucket_gives_its_burst_then_its_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10, 20);
        let taken = (0..100).filter(|_| bucket.take(start).is_ok()).count();
        assert_eq!(taken, 20, "the burst at once");
        assert_eq!(bucket.take(start), Err(Duration::from_millis(100)), "one more in a tenth of a second");
        assert_eq!(bucket.take(start + Duration::from_millis(40)), Err(Duration::from_millis(60)));
        // A second later, ten more; never more than the burst however long it rests.
        let later = start + Duration::from_secs(1);
        assert_eq!((0..100).filter(|_| bucket.take(later).is_ok()).count(), 10);
        let much_later = later + Duration::from_secs(3_600);
        assert_eq!((0..100).filter(|_| bucket.take(much_later).is_ok()).count(), 20);
        // Asked every millisecond for 10 seconds: the burst plus the rate, 20 + 100.
        let mut bucket = TokenBucket::new(10, 20);
        let taken = (0..=10_000).filter(|i| bucket.take(start + Duration::from_millis(*i)).is_ok()).count();
        assert_eq!(taken, 120);
        // An instant before the last one gives nothing back.
        let mut bucket = TokenBucket::new(1, 1);
        assert!(bucket.take(later).is_ok());
        assert!(bucket.take(start).is_err());
        assert!(bucket.take(later).is_err());
        assert!(bucket.take(later + Duration::from_secs(1)).is_ok());
        // Zeroes are read as ones, not as a bucket that never refills or a division by zero.
        let mut least = TokenBucket::new(0, 0);
        assert!(least.take(start).is_ok());
        assert_eq!(least.take(start), Err(Duration::from_secs(1)));
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        assert_eq!(whole_seconds(Duration::from_millis(100)), 1);
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(2_001)), 3);
        let busy = Refusal::Busy { retry_after: Duration::from_millis(1_500) };
        assert_eq!((busy.status(), busy.headers()), (503, vec![("retry-after", "2".to_string())]));
        assert_eq!(busy.to_string(), "too many new tokens to check; retry later");
    }

    #[test]
    fn answers_are_kept_for_their_time_and_the_oldest_go_first() {
        let start = Instant::now();
        let mut kept: Remembered<u32, bool> = Remembered::new(Duration::from_secs(10), 3);
        for key in 0..3 {
            kept.insert(key, true, start + Duration::from_secs(u64::from(key)));
        }
        assert_eq!(kept.get(&0, start + Duration::from_secs(9)), Some(true));
        assert_eq!(kept.get(&0, start + Duration::from_secs(10)), None, "expired");
        // Full: a new key pushes out the oldest (0), not the others.
        kept.insert(3, false, start + Duration::from_secs(5));
        assert_eq!(kept.len(), 3);
        assert_eq!(kept.get(&0, start + Duration::from_secs(5)), None);
        assert_eq!(kept.get(&1, start + Duration::from_secs(5)), Some(true));
        // Full of expired answers: they all go.
        kept.insert(4, true, start + Duration::from_secs(60));
        assert_eq!(kept.len(), 1);
        // An answer again for a known key replaces it without pushing out another.
        let mut kept: Remembered<u32, bool> = Remembered::new(Duration::from_secs(10), 2);
        kept.insert(1, true, start);
        kept.insert(2, true, start);
        kept.insert(2, false, start);
        assert_eq!((kept.get(&1, start), kept.get(&2, start)), (Some(true), Some(false)));
    }

    #[test]
    fn a_flood_of_refused_tokens_never_pushes_out_an_accepted_one() {
        let client_less = Reviews {
            accepted: Remembered::new(ACCEPTED_FOR, REMEMBERED),
            refused: Remembered::new(REFUSED_FOR, REMEMBERED),
            bucket: TokenBucket::new(REVIEWS_PER_SECOND, REVIEW_BURST),
        };
        let mut reviews = client_less;
        let start = Instant::now();
        let good = digest("the-good-token");
        reviews.accepted.insert(good, (), start);
        for i in 0..(REMEMBERED * 10) {
            reviews.refused.insert(digest(&format!("bad-{i}")), No::Unauthenticated, start);
        }
        assert_eq!(reviews.refused.len(), REMEMBERED);
        assert_eq!(reviews.accepted.get(&good, start + Duration::from_secs(59)), Some(()));
    }

    #[test]
    fn tokens_are_kept_as_their_sha256() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        let expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let hex: String = digest("abc").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, expected);
    }
}
