//! The declared minimum Rust version (`rust-version` in Cargo.toml) against Cargo.lock: no
//! locked dependency may declare a newer one. Only 1.95.0 can be installed here, so building
//! with the declared version is not possible; this and clippy's `incompatible_msrv` (which
//! checks our own use of the standard library against `rust-version`) are what is checked.
//! README ("Toolchain and MSRV") says what is not.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

use std::process::Command;

use serde_json::Value;

/// `1.89`, `1.89.0`: compared as (major, minor, patch), a missing part being 0.
fn version(text: &str) -> (u64, u64, u64) {
    let mut parts = text.split('.').map(|part| part.parse::<u64>().unwrap_or_else(|_| panic!("rust-version {text:?}")));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

#[test]
fn no_locked_dependency_needs_a_newer_rust_than_we_declare() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Every package of the lock file, for every platform and with the dev-dependencies: a
    // build of the tests on the declared version needs them too.
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(output.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata JSON");
    let ours = env!("CARGO_PKG_RUST_VERSION");
    assert!(!ours.is_empty(), "Cargo.toml declares no rust-version");

    let mut newer: Vec<String> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|package| {
            let needs = package["rust_version"].as_str()?;
            let (name, at) = (package["name"].as_str()?, package["version"].as_str()?);
            (version(needs) > version(ours)).then(|| format!("{name} {at} needs {needs}"))
        })
        .collect();
    newer.sort();
    assert!(newer.is_empty(), "rust-version is {ours}, but Cargo.lock has:\n{}", newer.join("\n"));
}
