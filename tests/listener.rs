//! The `/metrics`, `/healthz` and `/readyz` listener over real TCP on 127.0.0.1, with small
//! limits: a client that sends no headers, or trickles them, is cut off; a connection is closed
//! after its lifetime however busy; one peer cannot hold more than its share while another
//! still gets in; past the cap the probe reserve still answers the probes, beyond it
//! connections are closed at once, and `/healthz` answers again once the ones holding the
//! slots are gone.
//!
//! The waits below are upper bounds on a loaded machine, never measured: each test fails by
//! waiting for something that, without the limits, never happens.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[path = "support/raw_http.rs"]
mod raw_http;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use raw_http::{ask, connect_from};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use watermarkd::adapters::health::{self, Readiness};
use watermarkd::adapters::listener::{serve, ListenerLimits};
use watermarkd::adapters::telemetry::{self, AutoscalerMetrics, LabelsAsTags};
use watermarkd::domain::outcome::Ledger;

/// Longer than any limit used here: what "never" means in these tests.
const NEVER: Duration = Duration::from_secs(20);

struct Listener {
    address: SocketAddr,
    _stop: DropGuard,
}

async fn listen(limits: ListenerLimits) -> Listener {
    let stop = CancellationToken::new();
    let readiness = Arc::new(Readiness::default());
    readiness.rules_loaded.store(true, Ordering::Relaxed);
    let series = AutoscalerMetrics::new(Arc::new(Ledger::new(Duration::ZERO)), LabelsAsTags::default());
    let routes = telemetry::routes(prometheus::Registry::new(), Arc::new(series)).merge(health::routes(readiness));
    let (address, _task) = serve("127.0.0.1:0".parse().unwrap(), limits, routes, stop.clone()).await.expect("bind");
    Listener { address, _stop: stop.drop_guard() }
}

