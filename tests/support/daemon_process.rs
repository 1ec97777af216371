//! `watermarkd run` as a separate process, the way it is deployed: its own flags, environment
//! and listen port; its log in a file the test can read; stopped with a signal of the test's
//! choice (SIGTERM, SIGKILL, SIGHUP for a reload).
#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

use std::io::Read;
use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct DaemonProcess {
    child: Option<Child>,
    pub listen: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("address").port()
}

impl DaemonProcess {
    /// Starts `watermarkd run ARGS --listen 127.0.0.1:PORT` with `env` added to the environment.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> DaemonProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("watermarkd.log");
        let listen = format!("127.0.0.1:{}", free_port());
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_watermarkd"));
        command
            .arg("run")
            .args(args)
            .args(["--listen", &listen, "--settings", "/dev/null"])
            .env_remove("KUBECONFIG")
            .env_remove("NOTIFY_SOCKET")
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log file"))
            .stderr(log_file);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().expect("start watermarkd run");
        DaemonProcess { child: Some(child), listen, log, _dir: dir }
    }

    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill takes plain integers and touches no memory of ours.
        #[expect(unsafe_code, reason = "std's Child can only SIGKILL; the tests send SIGHUP and SIGTERM")]
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }

    pub fn hangup(&self) {
        self.signal(libc::SIGHUP);
    }

    /// SIGKILL: no shutdown code runs, as after a crash or `kill -9`.
    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the exit (at most `within`); returns whether it exited 0.
    pub fn terminate(&mut self, within: Duration) -> bool {
        self.signal(libc::SIGTERM);
        let Some(mut child) = self.child.take() else { return false };
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    pub async fn get(&self, path: &str) -> Result<(u16, String), String> {
        let url = format!("http://{}{path}", self.listen);
        let response = reqwest::get(&url).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response.text().await.map_err(|e| e.to_string())?;
        Ok((status, body))
    }

    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.map(|(_, body)| body).unwrap_or_default()
    }

    /// Waits until `/readyz` answers 200, panicking with the log otherwise.
    pub async fn wait_ready(&mut self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                panic!("watermarkd exited with {status} before it was ready; log:\n{}", self.log());
            }
            if let Ok((200, _)) = self.get("/readyz").await {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                let readyz = self.get("/readyz").await;
                panic!("watermarkd not ready within {within:?} ({readyz:?}); log:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of the first sample of `series` whose labels contain every `labels` pair.
    pub async fn sample(&self, series: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let text = self.metrics().await;
        sample_in(&text, series, labels)
    }
}

/// Reads one sample out of Prometheus text.
pub fn sample_in(text: &str, series: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (name_and_labels, value) = line.rsplit_once(' ')?;
        let (name, rest) = match name_and_labels.split_once('{') {
            Some((name, rest)) => (name, rest),
            None => (name_and_labels, ""),
        };
        if name != series {
            return None;
        }
        let all = labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        if all {
            value.parse().ok()
        } else {
            None
        }
    })
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- watermarkd log ({}) ---\n{}", self.listen, self.log());
        }
    }
}

pub fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
