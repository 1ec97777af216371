//! Throwaway certificates for tests, made by `openssl` with EC keys (quick to generate) and
//! valid two days: a CA, and certificates it signs for a server or a client.
#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

use std::path::Path;
use std::process::{Command, Stdio};

fn openssl(dir: &Path, args: &[&str]) {
    let output =
        Command::new("openssl").args(args).current_dir(dir).stdin(Stdio::null()).output().unwrap_or_else(|e| {
            panic!("cannot run openssl ({e}): run scripts/install-test-deps (as root) to install it")
        });
    assert!(output.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
}

const EC_KEY: [&str; 5] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

/// A self-signed CA in `dir`: its key in `key`, its certificate in `cert` (file names).
pub fn make_ca(dir: &Path, key: &str, cert: &str, common_name: &str) {
    let subject = format!("/CN={common_name}");
    openssl(
        dir,
        &[&["req", "-x509"][..], &EC_KEY[..], &["-keyout", key, "-out", cert, "-days", "2", "-subj", &subject]]
            .concat(),
    );
}

/// A certificate signed by the CA in `ca_key`/`ca_cert`, in `key`/`cert`, for `usage`
/// (`serverAuth` or `clientAuth`) with the extra extension lines in `extensions` (e.g. a
/// `subjectAltName=...` line). The request and extension files go beside it.
pub fn sign(
    dir: &Path,
    (ca_key, ca_cert): (&str, &str),
    (key, cert): (&str, &str),
    common_name: &str,
    usage: &str,
    extensions: &str,
) {
    let (csr, ext) = (format!("{cert}.csr"), format!("{cert}.ext"));
    std::fs::write(
        dir.join(&ext),
        format!("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage={usage}\n{extensions}"),
    )
    .expect("write the extension file");
    let subject = format!("/CN={common_name}");
    openssl(dir, &[&["req"][..], &EC_KEY[..], &["-keyout", key, "-out", &csr, "-subj", &subject]].concat());
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            ca_cert,
            "-CAkey",
            ca_key,
            "-set_serial",
            "2",
            "-days",
            "2",
            "-out",
            cert,
            "-extfile",
            &ext,
        ],
    );
}
