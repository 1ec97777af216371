//! systemd's notify protocol (`Type=notify`), spoken directly: one datagram per state change to
//! `$NOTIFY_SOCKET`. Without the variable (not under systemd) every call does nothing.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

pub struct Notifier {
    socket: Option<(UnixDatagram, String)>,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        std::env::var("NOTIFY_SOCKET")
            .ok()
            .filter(|path| !path.is_empty())
            .and_then(|path| Notifier::to_socket(&path).ok())
            .unwrap_or(Notifier { socket: None })
    }

    /// A notifier that sends to `path` (what `$NOTIFY_SOCKET` would name).
    pub fn to_socket(path: &str) -> std::io::Result<Notifier> {
        Ok(Notifier { socket: Some((UnixDatagram::unbound()?, path.to_string())) })
    }

    /// Sends `state` (e.g. `READY=1`); failures are logged, never fatal.
    pub fn notify(&self, state: &str) {
        let Some((socket, path)) = &self.socket else { return };
        let sent = match path.strip_prefix('@') {
            Some(name) => abstract_address(name).and_then(|address| socket.send_to_addr(state.as_bytes(), &address)),
            None => socket.send_to(state.as_bytes(), path),
        };
        if let Err(err) = sent {
            tracing::warn!(error = %err, state, "could not notify systemd");
        }
    }

    pub fn ready(&self) {
        self.notify("READY=1\nSTATUS=running");
    }

    /// Before a reload: systemd waits for the READY=1 that follows it.
    pub fn reloading(&self) {
        self.notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
    }

    pub fn stopping(&self) {
        self.notify("STOPPING=1\nSTATUS=stopping");
    }

    pub fn watchdog(&self) {
        self.notify("WATCHDOG=1");
    }

    /// How often to ping the watchdog: half the `WatchdogSec` systemd set for this process.
    pub fn watchdog_interval() -> Option<Duration> {
        if let Ok(pid) = std::env::var("WATCHDOG_PID") {
            if pid.trim() != std::process::id().to_string() {
                return None;
            }
        }
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok()?;
        (usec > 0).then(|| Duration::from_micros(usec / 2))
    }
}

fn abstract_address(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

/// `CLOCK_MONOTONIC` in microseconds, which RELOADING=1 carries so systemd can tell this
/// reload's notification from an older one.
fn monotonic_usec() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only the timespec it is given, a valid exclusive borrow of a
    // local that outlives the call; CLOCK_MONOTONIC exists on every Linux.
    #[expect(unsafe_code, reason = "std has no CLOCK_MONOTONIC reading in microseconds for RELOADING=1")]
    let result = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if result != 0 {
        return 0;
    }
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000).saturating_add(nanos / 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_datagrams_to_the_notify_socket() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).expect("bind");
        let notifier =
            Notifier { socket: Some((UnixDatagram::unbound().expect("socket"), path.display().to_string())) };
        notifier.ready();
        let mut buffer = [0u8; 256];
        let n = listener.recv(&mut buffer).expect("datagram");
        assert_eq!(&buffer[..n], b"READY=1\nSTATUS=running");
        notifier.reloading();
        let n = listener.recv(&mut buffer).expect("datagram");
        assert!(std::str::from_utf8(&buffer[..n]).expect("utf-8").starts_with("RELOADING=1\nMONOTONIC_USEC="));
    }

    #[test]
    fn does_nothing_outside_systemd() {
        Notifier { socket: None }.ready();
    }
}
