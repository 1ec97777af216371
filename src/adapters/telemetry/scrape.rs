//! `/metrics`: the daemon's registry and every autoscaler's series, in Prometheus' text format,
//! on the listener (`adapters::listener`). Answered from the probe reserve too: Prometheus must
//! get in when the listener is full.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame};
use hyper::{Response, StatusCode};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::sync::mpsc;

use super::AutoscalerMetrics;
use crate::adapters::listener::{ready, text, with_body, Body, Route, Routes};

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

/// `/metrics`, from `registry` and `autoscalers`.
pub fn routes(registry: Registry, autoscalers: Arc<AutoscalerMetrics>) -> Routes {
    let scrape = Route::exact("/metrics", move |_, _| ready(metrics(&registry, &autoscalers)));
    Routes::new().with(scrape.from_reserve().listed())
}

/// The registry's families at once, then the autoscalers' series a chunk at a time, written by
/// a task on the listener's runtime as the client reads them.
fn metrics(registry: &Registry, autoscalers: &AutoscalerMetrics) -> Response<Body> {
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
