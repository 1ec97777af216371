//! Two HTTP servers on 127.0.0.1 for redirect tests: a `Recorder` that keeps the headers of every
//! request it gets (and answers 200 with a fixed body), and a `Redirector` that answers every
//! request with a redirect to the same path and query on another base URL (another port is
//! another origin).
//!
//! Include it with `#[path = "support/redirect_servers.rs"] mod redirect_servers;`.

#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::HeaderMap;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Serves `answer` for every request on a fresh port; returns the base URL and the task.
async fn serve<F>(answer: F) -> (String, JoinHandle<()>)
where
    F: Fn(&Request<Incoming>) -> Response<Full<Bytes>> + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answer = Arc::new(answer);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let response = answer(&request);
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    (url, task)
}

/// Keeps the headers of every request.
pub struct Recorder {
    pub url: String,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    task: JoinHandle<()>,
}

impl Recorder {
    /// Answers every request 200 with `body` as `application/json`.
    pub async fn start(body: &'static str) -> Recorder {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&seen);
        let (url, task) = serve(move |request| {
            keep.lock().unwrap().push(request.headers().clone());
            Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap()
        })
        .await;
        Recorder { url, seen, task }
    }

    /// The headers of each request received, in order.
    pub fn requests(&self) -> Vec<HeaderMap> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Redirects every request to the same path and query under another base URL.
pub struct Redirector {
    pub url: String,
    task: JoinHandle<()>,
}

impl Redirector {
    /// Answers `status` (a 3xx) with `Location: <to><path and query>`.
    pub async fn start(status: u16, to: &str) -> Redirector {
        let to = to.trim_end_matches('/').to_string();
        let (url, task) = serve(move |request| {
            let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
            Response::builder()
                .status(status)
                .header("location", format!("{to}{path}"))
                .body(Full::new(Bytes::new()))
                .unwrap()
        })
        .await;
        Redirector { url, task }
    }
}

impl Drop for Redirector {
    fn drop(&mut self) {
        self.task.abort();
    }
}
