//! Running the packaging scripts (scripts/build-deb, scripts/build-image) on the binary cargo
//! built for the tests, and the commands the packaging tests read their output with.
//!
//! The scripts take any binary and strip it themselves, so the debug binary of the test build
//! stands in for the release one (whose fat-LTO build takes ten minutes and stays out of the test
//! command); what differs between the two, size and speed, is measured by `scripts/dist` and
//! recorded in BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A fixed date for the artifacts the tests build, so that two builds can be compared byte for
/// byte (the scripts default to the time of the checked-out commit).
pub const SOURCE_DATE_EPOCH: &str = "1700000000";

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The watermarkd binary cargo built for this test run.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_watermarkd"))
}

fn describe(command: &Command) -> String {
    let mut words = vec![command.get_program().to_string_lossy().into_owned()];
    words.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

/// Runs a command with no standard input (as CI does) and returns what it printed.
pub fn output(command: &mut Command) -> Output {
    command.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("run {}: {e}", describe(command)))
}

/// Both streams of a finished command, for messages and for checks of what it said.
pub fn printed(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Runs a command that must succeed; returns its standard output.
pub fn run(command: &mut Command) -> String {
    let result = output(command);
    assert!(result.status.success(), "{} failed ({}):\n{}", describe(command), result.status, printed(&result));
    String::from_utf8_lossy(&result.stdout).into_owned()
}

/// A packaging script of the repository, run from the repository with the fixed date.
pub fn script(name: &str) -> Command {
    let mut command = Command::new(repo().join("scripts").join(name));
    command.current_dir(repo()).env("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH);
    command
}

pub fn is_root() -> bool {
    run(Command::new("id").arg("-u")).trim() == "0"
}

/// Whether a test that only root can run may go on; says why it is skipped otherwise. CI runs
/// as root.
pub fn root_or_skip(test: &str, why: &str) -> bool {
    if !is_root() {
        eprintln!("{test}: not root, {why}; skipped");
    }
    is_root()
}

/// The ELF sections of a binary that a distributed one must not carry: debug information and
/// the symbol table. (`.debug_gdb_scripts` is not debug information but a few loaded bytes naming
/// gdb's pretty-printers for Rust types; stripping keeps it, as it must any allocated section.)
pub fn debug_sections(elf: &Path) -> Vec<String> {
    let listing = run(Command::new("readelf").args(["--section-headers", "--wide"]).arg(elf));
    listing
        .lines()
        .filter_map(|line| line.split_once(']').map(|(_, rest)| rest.split_whitespace().next().unwrap_or("")))
        .filter(|name| *name != ".debug_gdb_scripts")
        .filter(|name| name.starts_with(".debug") || *name == ".symtab" || name.starts_with(".zdebug"))
        .map(str::to_string)
        .collect()
}
