//! `/metrics`, `/healthz` and `/readyz` on one small HTTP/1 listener, and the status API and
//! page (`crate::adapters::status`) when they are on.
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
//! - At most `max_connections` are open at once. One more is accepted and closed at once rather
//!   than left waiting in the kernel's backlog: the peer learns at once that it must retry, the
//!   backlog keeps draining, and the descriptor is freed. The slots held free up within
//!   `connection_timeout` at worst, so `/healthz` answers again once the flood stops.
//! - An accept that fails (too many open files, no memory) is retried after a delay doubling
//!   from 5 ms to 1 s (`accept_backoff`), not at once: a loop retrying at once spins a core and
//!   frees nothing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

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

/// What `/readyz` waits for. Each flag is set by the part that knows.
#[derive(Debug, Default)]
pub struct Readiness {
    pub rules_loaded: AtomicBool,
    pub caches_synced: AtomicBool,
    pub leader_known: AtomicBool,
}

impl Readiness {
    /// What is still missing; empty when ready.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if !self.rules_loaded.load(Ordering::Relaxed) {
            missing.push("rules not loaded");
        }
        if !self.caches_synced.load(Ordering::Relaxed) {
            missing.push("caches not synced");
        }
        if !self.leader_known.load(Ordering::Relaxed) {
            missing.push("leader not known");
        }
        missing
    }

    pub fn is_ready(&self) -> bool {
        self.missing().is_empty()
    }
}

/// What one client may hold of the listener (see "Limits" above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Time to send a request's headers.
    pub header_timeout: Duration,
    /// Time a connection may stay open, whatever it does.
    pub connection_timeout: Duration,
}

impl ListenerLimits {
    pub const DEFAULT: ListenerLimits = ListenerLimits {
        max_connections: 128,
        header_timeout: Duration::from_secs(10),
        connection_timeout: Duration::from_secs(60),
    };
}

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

/// Binds `address` (so a taken port fails the start, not later) and serves until `stop` is
/// cancelled.
pub async fn serve(
    address: SocketAddr,
    limits: ListenerLimits,
    registry: Registry,
    autoscalers: Arc<AutoscalerMetrics>,
    readiness: Arc<Readiness>,
    status: Option<Arc<StatusApi>>,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let task = tokio::spawn(async move {
        let mut backoff: Option<Duration> = None;
        // Whether the last connection was refused for the cap, so that a flood is logged when it
        // starts and when it ends, not per connection.
        let mut refusing = false;
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
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
                },
                () = stop.cancelled() => return,
            };
            backoff = None;
            let (stream, peer) = stream;
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                if !refusing {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "metrics listener: every connection slot is taken, closing new connections at once"
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
            let registry = registry.clone();
            let readiness = Arc::clone(&readiness);
            let autoscalers = Arc::clone(&autoscalers);
            let status = status.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let status = status.clone().filter(|_| handles(request.uri().path()) && is_read(&request));
                    let response = match status {
                        None => Ok(respond(&request, &registry, &autoscalers, &readiness)),
                        Some(status) => Err((status, request)),
                    };
                    async move {
                        Ok::<_, Infallible>(match response {
                            Ok(response) => response,
                            Err((status, request)) => answer_status(&status, &request, peer).await,
                        })
                    }
                });
                serve_connection(stream, service, limits).await;
                drop(slot);
            });
        }
    });
    Ok((bound, task))
}

/// One connection, within the header and lifetime limits.
async fn serve_connection<S>(stream: TcpStream, service: S, limits: ListenerLimits)
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = Body>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
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
        "/healthz" => text(StatusCode::OK, "ok\n", "text/plain"),
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
