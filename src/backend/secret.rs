//! Secrets (API keys, passwords, tokens): read from the environment or a file, never printed.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::rules::SecretSource;

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
}
