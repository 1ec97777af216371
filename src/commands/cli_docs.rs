//! Shell completions and man pages, generated from the clap `Command` the binary parses, so
//! that neither can fall behind a flag or subcommand added to the CLI.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::Command;
use clap_complete::Shell;

/// The name completions are registered for and man pages are titled with, whatever name the
/// binary was started under.
pub const BIN_NAME: &str = "watermarkd";

/// Writes the completion script for `shell`.
pub fn write_completions(mut cmd: Command, shell: Shell, out: &mut dyn Write) -> io::Result<()> {
    // clap_complete's generators panic when their writer fails (`| head` closes the pipe);
    // rendered into memory first, a failed write to `out` is an error value instead.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, BIN_NAME, &mut script);
    out.write_all(&script)
}

/// Writes the top-level man page (`watermarkd.1`), which lists the subcommands.
pub fn write_man_page(cmd: Command, out: &mut dyn Write) -> io::Result<()> {
    man(prepare(cmd)).render(out)
}

/// Writes `watermarkd.1` and one `watermarkd-SUBCOMMAND.1` per visible subcommand into `dir`,
/// and returns the paths written, the top-level page first.
pub fn write_man_pages(cmd: Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut cmd = prepare(cmd);
    // Built once at the top, so that each subcommand carries its full name
    // (`watermarkd-check`, `watermarkd check`) into its page's title and synopsis.
    cmd.build();
    let mut written = Vec::new();
    write_tree(&cmd, dir, &mut written)?;
    Ok(written)
}

fn write_tree(cmd: &Command, dir: &Path, written: &mut Vec<PathBuf>) -> io::Result<()> {
    let man = man(cmd.clone());
    let path = dir.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)?;
    std::fs::write(&path, page)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        write_tree(sub, dir, written)?;
    }
    Ok(())
}

/// clap_mangen's footer names the page's own command (`run 0.1.0`); every page is the
/// binary's, with its version.
fn man(cmd: Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd).source(format!("{BIN_NAME} {}", env!("CARGO_PKG_VERSION")))
}

/// The `help` subcommand is clap's, not ours: a page for it, or a line for it in the list of
/// subcommands, would only repeat `--help`.
fn prepare(cmd: Command) -> Command {
    cmd.bin_name(BIN_NAME).disable_help_subcommand(true)
}
