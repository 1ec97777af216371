//! `/metrics`, `/healthz` and `/readyz` on one small HTTP/1 listener, and the status API and
//! page (`crate::adapters::status`) when they are on.
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
//!   one peer; past `max_connections`, `probe_reserve` more are kept for `/healthz`, `/readyz`
//!   and `/metrics` alone (`slots`). A connection that gets no slot is accepted and closed at
//!   once rather than left waiting in the kernel's backlog: the peer learns at once that it must
//!   retry, the backlog keeps draining, and the descriptor is freed. The slots held free up
//!   within `connection_timeout` at worst.
//! - An accept that fails (too many open files, no memory) is retried after a delay doubling
//!   from 5 ms to 1 s (`accept_backoff`), not at once: a loop retrying at once spins a core and
//!   frees nothing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Frame};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::slots::{Admission, PeerKey, SlotTable};
use super::AutoscalerMetrics;
use crate::adapters::status::access::Caller;
use crate::adapters::status::http::{handles, Answer};
use crate::adapters::status::StatusApi;

type Body = BoxBody<Bytes, Infallible>;

/// Autoscalers written per chunk of a `/metrics` answer.
const AUTOSCALERS_PER_CHUNK: usize = 256;

/// A body fed by a task, so that a large `/metrics` answer is written a chunk at a time instead
/// of being held whole.
struct ChunkedBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChunkedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// What `/readyz` waits for, and what `/healthz` checks. Each is set by the part that knows.
#[derive(Debug, Default)]
pub struct Readiness {
    pub rules_loaded: AtomicBool,
    pub caches_synced: AtomicBool,
    pub leader_known: AtomicBool,
    /// Why no autoscaler's state can be kept, while that is so (the state namespace is
    /// missing): not ready, since every restart would forget the forbidden windows.
    pub state_problem: Mutex<Option<String>>,
    /// The daemon's loop beats here (milliseconds on the listener's clock, `Readiness::beat`);
    /// 0 until the first beat.
    heartbeat_millis: AtomicU64,
}

/// How long the daemon's loop may go without a beat before `/healthz` says it is stuck. The
/// listener runs on a thread of its own, so answering is no proof that the daemon's loop runs.
pub const HEARTBEAT_STALE: Duration = Duration::from_secs(10);

/// The listener's clock for the heartbeat: milliseconds since the first call.
fn monotonic_millis() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Readiness {
    /// What is still missing; empty when ready.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !self.rules_loaded.load(Ordering::Relaxed) {
            missing.push("rules not loaded".to_string());
        }
        if !self.caches_synced.load(Ordering::Relaxed) {
            missing.push("caches not synced".to_string());
        }
        if !self.leader_known.load(Ordering::Relaxed) {
            missing.push("leader not known".to_string());
        }
        if let Some(problem) = self.state_problem.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            missing.push(problem);
        }
        missing
    }

    pub fn is_ready(&self) -> bool {
        self.missing().is_empty()
    }

    /// The daemon's loop is alive.
    pub fn beat(&self) {
        self.heartbeat_millis.store(monotonic_millis(), Ordering::Release);
    }

    /// How long since the last beat, once there was one.
    pub fn since_beat(&self) -> Option<Duration> {
        let last = self.heartbeat_millis.load(Ordering::Acquire);
        (last > 0).then(|| Duration::from_millis(monotonic_millis().saturating_sub(last)))
    }
}

/// What one client may hold of the listener (see "Limits" above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections open at once for any use; past them, the probe reserve.
    pub max_connections: usize,
    /// Connections one peer (an IPv4 address, an IPv6 /64) may hold at once.
    pub max_connections_per_peer: usize,
    /// Connections kept beyond `max_connections` for `/healthz`, `/readyz` and `/metrics`.
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

/// What every connection's service needs.
#[derive(Clone)]
struct Parts {
    registry: Registry,
    autoscalers: Arc<AutoscalerMetrics>,
    readiness: Arc<Readiness>,
    status: Option<Arc<StatusApi>>,
}

/// Binds `address` (so a taken port fails the start, not later) and serves, on a thread of its
/// own, until `stop` is cancelled.
pub async fn serve(
    address: SocketAddr,
    limits: ListenerLimits,
    registry: Registry,
    autoscalers: Arc<AutoscalerMetrics>,
    readiness: Arc<Readiness>,
    status: Option<Arc<StatusApi>>,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, ListenerTask)> {
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (ended_tx, ended) = oneshot::channel();
    let parts = Parts { registry, autoscalers, readiness, status };
    std::thread::Builder::new().name("watermarkd-listener".into()).spawn(move || {
        runtime.block_on(async move {
            match TcpListener::from_std(listener) {
                Ok(listener) => accept_loop(listener, limits, parts, stop).await,
                Err(err) => tracing::error!(error = %err, "metrics listener: cannot serve"),
            }
        });
        // Connections still open end with the runtime.
        drop(runtime);
        let _ = ended_tx.send(());
    })?;
    Ok((bound, ListenerTask { ended }))
}

