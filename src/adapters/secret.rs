//! Secrets (API keys, passwords, tokens): read from the environment or a file, never printed.
//! The backends' credentials and the status API's token are both read here, so neither needs
//! the other's module.
//!
//! # Rotation
//! A secret from a file is a `RotatingSecret`: Kubernetes rewrites a mounted Secret in place (a
//! `..data` symlink swap) and a host's tooling replaces the file, so the file is looked at again
//! (`stat`: its inode, size and modification time) at most every `CHECK_EVERY`, and read again
//! when that changed. The look happens on tokio's blocking pool, never on the async worker that
//! sends the request, and the request that triggered it waits for it, so a rotated key is sent
//! from the first request after the check. A changed file that cannot be read, or is empty
//! (mid-rotation, removed), keeps the last good value, with one warning per change: the
//! server's refusal, if it comes, says more than we can. A secret from the environment is read
//! once: a process's environment does not change. The interval is on tokio's clock, so tests
//! with a paused clock step over it.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::rules::SecretSource;

/// A secret value. `Debug` and `Display` print `[redacted]`, so it cannot leak through a log
/// line, an error or a panic message by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that needs it: the request header being built.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Why a secret could not be read. Names where it was looked for, never what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("environment variable {0} is not set")]
    EnvMissing(String),
    #[error("environment variable {0} is empty")]
    EnvEmpty(String),
    #[error("cannot read secret file {}: {reason}", path.display())]
    FileUnreadable { path: PathBuf, reason: String },
    #[error("secret file {} is empty", .0.display())]
    FileEmpty(PathBuf),
}

impl SecretSource {
    /// Reads the secret now. Surrounding whitespace (a trailing newline in a file) is dropped.
    pub fn load(&self) -> Result<Secret, SecretError> {
        match self {
            SecretSource::Env(name) => {
                let value = std::env::var(name).map_err(|_| SecretError::EnvMissing(name.clone()))?;
                let value = value.trim();
                if value.is_empty() {
                    return Err(SecretError::EnvEmpty(name.clone()));
                }
                Ok(Secret(value.to_string()))
            }
            SecretSource::File(path) => read_secret_file(path),
        }
    }
}

pub(crate) fn read_secret_file(path: &Path) -> Result<Secret, SecretError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| SecretError::FileUnreadable { path: path.to_path_buf(), reason: e.kind().to_string() })?;
    let value = text.trim();
    if value.is_empty() {
        return Err(SecretError::FileEmpty(path.to_path_buf()));
    }
    Ok(Secret(value.to_string()))
}

/// How often a secret file is looked at for a change, at most.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What identifies a file's content without reading it: its device and inode, size and
/// modification time. `metadata` follows symlinks, so a swapped `..data` link (a Secret or
/// ConfigMap volume) or a file renamed over the old one is a new inode. The rules file's watch
/// uses it too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    device: u64,
    inode: u64,
    len: u64,
    modified_nanos: i128,
}

impl FileStamp {
    /// `None` when the file cannot be looked at (missing, mid-swap).
    pub fn of(path: &Path) -> Option<FileStamp> {
        let meta = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            device: meta.dev(),
            inode: meta.ino(),
            len: meta.len(),
            modified_nanos: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        })
    }
}

/// A secret that follows its file (see "Rotation" above).
#[derive(Clone, Debug)]
pub struct RotatingSecret {
    inner: Rotating,
}

#[derive(Clone, Debug)]
enum Rotating {
    Fixed(Secret),
    File { path: PathBuf, check_every: Duration, cached: Arc<Mutex<Cached>> },
}

#[derive(Debug)]
struct Cached {
    value: Secret,
    /// The file as it was when `value` was read.
    stamp: Option<FileStamp>,
    /// The change that could not be read, so it is warned about once, not at every check.
    unreadable: Option<FileStamp>,
    /// When the file was last looked at (or a look was started).
    checked: Instant,
}

