//! The layers of docs/architecture.md, checked on the sources: the domain (`src/domain`) names
//! nothing of the adapters, the daemon or the commands, and the adapters (`src/adapters`)
//! nothing of the daemon or the commands. Every path is read, in `use` declarations (groups
//! included) and in code alike, written from the crate (`crate::runtime::...`), from the
//! library's name (`watermarkd::...`) or relative to the module (`super::super::...`,
//! `self::...`, inside inline modules too). Comments, strings and character literals are left
//! out first, so that a sentence or a URL naming a layer is not an import.
//!
//! The checker is tested on its own with planted violations, so that a checker that finds
//! nothing cannot pass for a tree that has nothing to find.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

use std::path::{Path, PathBuf};

/// The layers a layer must not name: (the layer, the layers below it may not reach).
const RULES: &[(&str, &[&str])] =
    &[("domain", &["adapters", "runtime", "commands"]), ("adapters", &["runtime", "commands"])];

/// A path in one layer's source that names a layer it must not.
#[derive(Debug, PartialEq, Eq)]
struct Violation {
    /// The file, relative to `src`.
    file: String,
    line: usize,
    /// The path as it resolves from the crate root (`runtime::settings::Settings`).
    resolved: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "src/{}:{}: crate::{}", self.file, self.line, self.resolved)
    }
}

