//! The Debian package that scripts/build-deb makes, built here from the test binary: what it
//! holds (the stripped binary, the unit and snippets of systemd/, the samples of
//! packaging/etc/watermarkd as conffiles, man pages, completions), and what happens when dpkg
//! installs it for real, maintainer scripts included, into a scratch root (`dpkg --root` with
//! chrootless scripts, which then act on that root through DPKG_ROOT): the user and the modes of
//! /etc/watermarkd, `systemd-analyze verify` of the installed unit against the installed binary,
//! the installed binary running, and conffiles surviving a reinstall and a removal until a purge.
//!
//! The scratch root's dpkg database holds this machine's records of the packages the package
//! depends on, so dpkg checks the Depends line for real rather than being told to ignore it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[path = "support/dist_build.rs"]
mod dist_build;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use dist_build::{binary, debug_sections, is_root, output, printed, repo, run, script};

const CONFFILES: [&str; 3] =
    ["/etc/watermarkd/rules.toml", "/etc/watermarkd/watermarkd.env", "/etc/watermarkd/watermarkd.toml"];

/// One package per test process.
fn package() -> &'static Path {
    static BUILT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let printed = run(script("build-deb")
            .arg("--binary")
            .arg(binary())
            .arg("--out")
            .arg(dir.path())
            .args(["--compression", "gzip"]));
        let path = PathBuf::from(printed.lines().last().expect("the package path").trim());
        assert!(path.is_file(), "build-deb printed {path:?}, which is not a file");
        (dir, path)
    });
    path
}

fn field(name: &str) -> String {
    run(Command::new("dpkg-deb").arg("--field").arg(package()).arg(name)).trim().to_string()
}

/// The package unpacked (without running anything) into a temporary directory.
fn unpacked() -> &'static Path {
    static UNPACKED: OnceLock<tempfile::TempDir> = OnceLock::new();
    UNPACKED
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("temp dir");
            run(Command::new("dpkg-deb").arg("--raw-extract").arg(package()).arg(dir.path()));
            dir
        })
        .path()
}

/// A root with an empty filesystem and a dpkg database that knows this machine's libc6,
/// libgcc-s1 and systemd as installed.
fn fresh_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("temp dir");
    let admin = root.path().join("var/lib/dpkg");
    std::fs::create_dir_all(admin.join("info")).expect("mkdir");
    std::fs::create_dir_all(admin.join("updates")).expect("mkdir");
    std::fs::write(admin.join("available"), "").expect("available");
    let mut status = String::new();
    for package in ["libc6", "libgcc-s1", "systemd"] {
        let record = run(Command::new("dpkg-query").args(["--status", package]));
        // dpkg looks for each installed package's file list; an empty one says it owns nothing here.
        let list = if record.contains("\nMulti-Arch: same\n") {
            let arch = record.lines().find_map(|l| l.strip_prefix("Architecture: ")).expect("Architecture");
            format!("{package}:{arch}.list")
        } else {
            format!("{package}.list")
        };
        std::fs::write(admin.join("info").join(list), "").expect("file list");
        status.push_str(record.trim_end());
        status.push_str("\n\n");
    }
    std::fs::write(admin.join("status"), status).expect("status");
    root
}

fn dpkg(root: &Path) -> Command {
    let mut command = Command::new("dpkg");
    command.arg(format!("--root={}", root.display())).arg("--force-script-chrootless");
    command
}

fn install(root: &Path) -> String {
    let result = output(dpkg(root).arg("--install").arg(package()));
    let printed = printed(&result);
    assert!(result.status.success(), "dpkg --install ({}):\n{printed}", result.status);
    assert!(!printed.to_lowercase().contains("warning"), "dpkg --install warned:\n{printed}");
    printed
}

