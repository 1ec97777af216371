//! `watermarkd completions SHELL` and `watermarkd man`: the real binary's scripts and pages
//! cover every subcommand its `--help` lists, the bash script parses and completes in a real
//! bash, and the man pages render without a warning from groff (or mandoc, or man).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_watermarkd");

fn watermarkd(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run watermarkd")
}

/// Standard output of a run that must succeed.
fn stdout_of(args: &[&str]) -> String {
    let output = watermarkd(args);
    assert!(
        output.status.success(),
        "watermarkd {args:?} exited {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// The subcommands `watermarkd --help` lists, clap's own `help` left out: taken from the help
/// rather than written here, so that a subcommand added later is checked too.
fn subcommands() -> Vec<String> {
    let help = stdout_of(&["--help"]);
    let listed: Vec<String> = help
        .lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        // A wrapped description continues on a line indented further than the names.
        .filter(|line| line.starts_with("  ") && !line[2..].starts_with(' '))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    for expected in ["check", "run", "completions", "man"] {
        assert!(listed.iter().any(|name| name == expected), "--help lists no {expected}: {listed:?}\n{help}");
    }
    listed
}

/// Runs `script` in bash after sourcing the completion script, and returns its standard output.
fn bash_with_completions(completions: &str, script: &str) -> String {
    let mut child = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &format!("source /dev/stdin\n{script}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run bash");
    child.stdin.take().unwrap().write_all(completions.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "bash: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// What `_watermarkd` offers for the last of `words` (the word being completed).
fn bash_complete(completions: &str, words: &[&str]) -> Vec<String> {
    let cword = words.len() - 1;
    let quoted: Vec<String> = words.iter().map(|word| format!("'{word}'")).collect();
    let script = format!(
        "COMP_WORDS=({words}); COMP_CWORD={cword}\n_watermarkd watermarkd '{cur}' '{prev}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"",
        words = quoted.join(" "),
        cur = words[cword],
        prev = words[cword - 1],
    );
    bash_with_completions(completions, &script).lines().map(str::to_owned).collect()
}

#[test]
fn bash_completions_parse_and_complete_every_subcommand_and_flag() {
    let script = stdout_of(&["completions", "bash"]);
    assert!(script.contains("_watermarkd() {"), "no _watermarkd function:\n{script}");
    assert!(script.contains("complete -F _watermarkd"), "_watermarkd is not registered for watermarkd:\n{script}");

    let check = Command::new("bash")
        .arg("-n")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(script.as_bytes())?;
            child.wait_with_output()
        })
        .expect("run bash -n");
    assert!(check.status.success(), "bash -n rejects the script: {}", String::from_utf8_lossy(&check.stderr));

    // What a person gets pressing tab, not only what the text says.
    let offered = bash_complete(&script, &["watermarkd", ""]);
    for sub in subcommands() {
        assert!(offered.contains(&sub), "`watermarkd <TAB>` does not offer {sub}: {offered:?}");
        assert!(script.contains(&format!("watermarkd,{sub})")), "the script has no case for {sub}");
    }
    for (words, flag) in [
        (&["watermarkd", "run", "--dr"][..], "--dry-run"),
        (&["watermarkd", "run", "--confi"], "--config"),
        (&["watermarkd", "check", "--ru"], "--rules"),
        (&["watermarkd", "man", "--d"], "--dir"),
        (&["watermarkd", "import", "--adapter-c"], "--adapter-config"),
    ] {
        let offered = bash_complete(&script, words);
        assert_eq!(offered, [flag], "completing {words:?}");
    }
    let shells = bash_complete(&script, &["watermarkd", "completions", ""]);
    for shell in ["bash", "zsh", "fish"] {
        assert!(shells.iter().any(|s| s == shell), "`completions <TAB>` does not offer {shell}: {shells:?}");
    }
}

#[test]
fn zsh_and_fish_completions_are_for_watermarkd() {
    let zsh = stdout_of(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef watermarkd\n"), "zsh script starts {:?}", zsh.lines().next());
    let fish = stdout_of(&["completions", "fish"]);
    assert!(fish.contains("complete -c watermarkd "), "fish script has no `complete -c watermarkd`:\n{fish}");
    for sub in subcommands() {
        assert!(zsh.contains(&format!("'{sub}:")), "zsh script lacks {sub}");
        assert!(fish.contains(&format!("-a \"{sub}\"")), "fish script lacks {sub}");
    }
}

#[test]
fn an_unknown_shell_fails_naming_the_accepted_ones() {
    let output = watermarkd(&["completions", "tcsh"]);
    assert!(!output.status.success(), "completions tcsh succeeded");
    assert!(output.stdout.is_empty(), "completions tcsh wrote a script");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tcsh"), "the error does not name the value given: {stderr}");
    for shell in ["bash", "zsh", "fish"] {
        assert!(stderr.contains(shell), "the error does not name {shell}: {stderr}");
    }
}

/// The warnings a man page renderer prints for `page`, or None when this machine has none
/// (groff, mandoc or man).
fn render_warnings(page: &str) -> Option<(&'static str, String)> {
    // groff with every warning on, and mandoc's linter, are stricter than man's defaults.
    let renderers: [(&str, &[&str]); 3] =
        [("groff", &["-man", "-Tutf8", "-ww", "-z"]), ("mandoc", &["-Tlint", "-Wwarning"]), ("man", &["-l", "-"])];
    for (tool, args) in renderers {
        let child = Command::new(tool)
            .args(args)
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "80")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let Ok(mut child) = child else { continue };
        child.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{tool} failed: {}", String::from_utf8_lossy(&output.stderr));
        let mut warnings = String::from_utf8_lossy(&output.stderr).into_owned();
        if tool == "mandoc" {
            // -Tlint reports on standard output.
            warnings.push_str(&String::from_utf8_lossy(&output.stdout));
        }
        return Some((tool, warnings));
    }
    None
}

fn assert_renders_cleanly(name: &str, page: &str) {
    match render_warnings(page) {
        Some((tool, warnings)) => assert!(warnings.trim().is_empty(), "{tool} warns about {name}:\n{warnings}"),
        None => eprintln!("SKIPPED: rendering {name}: neither groff, mandoc nor man is installed"),
    }
}

#[test]
fn man_page_lists_every_subcommand_and_renders() {
    let page = stdout_of(&["man"]);
    assert!(page.lines().any(|line| line.starts_with(".TH watermarkd 1 ")), "no .TH line:\n{page}");
    // clap_mangen puts two lines defining the apostrophe string before .TH; they are roff too.
    let first = page.lines().find(|line| !line.starts_with(".ie") && !line.starts_with(".el")).unwrap_or("");
    assert!(first.starts_with(".TH"), "the page starts with {first:?}, not .TH");
    assert!(page.contains("\n.SH SUBCOMMANDS\n"), "no SUBCOMMANDS section:\n{page}");
    for sub in subcommands() {
        assert!(page.contains(&format!("watermarkd\\-{sub}(1)")), "the page does not list {sub}:\n{page}");
    }
    assert_renders_cleanly("watermarkd.1", &page);
}

#[test]
fn man_dir_writes_one_page_per_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let listed = stdout_of(&["man", "--dir", dir.path().to_str().unwrap()]);
    let mut expected = vec!["watermarkd.1".to_owned()];
    expected.extend(subcommands().iter().map(|sub| format!("watermarkd-{sub}.1")));
    let printed: Vec<&str> =
        listed.lines().map(|line| Path::new(line).file_name().unwrap().to_str().unwrap()).collect();
    assert_eq!(printed, expected, "the paths printed");
    let mut on_disk: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
    on_disk.sort();
    let mut sorted = expected.clone();
    sorted.sort();
    assert_eq!(on_disk, sorted, "the files written");

    let top = std::fs::read_to_string(dir.path().join("watermarkd.1")).unwrap();
    assert_eq!(top, stdout_of(&["man"]), "watermarkd.1 differs from `watermarkd man`");
    let run = std::fs::read_to_string(dir.path().join("watermarkd-run.1")).unwrap();
    assert!(run.contains(".TH watermarkd-run 1 "), "watermarkd-run.1 has no title:\n{run}");
    assert!(run.contains("\"watermarkd 0.1.0\""), "watermarkd-run.1 does not name watermarkd in its footer:\n{run}");
    assert!(run.contains("\\-\\-dry\\-run"), "watermarkd-run.1 does not document --dry-run:\n{run}");
    for name in &expected {
        assert_renders_cleanly(name, &std::fs::read_to_string(dir.path().join(name)).unwrap());
    }
}

#[test]
fn version_is_a_subcommand_too() {
    let by_flag = stdout_of(&["--version"]);
    assert_eq!(stdout_of(&["version"]), by_flag);
    assert!(by_flag.starts_with("watermarkd ") && by_flag.trim_end().len() > "watermarkd ".len(), "{by_flag}");
}

/// As in kubectl and helm: a command with `--output` takes `-o` as well.
#[test]
fn every_output_option_has_its_short_form() {
    let mut with_output = Vec::new();
    for sub in subcommands() {
        let help = stdout_of(&[&sub, "--help"]);
        if help.contains("--output") {
            assert!(help.contains("-o, --output"), "`watermarkd {sub}` has --output without -o:\n{help}");
            with_output.push(sub);
        }
    }
    assert!(with_output.iter().any(|s| s == "status"), "status has --output: {with_output:?}");
}
