//! The daemon's one HTTP/1 listener. It knows no path: the parts that own them hand it their
//! routes (`routes`: `/metrics` from telemetry, `/healthz` and `/readyz` from health, `/api/v1`
//! and `/ui` from status), merged into one table, and it answers each request from that table.
//! It answers only GET and HEAD (`405 only GET` otherwise), and a path no route answers with a
//! 404 naming the listed ones.
//!
//! # Its own thread
//! The listener runs on a thread of its own with its own runtime, not on the daemon's: whatever
//! the network sends, the thread that evaluates, writes scales and renews the Lease never
//! accepts, parses or answers a request. Status answers are worked out on the status worker
//! (`status::worker`), so a costly one never delays a probe either.
//!
//! # Limits
//! The listener answers whoever connects (in a pod it binds all interfaces, to be scraped), so it
//! bounds what a client can hold (`ListenerLimits`, from the settings):
//!
//! - A client has `header_timeout` to send a request's headers; hyper enforces it only with a
//!   timer, which is why one is given.
//! - A connection lives at most `connection_timeout`, however it is used (a slow-loris client
//!   trickling bytes, a scraper that stops reading a `/metrics` answer). Then it is shut down
//!   gracefully, letting the answer being written finish within another `header_timeout`, and
//!   is dropped after that. A scraper reconnects for its next scrape.
//! - At most `max_connections` are open at once, and at most `max_connections_per_peer` from
//!   one peer; past `max_connections`, `probe_reserve` more are kept for the routes that say
//!   the reserve may answer them (the probes and the scrape: `slots`, `Route::from_reserve`);
//!   any other route answers a reserve connection 503 "the listener is full". A connection
//!   that gets no slot is accepted and closed at once rather than left waiting in the kernel's
//!   backlog: the peer learns at once that it must retry, the backlog keeps draining, and the
//!   descriptor is freed. The slots held free up within `connection_timeout` at worst.
//! - An accept that fails (too many open files, no memory) is retried after a delay doubling
//!   from 5 ms to 1 s (`accept_backoff`), not at once: a loop retrying at once spins a core and
//!   frees nothing.

mod routes;
pub mod slots;

pub use routes::{ready, text, with_body, Body, Handler, Paths, Reply, Route, RouteConflict, Routes};

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::body::Bytes;
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use slots::{Admission, PeerKey, SlotTable};

/// Why the listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// The address cannot be bound, or the listener's thread or runtime cannot be started.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Two parts answer the same path.
    #[error(transparent)]
    Routes(#[from] RouteConflict),
}

/// What one client may hold of the listener (see "Limits" above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections open at once for any use; past them, the probe reserve.
    pub max_connections: usize,
    /// Connections one peer (an IPv4 address, an IPv6 /64) may hold at once.
    pub max_connections_per_peer: usize,
    /// Connections kept beyond `max_connections` for the routes the reserve answers (the
    /// probes and the scrape).
    pub probe_reserve: usize,
    /// Time to send a request's headers.
    pub header_timeout: Duration,
    /// Time a connection may stay open, whatever it does.
    pub connection_timeout: Duration,
}

impl ListenerLimits {
    pub const DEFAULT: ListenerLimits = ListenerLimits {
        max_connections: 128,
        max_connections_per_peer: 16,
        probe_reserve: 16,
        header_timeout: Duration::from_secs(10),
        connection_timeout: Duration::from_secs(60),
    };
}

/// A connection in the probe reserve has this long at most to send its request (or the
/// listener's header timeout, if shorter): a probe sends its request at once.
const RESERVE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

impl Default for ListenerLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The first delay after a failed accept.
const FIRST_ACCEPT_BACKOFF: Duration = Duration::from_millis(5);
/// The longest delay between failed accepts.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// How long to wait before accepting again after a failed accept, given the delay after the
/// previous failure in a row (`None`: this is the first).
pub fn accept_backoff(previous: Option<Duration>) -> Duration {
    match previous {
        None => FIRST_ACCEPT_BACKOFF,
        Some(delay) => delay.saturating_mul(2).clamp(FIRST_ACCEPT_BACKOFF, MAX_ACCEPT_BACKOFF),
    }
}

/// The listener's thread, once started: `stopped` waits for it to end.
pub struct ListenerTask {
    ended: oneshot::Receiver<()>,
}

impl ListenerTask {
    /// Waits until the listener's thread has stopped serving (after `stop` was cancelled).
    pub async fn stopped(self) {
        let _ = self.ended.await;
    }
}

/// The connection table, shared by the accept loop and the connections it frees.
type Slots = Arc<Mutex<SlotTable>>;

/// Frees a connection's slot when the connection ends, however it ends.
struct Held {
    slots: Slots,
    peer: PeerKey,
    admission: Admission,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner).release(self.peer, self.admission);
    }
}

/// The routes, and what the listener says of them, worked out once.
struct Table {
    routes: Routes,
    not_found: Bytes,
    full: Bytes,
}

