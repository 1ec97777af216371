//! Where the backends' requests, and the credentials in them, may go.
//!
//! # Redirects
//! The HTTP clients of the backends (Datadog, Prometheus, recommenders) follow a 3xx only within
//! the origin they were configured with. Their requests carry credentials in headers of their own (`DD-API-KEY`,
//! `DD-APPLICATION-KEY`, a Prometheus `X-Scope-OrgID` or custom header, basic or bearer auth).
//! reqwest's default policy strips only `Authorization` and cookies when a redirect changes host,
//! so every other header would go to whatever host a `Location` names. A redirect to another
//! origin (scheme, host or port) is therefore refused, as an error naming the status and the
//! origin asked for, never its path or query (which may hold a token). A redirect within the
//! origin (a proxy adding a trailing slash) keeps the credentials where they were meant to go,
//! and is followed up to `MAX_REDIRECTS` times.
//!
//! # Plain http
//! Datadog's keys grant reading every metric of the organisation, so a Datadog `url` in plain
//! `http://` is refused unless the backend sets `allow_insecure_http` (a proxy on a network the
//! operator trusts). Loopback needs no opt-in: a request to `127.0.0.1`, `::1` or `localhost`
//! never leaves the machine (or the pod), which is where a local forwarding proxy runs. The
//! rules reader refuses such a url (`rules::plain_http_host`), and the client is never built
//! with one.

use reqwest::redirect::{Action, Attempt, Policy};
use reqwest::Url;

/// Same-origin redirects followed for one request before it fails.
pub const MAX_REDIRECTS: usize = 5;

/// Why a redirect was not followed. The text ends up in the reason an autoscaler reports.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RedirectRefused {
    #[error(
        "the server redirected (HTTP {status}) to another origin, {to}: not followed, since the request carries \
         credentials; configure that address as the url if it is the right one"
    )]
    OtherOrigin { status: u16, to: String },
    #[error("more than {MAX_REDIRECTS} redirects (the last one HTTP {status})")]
    TooMany { status: u16 },
}

/// `scheme://host[:port]` of `url`: no user info, path or query.
pub fn origin(url: &Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{}://{host}:{port}", url.scheme()),
        (Some(host), None) => format!("{}://{host}", url.scheme()),
        (None, _) => format!("{}:", url.scheme()),
    }
}

/// Whether a redirect with `status` to `next`, after the requests to `previous` (the first one
/// the request as sent), may be followed.
pub fn decide(status: u16, next: &Url, previous: &[Url]) -> Result<(), RedirectRefused> {
    let same_origin = previous.first().is_some_and(|first| first.origin() == next.origin());
    if !same_origin {
        return Err(RedirectRefused::OtherOrigin { status, to: origin(next) });
    }
    // `previous` holds the request as sent plus each redirect followed so far.
    if previous.len() > MAX_REDIRECTS {
        return Err(RedirectRefused::TooMany { status });
    }
    Ok(())
}

/// The policy every backend client is built with.
pub fn redirect_policy() -> Policy {
    Policy::custom(|attempt: Attempt<'_>| -> Action {
        match decide(attempt.status().as_u16(), attempt.url(), attempt.previous()) {
            Ok(()) => attempt.follow(),
            Err(refused) => attempt.error(refused),
        }
    })
}

/// Whether a reqwest error is a refused redirect: a configuration to fix, not worth retrying.
pub fn is_refused_redirect(error: &reqwest::Error) -> bool {
    error.is_redirect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).expect("a URL")
    }

    #[test]
    fn only_the_same_origin_is_followed() {
        let first = [url("https://api.datadoghq.eu/api/v1/query?query=x")];
        assert_eq!(decide(301, &url("https://api.datadoghq.eu/api/v1/query/"), &first), Ok(()));
        assert_eq!(decide(307, &url("https://api.datadoghq.eu:443/other"), &first), Ok(()), "443 is https's port");
        for (next, origin) in [
            ("https://evil.example/collect?k=v", "https://evil.example"),
            ("http://api.datadoghq.eu/api/v1/query", "http://api.datadoghq.eu"),
            ("https://api.datadoghq.eu:8443/api/v1/query", "https://api.datadoghq.eu:8443"),
            ("https://user:pass@evil.example:444/x", "https://evil.example:444"),
        ] {
            let refused = decide(307, &url(next), &first).expect_err(next);
            assert_eq!(refused, RedirectRefused::OtherOrigin { status: 307, to: origin.to_string() });
            let text = refused.to_string();
            assert!(text.contains("HTTP 307") && text.contains(origin) && !text.contains("pass"), "{text}");
        }
    }

    #[test]
    fn a_chain_of_same_origin_redirects_ends() {
        let mut previous = vec![url("http://127.0.0.1:9090/p")];
        for _ in 0..MAX_REDIRECTS {
            assert_eq!(decide(302, &url("http://127.0.0.1:9090/p"), &previous), Ok(()));
            previous.push(url("http://127.0.0.1:9090/p"));
        }
        assert_eq!(
            decide(302, &url("http://127.0.0.1:9090/p"), &previous),
            Err(RedirectRefused::TooMany { status: 302 })
        );
        assert_eq!(
            decide(302, &url("http://127.0.0.1:9090/"), &[]),
            Err(RedirectRefused::OtherOrigin { status: 302, to: "http://127.0.0.1:9090".into() }),
            "no request to compare with: refused"
        );
    }
}
