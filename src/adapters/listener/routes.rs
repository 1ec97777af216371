//! The listener's routes, contributed by the parts that own them: each part builds a `Routes`
//! of its own paths (telemetry `/metrics`, health the probes, status `/api/v1` and `/ui`), and
//! the daemon merges them into the one table the listener serves. The listener itself knows no
//! path: it asks the table.
//!
//! A route says whether a connection admitted in the probe reserve (`slots`) may be answered on
//! it, and whether it is named when the listener says what it serves (its "not found" and
//! "full" answers). Two routes that could both answer one path are refused when the listener
//! starts (`Routes::check`), naming the path: which one answered would otherwise depend on the
//! order the parts were merged in.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::http::request::Parts;
use hyper::{Response, StatusCode};

/// What the listener's answers are made of.
pub type Body = BoxBody<Bytes, Infallible>;

/// A route's answer, once worked out.
pub type Reply = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// What answers a route: the request's head (method, path, headers) and the peer's address.
/// Whatever it needs past the call, it copies: the answer is worked out on its own time.
pub type Handler = Arc<dyn Fn(&Parts, SocketAddr) -> Reply + Send + Sync>;

/// An answer already worked out.
pub fn ready(response: Response<Body>) -> Reply {
    Box::pin(std::future::ready(response))
}

/// A plain answer with a body known now.
pub fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &str) -> Response<Body> {
    with_body(status, Full::new(body.into()).boxed(), content_type)
}

