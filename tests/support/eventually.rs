//! `eventually!(within, what, body)`: evaluates `body` (an expression that may `.await`, giving
//! `Result<T, String>`) every 50 ms until it is `Ok`, for at most `within`; panics with the last
//! error otherwise. For what a real API server or daemon does asynchronously.
//!
//! ```ignore
//! #[macro_use]
//! #[path = "support/eventually.rs"]
//! mod eventually;
//! ```

macro_rules! eventually {
    ($within:expr, $what:expr, $body:expr) => {{
        let deadline = tokio::time::Instant::now() + $within;
        loop {
            match $body {
                Ok(value) => break value,
                Err(last) if tokio::time::Instant::now() >= deadline => {
                    panic!("{}: not within {:?}; last: {}", $what, $within, last)
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    }};
}
