//! A replica recommender on a free loopback port, for tests/recommender.rs and tests/daemon.rs:
//! it answers every POST with the status, body and delay the test sets, and records each
//! request (method, content type, JSON body).
#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What the fake recommender answers: status, body, and how long it waits first; and a
/// `Location` header, for a redirect.
#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    pub delay: Duration,
    pub location: Option<String>,
}

/// A recommender on a free loopback port that records each request (method, content type, body)
/// and, apart, its `Authorization` header.
pub struct FakeRecommender {
    pub url: String,
    answer: Arc<Mutex<Answer>>,
    requests: Arc<Mutex<Vec<(String, String, Value)>>>,
    authorizations: Arc<Mutex<Vec<Option<String>>>>,
    task: JoinHandle<()>,
}

impl FakeRecommender {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/recommend", listener.local_addr().expect("address"));
        let answer = Arc::new(Mutex::new(Answer {
            status: 200,
            body: reply(7, Some((6, 9))),
            delay: Duration::ZERO,
            location: None,
        }));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let authorizations = Arc::new(Mutex::new(Vec::new()));
        let (a, r, z) = (Arc::clone(&answer), Arc::clone(&requests), Arc::clone(&authorizations));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (answer, requests, authorizations) = (Arc::clone(&a), Arc::clone(&r), Arc::clone(&z));
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (answer, requests, authorizations) =
                            (Arc::clone(&answer), Arc::clone(&requests), Arc::clone(&authorizations));
                        async move {
                            let method = req.method().to_string();
                            let authorization =
                                req.headers().get("authorization").and_then(|v| v.to_str().ok()).map(String::from);
                            authorizations.lock().unwrap().push(authorization);
                            let content_type = req
                                .headers()
                                .get("content-type")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_string();
                            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            requests.lock().unwrap().push((method, content_type, body));
                            let answer = answer.lock().unwrap().clone();
                            tokio::time::sleep(answer.delay).await;
                            let mut response = Response::new(Full::new(Bytes::from(answer.body)));
                            *response.status_mut() = hyper::StatusCode::from_u16(answer.status).unwrap();
                            if let Some(location) = answer.location {
                                response.headers_mut().insert("location", location.parse().unwrap());
                            }
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        FakeRecommender { url, answer, requests, authorizations, task }
    }

    pub fn answer(&self, status: u16, body: impl Into<String>, delay: Duration) {
        *self.answer.lock().unwrap() = Answer { status, body: body.into(), delay, location: None };
    }

    /// Answers every request with a redirect (`status`, e.g. 307) to `location`.
    pub fn redirect(&self, status: u16, location: &str) {
        *self.answer.lock().unwrap() =
            Answer { status, body: String::new(), delay: Duration::ZERO, location: Some(location.to_string()) };
    }

    pub fn requests(&self) -> Vec<(String, String, Value)> {
        self.requests.lock().unwrap().clone()
    }

    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.authorizations.lock().unwrap().clone()
    }
}

impl Drop for FakeRecommender {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A `WorkloadRecommendationReply` in protobuf JSON.
pub fn reply(replicas: u32, bounds: Option<(u32, u32)>) -> String {
    let mut reply = json!({
        "timestamp": "2024-05-01T12:00:00Z",
        "targetReplicas": replicas,
        "observedTargets": [{"type": "cpu", "targetValue": 0.73}],
        "reason": "test"
    });
    if let Some((lower, upper)) = bounds {
        reply["lowerBoundReplicas"] = json!(lower);
        reply["upperBoundReplicas"] = json!(upper);
    }
    reply.to_string()
}