/// An answer with a body of any kind (one written as it is produced, say).
pub fn with_body(status: StatusCode, body: Body, content_type: &str) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// Which paths a route answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Paths {
    /// This path alone.
    Exact(&'static str),
    /// Every path that starts with this (`/ui/` answers `/ui/table`, not `/ui`).
    Under(&'static str),
}

impl Paths {
    fn matches(self, path: &str) -> bool {
        match self {
            Paths::Exact(exact) => path == exact,
            Paths::Under(prefix) => path.starts_with(prefix),
        }
    }

    /// Whether some path is answered by both.
    fn overlaps(self, other: Paths) -> bool {
        match (self, other) {
            (Paths::Exact(a), Paths::Exact(b)) => a == b,
            (Paths::Exact(exact), Paths::Under(prefix)) | (Paths::Under(prefix), Paths::Exact(exact)) => {
                exact.starts_with(prefix)
            }
            (Paths::Under(a), Paths::Under(b)) => a.starts_with(b) || b.starts_with(a),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Paths::Exact(path) | Paths::Under(path) => path,
        }
    }
}

/// One route: the paths it answers, and how.
#[derive(Clone)]
pub struct Route {
    paths: Paths,
    handler: Handler,
    from_reserve: bool,
    listed: bool,
}

impl Route {
    /// `path` alone, answered by `handler`.
    pub fn exact(path: &'static str, handler: impl Fn(&Parts, SocketAddr) -> Reply + Send + Sync + 'static) -> Route {
        Route::new(Paths::Exact(path), Arc::new(handler))
    }

    /// Every path under `prefix`, answered by `handler`.
    pub fn under(prefix: &'static str, handler: impl Fn(&Parts, SocketAddr) -> Reply + Send + Sync + 'static) -> Route {
        Route::new(Paths::Under(prefix), Arc::new(handler))
    }

    /// `paths`, answered by a handler other routes may share.
    pub fn new(paths: Paths, handler: Handler) -> Route {
        Route { paths, handler, from_reserve: false, listed: false }
    }

    /// Answered on a connection in the probe reserve too (a probe, the scrape): cheap to
    /// answer, and needed when the listener is full. Any other route answers a reserve
    /// connection "the listener is full".
    pub fn from_reserve(self) -> Route {
        Route { from_reserve: true, ..self }
    }

    /// Named when the listener says what it serves.
    pub fn listed(self) -> Route {
        Route { listed: true, ..self }
    }

    pub fn paths(&self) -> Paths {
        self.paths
    }

    pub fn answers_from_reserve(&self) -> bool {
        self.from_reserve
    }

    /// Answers a request for one of its paths.
    pub fn answer(&self, request: &Parts, peer: SocketAddr) -> Reply {
        (self.handler)(request, peer)
    }
}

/// Two routes that could answer the same path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("two routes answer {path}: {first:?} and {second:?}")]
pub struct RouteConflict {
    /// A path both answer.
    pub path: &'static str,
    pub first: Paths,
    pub second: Paths,
}

/// Routes, in the order they were added; see the module comment.
#[derive(Clone, Default)]
pub struct Routes(Vec<Route>);

impl Routes {
    pub fn new() -> Routes {
        Routes::default()
    }

    /// These routes and `route`.
    pub fn with(mut self, route: Route) -> Routes {
        self.0.push(route);
        self
    }

    /// These routes and `other`'s, after them.
    pub fn merge(mut self, other: Routes) -> Routes {
        self.0.extend(other.0);
        self
    }

    /// That no path is answered by two routes; the first two that would, otherwise.
    pub fn check(&self) -> Result<(), RouteConflict> {
        for (at, first) in self.0.iter().enumerate() {
            for second in self.0.iter().skip(at + 1) {
                if first.paths.overlaps(second.paths) {
                    // The longer of the two is a path both answer.
                    let (a, b) = (first.paths.as_str(), second.paths.as_str());
                    let path = if a.len() >= b.len() { a } else { b };
                    return Err(RouteConflict { path, first: first.paths, second: second.paths });
                }
            }
        }
        Ok(())
    }

    /// The route that answers `path`, if one does.
    pub fn find(&self, path: &str) -> Option<&Route> {
        self.0.iter().find(|route| route.paths.matches(path))
    }

    /// What "not found" says: the paths that are listed.
    pub fn not_found_text(&self) -> String {
        let listed: Vec<&str> = self.0.iter().filter(|r| r.listed).map(|r| r.paths.as_str()).collect();
        match one_of(&listed, "or") {
            Some(paths) => format!("not found: try {paths}\n"),
            None => "not found\n".to_string(),
        }
    }

    /// What a reserve connection asking for any other route is told: which listed paths are
    /// answered while the listener is full.
    pub fn full_text(&self) -> String {
        let listed: Vec<&str> =
            self.0.iter().filter(|r| r.listed && r.from_reserve).map(|r| r.paths.as_str()).collect();
        let verb = if listed.len() == 1 { "is" } else { "are" };
        match one_of(&listed, "and") {
            Some(paths) => format!("the listener is full: only {paths} {verb} answered now; try again\n"),
            None => "the listener is full; try again\n".to_string(),
        }
    }
}

/// `a, b and c` (with `and` as `last`); `None` for no item.
fn one_of(items: &[&str], last: &str) -> Option<String> {
    match items {
        [] => None,
        [one] => Some((*one).to_string()),
        [init @ .., final_item] => Some(format!("{} {last} {final_item}", init.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(_: &Parts, _: SocketAddr) -> Reply {
        ready(text(StatusCode::OK, "ok\n", "text/plain"))
    }

    #[test]
    fn merged_routes_answer_their_own_paths_and_nothing_else() {
        let probes = Routes::new().with(Route::exact("/healthz", ok).from_reserve().listed());
        let status = Routes::new().with(Route::exact("/ui", ok).listed()).with(Route::under("/ui/", ok));
        let routes = probes.merge(status);
        assert_eq!(routes.check(), Ok(()));
        let found = |path: &str| routes.find(path).map(|r| (r.paths(), r.answers_from_reserve()));
        assert_eq!(found("/healthz"), Some((Paths::Exact("/healthz"), true)));
        assert_eq!(found("/ui"), Some((Paths::Exact("/ui"), false)));
        assert_eq!(found("/ui/table"), Some((Paths::Under("/ui/"), false)));
        assert_eq!(found("/healthz/"), None, "an exact path is that path alone");
        assert_eq!(found("/uix"), None);
        assert_eq!(routes.not_found_text(), "not found: try /healthz or /ui\n");
        assert_eq!(routes.full_text(), "the listener is full: only /healthz is answered now; try again\n");
    }

    #[test]
    fn a_path_two_routes_answer_is_refused_naming_it() {
        let twice =
            Routes::new().with(Route::exact("/metrics", ok)).merge(Routes::new().with(Route::exact("/metrics", ok)));
        assert_eq!(
            twice.check().map_err(|c| c.to_string()),
            Err("two routes answer /metrics: Exact(\"/metrics\") and Exact(\"/metrics\")".to_string())
        );
        let shadowed = Routes::new().with(Route::under("/api/", ok)).with(Route::exact("/api/v1", ok));
        assert_eq!(shadowed.check().map_err(|c| c.path), Err("/api/v1"));
        let nested = Routes::new().with(Route::under("/ui/", ok)).with(Route::under("/ui/app/", ok));
        assert_eq!(nested.check().map_err(|c| c.path), Err("/ui/app/"));
        let apart = Routes::new().with(Route::exact("/ui", ok)).with(Route::under("/ui/", ok));
        assert_eq!(apart.check(), Ok(()), "`/ui` is not under `/ui/`");
    }

    #[test]
    fn what_the_listener_says_it_serves_follows_the_routes() {
        let routes = Routes::new()
            .with(Route::exact("/metrics", ok).from_reserve().listed())
            .with(Route::exact("/healthz", ok).from_reserve().listed())
            .with(Route::exact("/readyz", ok).from_reserve().listed())
            .with(Route::exact("/", ok))
            .with(Route::exact("/ui", ok).listed());
        assert_eq!(routes.not_found_text(), "not found: try /metrics, /healthz, /readyz or /ui\n");
        assert_eq!(
            routes.full_text(),
            "the listener is full: only /metrics, /healthz and /readyz are answered now; try again\n"
        );
        assert_eq!(Routes::new().not_found_text(), "not found\n");
        assert_eq!(Routes::new().full_text(), "the listener is full; try again\n");
    }
}