async fn accept_loop(listener: TcpListener, limits: ListenerLimits, parts: Parts, stop: CancellationToken) {
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
        let parts = parts.clone();
        tokio::spawn(async move {
            let reserve = admission == Admission::Reserve;
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let status = parts.status.clone().filter(|_| handles(request.uri().path()) && is_read(&request));
                let response = match status {
                    Some(_) if reserve => Ok(busy()),
                    None => Ok(respond(&request, &parts.registry, &parts.autoscalers, &parts.readiness)),
                    Some(status) => Err((status, request)),
                };
                async move {
                    Ok::<_, Infallible>(match response {
                        Ok(response) => response,
                        Err((status, request)) => answer_status(&status, &request, peer).await,
                    })
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

/// What a connection in the probe reserve gets for a status path: the listener is full.
fn busy() -> Response<Body> {
    let mut response = text(
        StatusCode::SERVICE_UNAVAILABLE,
        "the listener is full: only /healthz, /readyz and /metrics are answered now; try again\n",
        "text/plain",
    );
    response.headers_mut().insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from_static("1"));
    response
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

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &str) -> Response<Body> {
    with_body(status, Full::new(body.into()).boxed(), content_type)
}

fn with_body(status: StatusCode, body: Body, content_type: &str) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

fn is_read<B>(request: &Request<B>) -> bool {
    request.method() == hyper::Method::GET || request.method() == hyper::Method::HEAD
}

/// A status request, answered by the status service.
async fn answer_status<B>(status: &StatusApi, request: &Request<B>, peer: SocketAddr) -> Response<Body> {
    let headers = request.headers();
    let authorization = headers.get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    // A Host header that is not text is kept as one, so that it is refused rather than missing.
    let host = headers.get(hyper::header::HOST).map(|v| v.to_str().unwrap_or(""));
    let caller = Caller { peer: peer.ip(), authorization, host };
    let uri = request.uri();
    let answer = status.answer(uri.path(), uri.query(), &caller).await;
    status_response(answer)
}

fn status_response(answer: Answer) -> Response<Body> {
    let code = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = text(code, answer.body, answer.content_type);
    let headers = response.headers_mut();
    let fixed = Answer::security_headers().into_iter().map(|(name, value)| (name, value.to_string()));
    for (name, value) in fixed.chain(answer.headers) {
        if let Ok(value) = hyper::header::HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    response
}

fn respond<B>(
    request: &Request<B>,
    registry: &Registry,
    autoscalers: &AutoscalerMetrics,
    readiness: &Readiness,
) -> Response<Body> {
    if request.method() != hyper::Method::GET && request.method() != hyper::Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n", "text/plain");
    }
    match request.uri().path() {
        "/metrics" => {
            let encoder = TextEncoder::new();
            let mut own = Vec::new();
            if let Err(err) = encoder.encode(&registry.gather(), &mut own) {
                return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n"), "text/plain");
            }
            let snapshot = autoscalers.snapshot();
            let (sender, receiver) = mpsc::channel(2);
            tokio::spawn(async move {
                if sender.send(Bytes::from(own)).await.is_err() {
                    return;
                }
                for index in 0..snapshot.chunks(AUTOSCALERS_PER_CHUNK) {
                    let chunk = snapshot.render(index, AUTOSCALERS_PER_CHUNK);
                    if !chunk.is_empty() && sender.send(Bytes::from(chunk)).await.is_err() {
                        return;
                    }
                }
            });
            with_body(StatusCode::OK, ChunkedBody(receiver).boxed(), encoder.format_type())
        }
        "/healthz" => match readiness.since_beat() {
            Some(since) if since > HEARTBEAT_STALE => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the daemon's loop has not run for {}s\n", since.as_secs()),
                "text/plain",
            ),
            _ => text(StatusCode::OK, "ok\n", "text/plain"),
        },
        "/readyz" => {
            let missing = readiness.missing();
            if missing.is_empty() {
                text(StatusCode::OK, "ok\n", "text/plain")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", missing.join(", ")), "text/plain")
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found: try /metrics, /healthz, /readyz or /ui\n", "text/plain"),
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
