//! Reading an answer's body within its backend's memory budget.
//!
//! An answer is read whole before it is parsed: a part of a JSON body is no answer. So what
//! bounds a backend's memory is how many large bodies it holds at once, not how many requests it
//! has in flight: eight Prometheus answers at the 16 MiB cap are 128 MiB before any parsing, in
//! a pod whose limit is 256 MiB. Each backend therefore has a budget of bytes the size of one
//! body cap ([`BodyBudget`]), shared by its requests. A body is read under a reservation of
//! [`SMALL_BODY_BYTES`], which every ordinary answer fits; one that grows past it (or announces
//! more in its `Content-Length`) gives its reservation back, waits until it can hold the whole
//! budget, and holds it until it has been parsed. Ordinary answers are read side by side, large
//! ones one after the other: a backend holds at most one large body at a time, with what parsing
//! it makes.
//!
//! Waiting never holds bytes of the budget (a body about to grow lets go of its reservation
//! first), so two bodies can never wait for each other; and waiting counts against the
//! request's own timeout.

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// Every ordinary answer fits: a Datadog batch of 35 queries over five minutes is a few hundred
/// kilobytes, and an instant query's answer one sample per series.
pub const SMALL_BODY_BYTES: usize = 1024 * 1024;

/// The bytes of answer bodies one backend may hold at once: one body cap.
pub struct BodyBudget {
    bytes: Semaphore,
    /// The largest body read, and the whole budget.
    cap: usize,
}

/// A body read whole, holding its share of the budget until it is dropped.
pub struct Body<'a> {
    pub bytes: Vec<u8>,
    _held: SemaphorePermit<'a>,
}

/// Why a body was not read.
#[derive(Debug)]
pub enum BodyError {
    /// Larger than the cap: not read beyond it.
    TooLarge,
    /// The connection failed while the body was read.
    Transport(reqwest::Error),
    /// The request's time ran out while it waited for its share of the budget.
    TimedOut,
}

impl BodyBudget {
    /// A budget of `cap` bytes, which is also the largest body read.
    pub fn new(cap: usize) -> Self {
        let cap = cap.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        BodyBudget { bytes: Semaphore::new(cap), cap }
    }

    /// Reads `response`'s body whole, by `until` at the latest for the time spent waiting for
    /// the budget (the response's own timeout bounds the reading).
    pub async fn read(&self, response: &mut reqwest::Response, until: Instant) -> Result<Body<'_>, BodyError> {
        let announced = response.content_length().map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        if announced.is_some_and(|n| n > self.cap) {
            return Err(BodyError::TooLarge);
        }
        let small = SMALL_BODY_BYTES.min(self.cap);
        let mut reserved = if announced.is_some_and(|n| n > small) { self.cap } else { small };
        let mut held = Some(self.hold(reserved, until).await?);
        let mut bytes = Vec::with_capacity(announced.unwrap_or(0));
        while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
            let len = bytes.len() + chunk.len();
            if len > self.cap {
                return Err(BodyError::TooLarge);
            }
            if len > reserved {
                // Let go first: a body waiting for the budget holds none of it.
                drop(held.take());
                held = Some(self.hold(self.cap, until).await?);
                reserved = self.cap;
                // Room for the largest body at once: pages are only resident once written, and
                // the body is never copied to grow.
                bytes.reserve_exact(self.cap.saturating_sub(bytes.len()));
            }
            bytes.extend_from_slice(&chunk);
        }
        match held {
            Some(held) => Ok(Body { bytes, _held: held }),
            // Held at every turn of the loop above.
            None => Err(BodyError::TimedOut),
        }
    }

    async fn hold(&self, bytes: usize, until: Instant) -> Result<SemaphorePermit<'_>, BodyError> {
        let permits = u32::try_from(bytes.min(self.cap)).unwrap_or(u32::MAX);
        match tokio::time::timeout_at(until, self.bytes.acquire_many(permits)).await {
            Ok(Ok(permit)) => Ok(permit),
            // Never closed; were it, there would be nothing to wait for.
            Ok(Err(_)) | Err(_) => Err(BodyError::TimedOut),
        }
    }

    /// Bytes of the budget not held now.
    #[cfg(test)]
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

