//! HTTP/1.1 by hand, for tests that must choose the client's address or see exactly what the
//! listener does with a connection (an HTTP client library would pool, retry and hide it).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connects to `address` from the loopback address `from` (127.0.0.0/8 is all this machine's),
/// so that one test can play several peers.
pub async fn connect_from(from: &str, address: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(format!("{from}:0").parse().expect("an IPv4 address")).expect("bind the client's address");
    socket.connect(address).await.expect("connect")
}

/// Sends one `GET` and reads until the server closes: what it answered ("" for nothing, or what
/// came before 20 s passed with the connection still open).
pub async fn ask(mut stream: TcpStream, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let _ = stream.write_all(request.as_bytes()).await;
    let mut read = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut read)).await;
    String::from_utf8_lossy(&read).into_owned()
}