/// The module a file under `src` is: `domain/rules/compile.rs` is `domain::rules::compile`,
/// `domain/rules/mod.rs` is `domain::rules`, `lib.rs` is the root.
fn module_of(file: &str) -> Vec<String> {
    let without = file.strip_suffix(".rs").unwrap_or(file);
    let mut parts: Vec<String> = without.split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// `text` with comments, strings and character literals blanked (newlines kept, so that line
/// numbers still hold).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_at(&chars, i) {
            // r"..", r#".."#, br"..": up to the quote followed by as many #.
            let start = i;
            i += chars[i..].iter().position(|&c| c == '"').unwrap_or(0) + 1;
            while i < chars.len() && !(chars[i] == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#'))) {
                i += 1;
            }
            i = (i + 1 + hashes).min(chars.len());
            out.extend(chars[start..i].iter().map(|&c| blank(c)));
        } else if c == '"' || (c == 'b' && next == Some('"') && !ident_char_before(&chars, i)) {
            let start = i;
            i += if c == 'b' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
            out.extend(chars[start..i].iter().map(|&c| blank(c)));
        } else if c == '\'' && !ident_char_before(&chars, i) {
            // A character literal ('a', '\n', '\u{1b}'), else a lifetime or label ('a).
            let end = if next == Some('\\') {
                // The escaped character is at i + 2 (it may be a quote): the end comes after.
                chars.get(i + 3..).and_then(|rest| rest.iter().position(|&c| c == '\'')).map(|p| i + 3 + p)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    out.extend(chars[i..=end].iter().map(|&c| blank(c)));
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char_before(chars: &[char], i: usize) -> bool {
    i > 0 && chars.get(i - 1).is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// The number of `#` of a raw string starting at `i`, if one does.
fn raw_string_at(chars: &[char], i: usize) -> Option<usize> {
    if ident_char_before(chars, i) {
        return None;
    }
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    (chars.get(j + hashes) == Some(&'"')).then_some(hashes)
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semicolon,
    Other,
}

/// The tokens of code (after [`code_only`]), each with its line.
fn tokens(code: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphabetic() || c == '_' || (c == '$' && chars.get(i + 1).is_some_and(|n| n.is_alphabetic())) {
            let start = i;
            i += 1;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((Token::Ident(chars[start..i].iter().collect()), line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((Token::PathSep, line));
            i += 2;
        } else {
            out.push((
                match c {
                    '{' => Token::Open,
                    '}' => Token::Close,
                    ',' => Token::Comma,
                    ';' => Token::Semicolon,
                    _ => Token::Other,
                },
                line,
            ));
            i += 1;
        }
    }
    out
}

/// A path named in code, as written, with the module it is written in and its line.
struct Named {
    segments: Vec<String>,
    module: Vec<String>,
    line: usize,
}

/// Every path of `use` trees (expanded: `use crate::{a::b, c}` names `crate::a::b` and
/// `crate::c`) and every other path of two segments or more, with the inline module each is in.
fn named_paths(text: &str, file_module: &[String]) -> Vec<Named> {
    let tokens = tokens(&code_only(text));
    let mut found = Vec::new();
    // Inline modules: (name, the brace depth their body opened at).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let module = || file_module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect::<Vec<_>>();
        match &tokens[i].0 {
            Token::Ident(word) if word == "mod" => {
                if let (Some((Token::Ident(name), _)), Some((Token::Open, _))) = (tokens.get(i + 1), tokens.get(i + 2))
                {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
                i += 1;
            }
            Token::Ident(word) if word == "use" => {
                let end = tokens[i..].iter().position(|(t, _)| *t == Token::Semicolon).map_or(tokens.len(), |p| i + p);
                let mut prefixes = Vec::new();
                use_tree(&tokens[i + 1..end], &mut Vec::new(), &mut prefixes);
                let module = module();
                for (segments, line) in prefixes {
                    found.push(Named { segments, module: module.clone(), line });
                }
                i = end + 1;
            }
            Token::Ident(first) => {
                let line = tokens[i].1;
                let mut segments = vec![first.clone()];
                let mut j = i + 1;
                while let (Some((Token::PathSep, _)), Some((Token::Ident(next), _))) =
                    (tokens.get(j), tokens.get(j + 1))
                {
                    segments.push(next.clone());
                    j += 2;
                }
                if segments.len() > 1 {
                    found.push(Named { segments, module: module(), line });
                }
                i = j;
            }
            Token::Open => {
                depth += 1;
                i += 1;
            }
            Token::Close => {
                if inline.last().is_some_and(|(_, opened)| *opened == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => i += 1,
        }
    }
    found
}

/// Expands a `use` tree (its tokens after `use`) into full paths.
fn use_tree(tokens: &[(Token, usize)], prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, usize)>) {
    let mut i = 0;
    let mut current = prefix.clone();
    let mut line = tokens.first().map_or(0, |(_, l)| *l);
    while i < tokens.len() {
        match &tokens[i].0 {
            Token::Ident(word) if word == "as" => {
                // The alias is not part of the path.
                i += 2;
            }
            Token::Ident(word) if word == "pub" => i += 1,
            Token::Ident(word) => {
                current.push(word.clone());
                line = tokens[i].1;
                i += 1;
            }
            Token::PathSep => i += 1,
            Token::Open => {
                // The group's extent: up to its matching brace.
                let mut level = 0;
                let mut end = i;
                for (k, (t, _)) in tokens.iter().enumerate().skip(i) {
                    match t {
                        Token::Open => level += 1,
                        Token::Close => {
                            level -= 1;
                            if level == 0 {
                                end = k;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                // Each item of the group, split at its top-level commas.
                let inner = &tokens[i + 1..end.max(i + 1)];
                let mut start = 0;
                let mut level = 0;
                for (k, (t, _)) in inner.iter().enumerate() {
                    match t {
                        Token::Open => level += 1,
                        Token::Close => level -= 1,
                        Token::Comma if level == 0 => {
                            use_tree(&inner[start..k], &mut current.clone(), out);
                            start = k + 1;
                        }
                        _ => {}
                    }
                }
                use_tree(&inner[start..], &mut current.clone(), out);
                current.clear();
                i = end + 1;
            }
            Token::Comma => {
                if !current.is_empty() && current != *prefix {
                    out.push((std::mem::take(&mut current), line));
                }
                current = prefix.clone();
                i += 1;
            }
            _ => i += 1,
        }
    }
    if !current.is_empty() && current != *prefix {
        out.push((current, line));
    }
}

/// The path from the crate root that `segments`, written in `module`, names; `None` for a
/// path that does not start from this crate (an extern crate, a local item, a macro's `$crate`).
fn resolve(segments: &[String], module: &[String]) -> Option<Vec<String>> {
    let (first, rest) = segments.split_first()?;
    match first.as_str() {
        "crate" | "watermarkd" => Some(rest.to_vec()),
        "self" => Some(module.iter().chain(rest).cloned().collect()),
        "super" => {
            let supers = segments.iter().take_while(|s| *s == "super").count();
            let base = module.len().checked_sub(supers)?;
            Some(module[..base].iter().chain(&segments[supers..]).cloned().collect())
        }
        _ => None,
    }
}

/// Every path in `files` (relative to `src`, with their text) that crosses a rule.
fn violations(files: &[(String, String)]) -> Vec<Violation> {
    let mut found = Vec::new();
    for (file, text) in files {
        let file_module = module_of(file);
        let Some((_, forbidden)) =
            RULES.iter().find(|(layer, _)| file_module.first().map(String::as_str) == Some(*layer))
        else {
            continue;
        };
        for named in named_paths(text, &file_module) {
            let Some(resolved) = resolve(&named.segments, &named.module) else { continue };
            if resolved.first().is_some_and(|top| forbidden.contains(&top.as_str())) {
                found.push(Violation { file: file.clone(), line: named.line, resolved: resolved.join("::") });
            }
        }
    }
    found
}

fn rust_files(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            out.push((relative, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

#[test]
fn the_domain_and_the_adapters_name_nothing_above_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for layer in ["domain", "adapters"] {
        rust_files(&src.join(layer), &src, &mut files);
    }
    assert!(files.len() > 50, "the sources were not found under {}: {} files", src.display(), files.len());
    // The checker reads these files: the adapters' many paths into the domain resolve.
    let into_domain = files
        .iter()
        .filter(|(file, _)| file.starts_with("adapters/"))
        .flat_map(|(file, text)| {
            let module = module_of(file);
            named_paths(text, &module).into_iter().filter_map(|n| resolve(&n.segments, &n.module)).collect::<Vec<_>>()
        })
        .filter(|resolved| resolved.first().is_some_and(|top| top == "domain"))
        .count();
    assert!(into_domain > 50, "only {into_domain} paths from the adapters into the domain were read");
    let found = violations(&files);
    let listed: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert!(
        found.is_empty(),
        "{} path(s) reach a layer above their own (docs/architecture.md, \"The layers\"):\n{}",
        found.len(),
        listed.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The checker itself, on planted sources.

fn planted(file: &str, text: &str) -> Vec<String> {
    violations(&[(file.to_string(), text.to_string())]).iter().map(ToString::to_string).collect()
}

#[test]
fn the_checker_finds_each_form_of_a_planted_violation() {
    assert_eq!(
        planted("domain/x.rs", "use crate::runtime::settings::Settings;\n"),
        ["src/domain/x.rs:1: crate::runtime::settings::Settings"]
    );
    assert_eq!(
        planted("domain/x.rs", "use crate::{domain::sparse::Sparse,\n  adapters::{status::Board, lease}};\n"),
        ["src/domain/x.rs:2: crate::adapters::status::Board", "src/domain/x.rs:2: crate::adapters::lease"]
    );
    // From domain/rules/compile.rs, super::super::super is the crate root.
    assert_eq!(
        planted("domain/rules/compile.rs", "fn f() { super::super::super::commands::check::run(); }\n"),
        ["src/domain/rules/compile.rs:1: crate::commands::check::run"]
    );
    assert_eq!(
        planted("domain/rules/mod.rs", "use super::super::runtime as r;\n"),
        ["src/domain/rules/mod.rs:1: crate::runtime"]
    );
    assert_eq!(
        planted("adapters/status/board.rs", "fn f() -> watermarkd::commands::status::Output { todo!() }\n"),
        ["src/adapters/status/board.rs:1: crate::commands::status::Output"]
    );
    // Inside an inline module one more super is needed to climb out of the file.
    assert_eq!(
        planted("domain/x.rs", "#[cfg(test)]\nmod tests {\n    use super::super::super::adapters::events;\n}\n"),
        ["src/domain/x.rs:3: crate::adapters::events"]
    );
    assert_eq!(planted("adapters/x.rs", "use crate::runtime;\n"), ["src/adapters/x.rs:1: crate::runtime"]);
}

#[test]
fn the_checker_passes_what_the_layers_allow() {
    // Below or beside: the engine, the domain from the adapters, a sibling adapter.
    assert!(
        planted("adapters/x.rs", "use crate::domain::rules::Autoscaler;\nuse crate::adapters::telemetry;\n").is_empty()
    );
    // Relative paths that stay inside the layer.
    assert!(planted("domain/rules/compile.rs", "use super::super::sparse::Sparse;\nuse super::model::Backend;\n")
        .is_empty());
    assert!(planted("domain/x.rs", "mod tests {\n    use super::super::status::explain;\n}\n").is_empty());
    // A layer named only in a comment, a string, a raw string or a character: not an import.
    let words = "// crate::runtime::x\n/* crate::commands /* nested */ x */\nconst A: &str = \"crate::adapters::x\";\n\
                 const B: &str = r#\"crate::runtime\"#;\nconst C: char = '\"';\nconst D: char = '\\'';\nfn f<'a>(x: &'a str) {}\n\
                 fn g() { let _ = \"crate::runtime\"; }\n";
    assert!(planted("domain/x.rs", words).is_empty(), "{:?}", planted("domain/x.rs", words));
    // Outside the checked layers, anything goes.
    assert!(planted("runtime/x.rs", "use crate::commands::check;\n").is_empty());
    assert!(planted("commands/x.rs", "use crate::runtime::settings;\n").is_empty());
}