/// When a request given `timeout` from now must be done.
pub fn until(timeout: Duration) -> Instant {
    crate::domain::instant::saturating_add(Instant::now(), timeout)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const MIB: usize = 1024 * 1024;

    /// A server answering `GET /N` with N bytes, chunked, or with a `Content-Length` for
    /// `GET /N?length`.
    async fn server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { continue };
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.ends_with(b"\r\n\r\n") {
                        let Ok(n @ 1..) = stream.read(&mut buf).await else { return };
                        request.extend_from_slice(&buf[..n]);
                    }
                    let line = String::from_utf8_lossy(&request).lines().next().unwrap_or_default().to_string();
                    let path = line.split(' ').nth(1).unwrap_or("/0");
                    let length = path.ends_with("?length");
                    let size: usize = path.trim_start_matches('/').trim_end_matches("?length").parse().unwrap();
                    let head = if length {
                        format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n")
                    } else {
                        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_string()
                    };
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = vec![b'x'; 64 * 1024];
                    let mut left = size;
                    while left > 0 {
                        let n = left.min(chunk.len());
                        let written = if length {
                            stream.write_all(&chunk[..n]).await
                        } else {
                            let mut framed = format!("{n:x}\r\n").into_bytes();
                            framed.extend_from_slice(&chunk[..n]);
                            framed.extend_from_slice(b"\r\n");
                            stream.write_all(&framed).await
                        };
                        if written.is_err() {
                            return;
                        }
                        left -= n;
                    }
                    if !length {
                        let _ = stream.write_all(b"0\r\n\r\n").await;
                    }
                });
            }
        });
        url
    }

    async fn get(url: &str, path: &str) -> reqwest::Response {
        crate::adapters::backend::ensure_crypto_provider();
        reqwest::Client::new().get(format!("{url}{path}")).send().await.unwrap()
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(300)
    }

    #[tokio::test]
    async fn one_large_body_at_a_time_and_small_ones_side_by_side() {
        let url = server().await;
        let budget = BodyBudget::new(4 * MIB);

        // A large body, chunked: it grows past its reservation and then holds the whole budget.
        let large = budget.read(&mut get(&url, &format!("/{}", 3 * MIB)).await, soon()).await.unwrap();
        assert_eq!(large.bytes.len(), 3 * MIB);
        assert_eq!(budget.available(), 0);
        // Another large one waits for it (here past its time), holding nothing while it waits.
        let mut waiting = get(&url, &format!("/{}?length", 3 * MIB)).await;
        assert!(matches!(budget.read(&mut waiting, soon()).await, Err(BodyError::TimedOut)));
        let mut small = get(&url, "/100").await;
        assert!(matches!(budget.read(&mut small, soon()).await, Err(BodyError::TimedOut)));
        assert_eq!(budget.available(), 0);
        drop(large);
        assert_eq!(budget.available(), 4 * MIB);
        let large = budget.read(&mut get(&url, &format!("/{}", 3 * MIB)).await, soon()).await.unwrap();
        assert_eq!(large.bytes.len(), 3 * MIB);
        drop(large);

        // Small bodies hold a small share each, side by side.
        let mut smalls = Vec::new();
        for size in [100, 1_000, SMALL_BODY_BYTES] {
            smalls.push(budget.read(&mut get(&url, &format!("/{size}")).await, soon()).await.unwrap());
        }
        assert_eq!(smalls.iter().map(|b| b.bytes.len()).collect::<Vec<_>>(), [100, 1_000, SMALL_BODY_BYTES]);
        assert_eq!(budget.available(), MIB);
        drop(smalls);

        // Past the cap: refused, as soon as it says so or once it passes it.
        let mut announced = get(&url, &format!("/{}?length", 4 * MIB + 1)).await;
        assert!(matches!(budget.read(&mut announced, soon()).await, Err(BodyError::TooLarge)));
        let mut chunked = get(&url, &format!("/{}", 4 * MIB + 1)).await;
        assert!(matches!(budget.read(&mut chunked, soon()).await, Err(BodyError::TooLarge)));
        assert_eq!(budget.available(), 4 * MIB);
        let exact = budget.read(&mut get(&url, &format!("/{}?length", 4 * MIB)).await, soon()).await.unwrap();
        assert_eq!(exact.bytes.len(), 4 * MIB);
    }
}
