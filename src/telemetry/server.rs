//! `/metrics`, `/healthz` and `/readyz` on one small HTTP/1 listener.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Frame};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use super::AutoscalerMetrics;

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

/// Binds `address` (so a taken port fails the start, not later) and serves until `shutdown`.
pub async fn serve(
    address: SocketAddr,
    registry: Registry,
    autoscalers: Arc<AutoscalerMetrics>,
    readiness: Arc<Readiness>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        tracing::warn!(error = %err, "metrics listener accept failed");
                        continue;
                    }
                },
                _ = shutdown.changed() => return,
            };
            let registry = registry.clone();
            let readiness = Arc::clone(&readiness);
            let autoscalers = Arc::clone(&autoscalers);
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let response = respond(&request, &registry, &autoscalers, &readiness);
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(err) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                    tracing::debug!(error = %err, "metrics connection ended with an error");
                }
            });
        }
    });
    Ok((bound, task))
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
        _ => text(StatusCode::NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n", "text/plain"),
    }
}