impl Table {
    /// Answers one request, on a connection admitted as `reserve` or not.
    fn answer(&self, request: &Parts, peer: SocketAddr, reserve: bool) -> Reply {
        if request.method != hyper::Method::GET && request.method != hyper::Method::HEAD {
            return ready(text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n", "text/plain"));
        }
        match self.routes.find(request.uri.path()) {
            None => ready(text(StatusCode::NOT_FOUND, self.not_found.clone(), "text/plain")),
            Some(route) if reserve && !route.answers_from_reserve() => ready(self.busy()),
            Some(route) => route.answer(request, peer),
        }
    }

    /// What a connection in the probe reserve gets for a route the reserve does not answer.
    fn busy(&self) -> Response<Body> {
        let mut response = text(StatusCode::SERVICE_UNAVAILABLE, self.full.clone(), "text/plain");
        response.headers_mut().insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from_static("1"));
        response
    }
}

/// Checks the routes and binds `address` (so a taken port or two routes for one path fail the
/// start, not later), then serves, on a thread of its own, until `stop` is cancelled.
pub async fn serve(
    address: SocketAddr,
    limits: ListenerLimits,
    routes: Routes,
    stop: CancellationToken,
) -> Result<(SocketAddr, ListenerTask), ListenerError> {
    routes.check()?;
    let table = Arc::new(Table { not_found: routes.not_found_text().into(), full: routes.full_text().into(), routes });
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (ended_tx, ended) = oneshot::channel();
    std::thread::Builder::new().name("watermarkd-listener".into()).spawn(move || {
        runtime.block_on(async move {
            match TcpListener::from_std(listener) {
                Ok(listener) => accept_loop(listener, limits, table, stop).await,
                Err(err) => tracing::error!(error = %err, "metrics listener: cannot serve"),
            }
        });
        // Connections still open end with the runtime.
        drop(runtime);
        let _ = ended_tx.send(());
    })?;
    Ok((bound, ListenerTask { ended }))
}

async fn accept_loop(listener: TcpListener, limits: ListenerLimits, table: Arc<Table>, stop: CancellationToken) {
    let slots: Slots = Arc::new(Mutex::new(SlotTable::new(
        limits.max_connections,
        limits.max_connections_per_peer,
        limits.probe_reserve,
    )));
    let mut backoff: Option<Duration> = None;
    // Whether the last connection was refused, so that a flood is logged when it starts and
    // when it ends, not per connection.
    let mut refusing = false;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                let delay = accept_backoff(backoff);
                backoff = Some(delay);
                tracing::warn!(error = %err, retry_in = ?delay, "metrics listener accept failed");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => continue,
                    () = stop.cancelled() => return,
                }
            }
        };
        backoff = None;
        let key = PeerKey::of(peer.ip());
        let admitted = slots.lock().unwrap_or_else(PoisonError::into_inner).admit(key);
        let Some(admission) = admitted else {
            if !refusing {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    max_connections_per_peer = limits.max_connections_per_peer,
                    "metrics listener: no connection slot for a peer, closing its new connections at once"
                );
                refusing = true;
            }
            drop(stream);
            continue;
        };
        if refusing {
            tracing::info!("metrics listener: connection slots free again");
            refusing = false;
        }
        let held = Held { slots: Arc::clone(&slots), peer: key, admission };
        let table = Arc::clone(&table);
        tokio::spawn(async move {
            let reserve = admission == Admission::Reserve;
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let (head, body) = request.into_parts();
                let reply = table.answer(&head, peer, reserve);
                async move {
                    let response = reply.await;
                    // The request's body (a GET has none) is let go once it is answered.
                    drop(body);
                    Ok::<_, Infallible>(response)
                }
            });
            let limits = if reserve {
                ListenerLimits {
                    header_timeout: limits.header_timeout.min(RESERVE_HEADER_TIMEOUT),
                    connection_timeout: limits.connection_timeout.min(RESERVE_HEADER_TIMEOUT * 2),
                    ..limits
                }
            } else {
                limits
            };
            serve_connection(stream, service, limits, !reserve).await;
            drop(held);
        });
    }
}

/// One connection, within the header and lifetime limits.
async fn serve_connection<S>(stream: TcpStream, service: S, limits: ListenerLimits, keep_alive: bool)
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = Body>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(keep_alive);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        _ = tokio::time::sleep(limits.connection_timeout) => {
            connection.as_mut().graceful_shutdown();
            match tokio::time::timeout(limits.header_timeout, connection.as_mut()).await {
                Ok(ended) => ended,
                Err(_) => {
                    tracing::debug!("metrics connection open past its time: dropped");
                    return;
                }
            }
        }
    };
    if let Err(err) = ended {
        tracing::debug!(error = %err, "metrics connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_accepts_back_off_from_5ms_doubling_to_1s() {
        let mut delays = Vec::new();
        let mut previous = None;
        for _ in 0..12 {
            let delay = accept_backoff(previous);
            delays.push(delay.as_millis());
            previous = Some(delay);
        }
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000]);
        assert_eq!(accept_backoff(Some(Duration::MAX)), MAX_ACCEPT_BACKOFF, "no overflow");
        assert_eq!(accept_backoff(Some(Duration::ZERO)), FIRST_ACCEPT_BACKOFF);
    }
}