fn package_status(root: &Path) -> String {
    let result = output(dpkg(root).args(["--status", "watermarkd"]));
    String::from_utf8_lossy(&result.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Status: "))
        .unwrap_or("not known")
        .to_string()
}

/// `systemd-analyze verify` of `unit` with `options` (e.g. `--root`): whether it passed, and what
/// it printed.
fn analyze_verify(options: &[&str], unit: &str) -> (bool, String) {
    let verified = output(
        Command::new("systemd-analyze").args(options).args(["verify", "--man=no", unit]).env("SYSTEMD_LOG_COLOR", "0"),
    );
    (verified.status.success(), printed(&verified))
}

/// Installing changes owners (sysusers, tmpfiles): only root may. CI runs as root.
fn need_root(test: &str) -> bool {
    dist_build::root_or_skip(test, "so dpkg cannot install (it sets owners)")
}

#[test]
fn the_control_fields_name_the_version_the_architecture_and_the_libraries() {
    assert_eq!(field("Package"), "watermarkd");
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(field("Architecture"), run(Command::new("dpkg").arg("--print-architecture")).trim());
    let depends = field("Depends");
    // From dpkg-shlibdeps: the libraries the binary loads, with the versions its symbols need.
    assert!(depends.contains("libc6 (>= 2."), "Depends: {depends}");
    assert!(depends.contains("libgcc-s1"), "Depends: {depends}");
    assert!(depends.contains("systemd | systemd-standalone-sysusers"), "Depends: {depends}");
    let size: u64 = field("Installed-Size").parse().expect("Installed-Size is a number of KiB");
    let binary_kib = std::fs::metadata(unpacked().join("usr/bin/watermarkd")).expect("binary").len() / 1024;
    assert!(size >= binary_kib, "Installed-Size {size} KiB < the binary's {binary_kib} KiB");
    let conffiles = std::fs::read_to_string(unpacked().join("DEBIAN/conffiles")).expect("DEBIAN/conffiles");
    assert_eq!(conffiles.lines().collect::<Vec<_>>(), CONFFILES, "conffiles");
}

#[test]
fn the_package_holds_the_stripped_binary_the_units_the_samples_man_pages_and_completions() {
    let root = unpacked();
    assert!(!debug_sections(&binary()).is_empty(), "the test binary has debug sections to strip");
    assert_eq!(
        debug_sections(&root.join("usr/bin/watermarkd")),
        Vec::<String>::new(),
        "the packaged binary is stripped"
    );

    // The files of the repository, unchanged, with the modes they need.
    let same_as = [
        ("usr/lib/systemd/system/watermarkd.service", "systemd/watermarkd.service", 0o644),
        ("usr/lib/sysusers.d/watermarkd.conf", "systemd/watermarkd.sysusers", 0o644),
        ("usr/lib/tmpfiles.d/watermarkd.conf", "systemd/watermarkd.tmpfiles", 0o644),
        ("etc/watermarkd/watermarkd.toml", "packaging/etc/watermarkd/watermarkd.toml", 0o640),
        ("etc/watermarkd/rules.toml", "packaging/etc/watermarkd/rules.toml", 0o640),
        ("etc/watermarkd/watermarkd.env", "packaging/etc/watermarkd/watermarkd.env", 0o600),
        ("usr/share/watermarkd/grafana/watermarkd.json", "deploy/grafana/watermarkd.json", 0o644),
    ];
    for (installed, source, mode) in same_as {
        let packaged = std::fs::read(root.join(installed)).unwrap_or_else(|e| panic!("{installed}: {e}"));
        assert!(packaged == std::fs::read(repo().join(source)).expect("source"), "{installed} differs from {source}");
        let meta = std::fs::metadata(root.join(installed)).expect("metadata");
        assert_eq!(meta.permissions().mode() & 0o7777, mode, "mode of {installed}");
    }
    let listing = run(Command::new("dpkg-deb").arg("--contents").arg(package()));
    for line in listing.lines() {
        assert!(line.contains(" root/root "), "every file belongs to root: {line}");
    }
    assert!(listing.contains("drwxr-x--- root/root"), "/etc/watermarkd is not world-readable:\n{listing}");

    // A man page per command, as `watermarkd man --dir` writes them, compressed.
    let pages = tempfile::tempdir().expect("temp dir");
    run(Command::new(binary()).arg("man").arg("--dir").arg(pages.path()));
    let mut expected: Vec<String> = std::fs::read_dir(pages.path())
        .expect("pages")
        .map(|e| format!("{}.gz", e.expect("entry").file_name().to_string_lossy()))
        .collect();
    expected.sort();
    let mut packaged: Vec<String> = std::fs::read_dir(root.join("usr/share/man/man1"))
        .expect("man1")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    packaged.sort();
    assert!(expected.contains(&"watermarkd.1.gz".to_string()) && expected.len() > 5, "{expected:?}");
    assert_eq!(packaged, expected, "man pages");
    let page = run(Command::new("gzip").arg("-dc").arg(root.join("usr/share/man/man1/watermarkd.1.gz")));
    assert!(page.contains(".TH watermarkd 1"), "watermarkd.1 is a man page:\n{}", &page[..page.len().min(300)]);

    // Completions where each shell looks for them, the same the binary prints.
    for (shell, path) in [
        ("bash", "usr/share/bash-completion/completions/watermarkd"),
        ("zsh", "usr/share/zsh/vendor-completions/_watermarkd"),
        ("fish", "usr/share/fish/vendor_completions.d/watermarkd.fish"),
    ] {
        let printed = run(Command::new(binary()).args(["completions", shell]));
        assert_eq!(std::fs::read_to_string(root.join(path)).expect(path), printed, "{path}");
    }
    let copyright = std::fs::read_to_string(root.join("usr/share/doc/watermarkd/copyright")).expect("copyright");
    assert!(copyright.contains("License: Apache-2.0"), "{copyright}");

    // md5sums lists every file, and each sum holds.
    let sums = std::fs::read_to_string(root.join("DEBIAN/md5sums")).expect("md5sums");
    let summed = sums.lines().count();
    let files = listing.lines().filter(|l| l.starts_with('-')).count();
    assert_eq!(summed, files, "md5sums covers every file:\n{sums}");
    run(Command::new("md5sum").args(["--check", "--quiet", "DEBIAN/md5sums"]).current_dir(root));
}

#[test]
fn dpkg_installs_it_and_the_installed_unit_verifies_and_the_installed_binary_runs() {
    if !need_root("dpkg_installs_it") {
        return;
    }
    let root = fresh_root();
    let r = root.path();
    install(r);
    assert_eq!(package_status(r), "install ok installed");

    // postinst ran systemd-sysusers and systemd-tmpfiles on this root.
    let passwd = std::fs::read_to_string(r.join("etc/passwd")).expect("postinst created etc/passwd");
    let user: Vec<&str> =
        passwd.lines().find(|l| l.starts_with("watermarkd:")).expect("the watermarkd user").split(':').collect();
    assert!(user[6].ends_with("nologin"), "{user:?}");
    let gid: u32 = user[3].parse().expect("gid");
    let modes: BTreeMap<&str, (u32, u32)> = BTreeMap::from([
        ("", (0o750, gid)),
        ("watermarkd.toml", (0o640, gid)),
        ("rules.toml", (0o640, gid)),
        ("watermarkd.env", (0o600, 0)),
    ]);
    for (name, (mode, group)) in modes {
        let meta = std::fs::metadata(r.join("etc/watermarkd").join(name)).expect("metadata");
        assert_eq!(
            (meta.permissions().mode() & 0o7777, meta.uid(), meta.gid()),
            (mode, 0, group),
            "/etc/watermarkd/{name}"
        );
    }

    // systemd-analyze verify in the root: the unit as installed, its Exec lines resolved there.
    // The rest of a system (the targets it orders against, /bin/kill of ExecReload) comes from
    // this machine.
    let units = r.join("usr/lib/systemd/system");
    for entry in std::fs::read_dir("/usr/lib/systemd/system").expect("this machine's units") {
        let entry = entry.expect("entry");
        let target = units.join(entry.file_name());
        if !target.exists() && entry.file_type().expect("type").is_file() {
            std::fs::copy(entry.path(), target).expect("copy a unit");
        }
    }
    std::fs::create_dir_all(r.join("bin")).expect("mkdir bin");
    std::fs::copy("/bin/kill", r.join("bin/kill")).expect("copy /bin/kill");
    let (ok, printed) = analyze_verify(&[&format!("--root={}", r.display())], "watermarkd.service");
    assert!(ok && printed.trim().is_empty(), "systemd-analyze verify the installed unit:\n{printed}");

    let version = run(Command::new(r.join("usr/bin/watermarkd")).arg("--version"));
    assert_eq!(version.trim(), format!("watermarkd {}", env!("CARGO_PKG_VERSION")));
    let checked = run(Command::new(r.join("usr/bin/watermarkd"))
        .arg("check")
        .arg("--rules")
        .arg(r.join("etc/watermarkd/rules.toml")));
    assert!(checked.contains(": ok, 1 autoscaler"), "{checked}");
}

#[test]
fn a_changed_conffile_survives_a_reinstall_and_a_removal_and_goes_with_a_purge() {
    if !need_root("a_changed_conffile_survives") {
        return;
    }
    let root = fresh_root();
    let r = root.path();
    install(r);
    let rules = r.join("etc/watermarkd/rules.toml");
    let mine = format!("# changed by the operator\n{}", std::fs::read_to_string(&rules).expect("rules"));
    std::fs::write(&rules, &mine).expect("change the rules");

    // Standard input is closed: had dpkg wanted to ask about the file, it would have failed.
    install(r);
    assert_eq!(std::fs::read_to_string(&rules).expect("rules"), mine, "the reinstall overwrote a changed conffile");

    run(dpkg(r).args(["--remove", "watermarkd"]));
    assert!(!r.join("usr/bin/watermarkd").exists(), "the binary outlived a removal");
    assert!(!r.join("usr/lib/systemd/system/watermarkd.service").exists(), "the unit outlived a removal");
    assert_eq!(std::fs::read_to_string(&rules).expect("rules kept"), mine, "a removal dropped a conffile");
    assert_eq!(package_status(r), "deinstall ok config-files");

    run(dpkg(r).args(["--purge", "watermarkd"]));
    for conffile in CONFFILES {
        assert!(!r.join(conffile.trim_start_matches('/')).exists(), "{conffile} outlived a purge");
    }
    assert_eq!(package_status(r), "not known", "dpkg still knows the package after a purge");
}

/// Purges the package from this machine when the test ends, however it ends.
struct PurgeOnDrop;

impl Drop for PurgeOnDrop {
    fn drop(&mut self) {
        let purged = output(Command::new("dpkg").args(["--purge", "watermarkd"]));
        if !purged.status.success() {
            eprintln!("dpkg --purge watermarkd: {}", String::from_utf8_lossy(&purged.stderr));
        }
    }
}

/// The plain `dpkg -i` of a user, on this machine itself: only where WATERMARKD_HOST_INSTALL=1
/// says the machine is there to be changed (`.ci/run` sets it: CI runs on a fresh machine, as
/// root). It purges the package at the end; the system user stays, as Debian leaves them.
#[test]
fn on_a_ci_machine_dpkg_installs_it_for_real_and_purges_it() {
    if std::env::var("WATERMARKD_HOST_INSTALL").as_deref() != Ok("1") {
        eprintln!("on_a_ci_machine_dpkg_installs_it: WATERMARKD_HOST_INSTALL is not 1 (.ci/run sets it); skipped");
        return;
    }
    assert!(is_root(), "WATERMARKD_HOST_INSTALL=1 needs root: dpkg installs into this machine");
    let before = output(Command::new("dpkg-query").args(["--show", "--showformat=${Status}", "watermarkd"]));
    let status_before = String::from_utf8_lossy(&before.stdout).into_owned();
    assert!(
        !status_before.contains("installed") && !status_before.contains("config-files"),
        "a watermarkd package is already on this machine ({status_before}); not touching it"
    );

    let _purge = PurgeOnDrop;
    run(Command::new("dpkg").arg("--install").arg(package()));
    let status = run(Command::new("dpkg-query").args(["--show", "--showformat=${Status}", "watermarkd"]));
    assert_eq!(status, "install ok installed");
    run(Command::new("id").arg("watermarkd"));

    let (ok, printed) = analyze_verify(&[], "/usr/lib/systemd/system/watermarkd.service");
    // This machine's own units may draw complaints; only ours count.
    let about_us: Vec<&str> = printed.lines().filter(|l| l.contains("watermarkd")).collect();
    assert!(ok && about_us.is_empty(), "systemd-analyze verify the installed unit:\n{printed}");

    let version = run(Command::new("/usr/bin/watermarkd").arg("--version"));
    assert_eq!(version.trim(), format!("watermarkd {}", env!("CARGO_PKG_VERSION")));
    let checked = run(Command::new("/usr/bin/watermarkd").args(["check", "--rules", "/etc/watermarkd/rules.toml"]));
    assert!(checked.contains(": ok, 1 autoscaler"), "{checked}");
    let page = run(Command::new("gzip").args(["-dc", "/usr/share/man/man1/watermarkd.1.gz"]));
    assert!(page.contains(".TH watermarkd 1"), "the man page is installed");
}