fn lock(cached: &Mutex<Cached>) -> MutexGuard<'_, Cached> {
    // A poisoned lock only means a check panicked; the cached value is still whole.
    cached.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RotatingSecret {
    /// Reads the secret now (a blocking read: for building a client, not for a request).
    pub fn load(source: &SecretSource) -> Result<Self, SecretError> {
        Self::load_checking_every(source, CHECK_EVERY)
    }

    fn load_checking_every(source: &SecretSource, check_every: Duration) -> Result<Self, SecretError> {
        let inner = match source {
            SecretSource::Env(_) => Rotating::Fixed(source.load()?),
            SecretSource::File(path) => {
                // Stamp first, then read: if the file changes in between, the next check sees
                // a newer stamp and reads again, so a rotation is never missed.
                let stamp = FileStamp::of(path);
                let value = read_secret_file(path)?;
                let cached = Cached { value, stamp, unreadable: None, checked: Instant::now() };
                Rotating::File { path: path.clone(), check_every, cached: Arc::new(Mutex::new(cached)) }
            }
        };
        Ok(RotatingSecret { inner })
    }

    /// The value as last read, without looking at the file: for scrubbing texts.
    pub fn cached(&self) -> Secret {
        match &self.inner {
            Rotating::Fixed(value) => value.clone(),
            Rotating::File { cached, .. } => lock(cached).value.clone(),
        }
    }

    /// The value to send now: the file is looked at first when the last look is older than
    /// the check interval.
    pub async fn current(&self) -> Secret {
        let Rotating::File { path, check_every, cached } = &self.inner else { return self.cached() };
        {
            let mut state = lock(cached);
            if state.checked.elapsed() < *check_every {
                return state.value.clone();
            }
            // Claimed now, so that concurrent requests send the cached value instead of all
            // looking at the file.
            state.checked = Instant::now();
        }
        let (path, shared) = (path.clone(), Arc::clone(cached));
        // The update happens inside the blocking task, so it lands even if this request is
        // cancelled meanwhile; a failed task leaves the cached value.
        let _ = tokio::task::spawn_blocking(move || refresh(&path, &shared)).await;
        self.cached()
    }
}

/// Reads the file again if it changed since the cached value was read.
fn refresh(path: &Path, cached: &Mutex<Cached>) {
    let now = FileStamp::of(path);
    let known = lock(cached).stamp;
    if now.is_none() || now == known {
        return;
    }
    let read = read_secret_file(path);
    let mut state = lock(cached);
    match read {
        Ok(value) => {
            tracing::info!(path = %path.display(), "secret file changed: read again");
            state.value = value;
            state.stamp = now;
            state.unreadable = None;
        }
        Err(error) => {
            if state.unreadable != now {
                tracing::warn!(%error, "secret file changed but cannot be read: keeping the previous value");
                state.unreadable = now;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints() {
        let s = Secret("hunter2".into());
        assert_eq!(format!("{s} {s:?}"), "[redacted] [redacted]");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn file_secrets_are_trimmed_and_errors_name_only_the_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "  abc123\n").unwrap();
        assert_eq!(SecretSource::File(path.clone()).load().unwrap().expose(), "abc123");
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(SecretSource::File(path.clone()).load(), Err(SecretError::FileEmpty(path)));
        let missing = SecretSource::Env("WATERMARKD_TEST_SURELY_UNSET_VARIABLE".into()).load().unwrap_err();
        assert_eq!(missing.to_string(), "environment variable WATERMARKD_TEST_SURELY_UNSET_VARIABLE is not set");
    }

    #[tokio::test]
    async fn a_secret_file_is_read_again_only_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "token-A\n").unwrap();
        let secret = RotatingSecret::load_checking_every(&SecretSource::File(path.clone()), Duration::ZERO).unwrap();
        assert_eq!(secret.current().await.expose(), "token-A");

        let set_mtime = |secs: u64| {
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(secs)).unwrap();
        };
        std::fs::write(&path, "token-B\n").unwrap();
        set_mtime(1_000);
        assert_eq!(secret.current().await.expose(), "token-B");
        assert_eq!(secret.cached().expose(), "token-B");

        // Same inode, size and modification time: not read again.
        std::fs::write(&path, "token-C\n").unwrap();
        set_mtime(1_000);
        assert_eq!(secret.current().await.expose(), "token-B");
        set_mtime(2_000);
        assert_eq!(secret.current().await.expose(), "token-C");

        // Replaced by rename (a new inode), with the same size and time: read again.
        let staged = dir.path().join("token.new");
        std::fs::write(&staged, "token-D\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&staged)
            .unwrap()
            .set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(2_000))
            .unwrap();
        std::fs::rename(&staged, &path).unwrap();
        assert_eq!(secret.current().await.expose(), "token-D");

        // Removed or emptied mid-rotation: the last good value stays.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(secret.current().await.expose(), "token-D");
        std::fs::write(&path, "  \n").unwrap();
        assert_eq!(secret.current().await.expose(), "token-D");
        std::fs::write(&path, "token-E").unwrap();
        assert_eq!(secret.current().await.expose(), "token-E");
    }

    #[tokio::test]
    async fn the_file_is_looked_at_at_most_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "old").unwrap();
        let secret =
            RotatingSecret::load_checking_every(&SecretSource::File(path.clone()), Duration::from_secs(3600)).unwrap();
        std::fs::write(&path, "newer").unwrap();
        assert_eq!(secret.current().await.expose(), "old", "checked at load, not again within the interval");
    }
}