/// Reads until the server closes the connection (or resets it); `None` if it stays open for
/// `NEVER`. Returns what was read.
async fn closed_by_server(stream: &mut TcpStream) -> Option<String> {
    let mut read = Vec::new();
    let outcome = tokio::time::timeout(NEVER, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    outcome.ok().map(|()| String::from_utf8_lossy(&read).to_string())
}

async fn healthz(address: SocketAddr) -> String {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("send");
    closed_by_server(&mut stream).await.expect("the answer ends")
}

#[tokio::test]
async fn a_client_that_sends_no_headers_or_trickles_them_is_cut_off() {
    let limits = ListenerLimits {
        max_connections: 8,
        max_connections_per_peer: 8,
        probe_reserve: 0,
        header_timeout: Duration::from_millis(300),
        connection_timeout: Duration::from_secs(10),
    };
    let listener = listen(limits).await;

    let mut silent = TcpStream::connect(listener.address).await.expect("connect");
    let read = closed_by_server(&mut silent).await;
    assert!(read.is_some(), "a connection that never sent a byte is still open after {NEVER:?}");

    // Slow loris: a byte every 50 ms, each in time, the whole never done.
    let mut trickling = TcpStream::connect(listener.address).await.expect("connect");
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: ".iter().chain(std::iter::repeat(&b'a'));
    let mut cut_off = false;
    for byte in request.take(usize::try_from(NEVER.as_millis() / 50).unwrap()) {
        if trickling.write_all(&[*byte]).await.is_err() {
            cut_off = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(cut_off, "a client trickling its headers is still connected after {NEVER:?}");

    assert!(healthz(listener.address).await.starts_with("HTTP/1.1 200"), "a prompt client is answered");
}

#[tokio::test]
async fn a_busy_connection_is_closed_after_its_lifetime() {
    let limits = ListenerLimits {
        max_connections: 8,
        max_connections_per_peer: 8,
        probe_reserve: 0,
        header_timeout: Duration::from_millis(500),
        connection_timeout: Duration::from_secs(1),
    };
    let listener = listen(limits).await;
    let mut stream = TcpStream::connect(listener.address).await.expect("connect");
    let mut answered = 0;
    let mut buffer = [0u8; 4096];
    let closed = tokio::time::timeout(NEVER, async {
        loop {
            // Keep-alive requests, each in time: only the lifetime can end this.
            if stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.is_err() {
                return;
            }
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => answered += 1,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "a keep-alive connection is still open after {NEVER:?}");
    assert!(answered >= 1, "its requests were answered until then");
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_and_healthz_answers_once_they_are_gone() {
    let limits = ListenerLimits {
        max_connections: 3,
        max_connections_per_peer: 8,
        probe_reserve: 0,
        header_timeout: Duration::from_secs(3),
        connection_timeout: Duration::from_secs(6),
    };
    let listener = listen(limits).await;
    let mut holding = Vec::new();
    for _ in 0..3 {
        holding.push(TcpStream::connect(listener.address).await.expect("connect"));
    }
    // Accepted in order after the three: no slot left, so it is closed without an answer.
    let mut beyond = TcpStream::connect(listener.address).await.expect("connect");
    let _ = beyond.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    let answer = closed_by_server(&mut beyond).await.expect("closed, not left waiting");
    assert!(answer.is_empty(), "the connection beyond the cap was answered: {answer}");

    // The three send nothing: their header timeout frees the slots.
    for stream in &mut holding {
        assert!(closed_by_server(stream).await.is_some(), "a slot is held for good");
    }
    let answer = healthz(listener.address).await;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok\n"), "{answer}");
}

#[tokio::test]
async fn one_peer_holding_its_share_leaves_the_listener_to_the_others() {
    let limits = ListenerLimits {
        max_connections: 16,
        max_connections_per_peer: 4,
        probe_reserve: 0,
        header_timeout: Duration::from_secs(10),
        connection_timeout: Duration::from_secs(15),
    };
    let listener = listen(limits).await;
    // A client opening idle sockets as fast as it can: it keeps four.
    let mut greedy = Vec::new();
    for _ in 0..4 {
        greedy.push(connect_from("127.0.0.2", listener.address).await);
    }
    let fifth = connect_from("127.0.0.2", listener.address).await;
    assert_eq!(ask(fifth, "/healthz").await, "", "a fifth connection of the same peer is closed unanswered");
    // Another peer (a kubelet, a scraper) is answered while the greedy one holds its four.
    let probe = ask(connect_from("127.0.0.3", listener.address).await, "/healthz").await;
    assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");
}

#[tokio::test]
async fn past_the_cap_the_reserve_answers_probes_and_the_scrape_only() {
    let limits = ListenerLimits {
        max_connections: 4,
        max_connections_per_peer: 2,
        probe_reserve: 2,
        header_timeout: Duration::from_secs(10),
        connection_timeout: Duration::from_secs(15),
    };
    let listener = listen(limits).await;
    // Two clients hold every general slot, idle.
    let mut holding = Vec::new();
    for from in ["127.0.0.4", "127.0.0.4", "127.0.0.5", "127.0.0.5"] {
        holding.push(connect_from(from, listener.address).await);
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let answer = ask(connect_from("127.0.0.6", listener.address).await, path).await;
        // `/readyz` says 503 "not ready" here (the test's daemon has no caches): answered all
        // the same, by the probe, not refused by the listener.
        let answered = answer.starts_with("HTTP/1.1 200") || answer.contains("not ready: caches not synced");
        assert!(answered, "{path} from the reserve: {answer}");
    }
    // A reserve connection that sends nothing is cut off quickly, long before the header
    // timeout of 10 s a general one gets.
    let mut silent = connect_from("127.0.0.7", listener.address).await;
    let cut = tokio::time::timeout(Duration::from_secs(8), closed_by_server(&mut silent)).await;
    assert!(cut.is_ok(), "a silent reserve connection is held like a general one");
    // The reserve takes two per peer: a third at once is closed unanswered.
    let one = connect_from("127.0.0.8", listener.address).await;
    let two = connect_from("127.0.0.8", listener.address).await;
    let three = connect_from("127.0.0.8", listener.address).await;
    assert_eq!(ask(three, "/healthz").await, "");
    assert!(ask(one, "/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(ask(two, "/healthz").await.starts_with("HTTP/1.1 200"));
}
