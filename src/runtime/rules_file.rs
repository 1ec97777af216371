//! The rules file: checked for a change every `reload_poll` and reloaded on SIGHUP. An
//! invalid file keeps the previous rules running.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::scheduler::Command;
use super::source::{Desired, SourceKind};
use super::Shared;
use crate::adapters::backend::MetricBackend;
use crate::adapters::secret::FileStamp;
use crate::domain::rules::{self, RulesFile};

/// Splits a rules file into its autoscalers and the rest (the backends, which CRD mode also
/// needs). The autoscalers move: the daemon keeps one copy of each. `daemon_dry_run` is the
/// daemon's --dry-run, which the series' `dry_run` label includes.
pub fn split(rules: RulesFile, daemon_dry_run: bool) -> (Arc<RulesFile>, Vec<Desired>) {
    for autoscaler in &rules.autoscalers {
        for warning in rules::warnings(autoscaler) {
            tracing::warn!(autoscaler = %autoscaler.name, "{warning}");
        }
    }
    let desired = rules.autoscalers.into_iter().map(|a| Desired::from_rules_file(a, daemon_dry_run)).collect();
    // The file was checked: every shadow has its one active autoscaler.
    let (desired, lone) = super::source::attach_shadows(desired);
    for (shadow, why) in lone {
        tracing::error!(autoscaler = %shadow.autoscaler.name, problem = %why, "shadow rule not run");
    }
    (Arc::new(RulesFile { backends: rules.backends, autoscalers: Vec::new(), scaled: rules.scaled }), desired)
}

pub struct RulesWatch {
    pub path: PathBuf,
    pub poll: Duration,
    pub commands: mpsc::Sender<Command>,
    pub rules: watch::Sender<Arc<RulesFile>>,
    pub reload: mpsc::Receiver<()>,
    pub shared: Arc<Shared>,
    pub notifier: super::systemd::Notifier,
    pub stopping: CancellationToken,
}

/// What identifies the file's content without reading it: the resolved file (symlinks
/// followed, so a ConfigMap's `..data` swap is a new inode), its size and its mtime.
fn fingerprint(path: &std::path::Path) -> Option<FileStamp> {
    FileStamp::of(path)
}

fn content_hash(text: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// Checks the file every `poll` (by its resolved identity, size and mtime, so editors' renames
/// and ConfigMap symlink swaps are seen) and reloads on a change of content or on SIGHUP, until
/// `stopping` is cancelled.
pub async fn watch_rules_file(mut watch: RulesWatch) {
    let mut seen = fingerprint(&watch.path);
    let mut applied_hash = std::fs::read_to_string(&watch.path).ok().map(|t| content_hash(&t));
    // The last content that failed, so a broken file is reported once, not every poll.
    let mut failed_hash: Option<u64> = None;
    loop {
        let forced = tokio::select! {
            _ = tokio::time::sleep(watch.poll) => false,
            Some(()) = watch.reload.recv() => true,
            () = watch.stopping.cancelled() => return,
        };
        let now_seen = fingerprint(&watch.path);
        if !forced && now_seen == seen {
            continue;
        }
        seen = now_seen;
        let text = match std::fs::read_to_string(&watch.path) {
            Ok(text) => text,
            Err(err) => {
                // Mid-swap, or deleted: keep the rules that run.
                if forced {
                    reload_failed(&watch.shared, &format!("cannot read {}: {err}", watch.path.display()), &[]);
                }
                continue;
            }
        };
        let hash = content_hash(&text);
        if Some(hash) == applied_hash && failed_hash.is_some() {
            // Back to the rules that run (`git checkout`, `helm rollback` after a bad edit):
            // nothing to apply, but the failure is over and must stop being reported.
            failed_hash = None;
            reload_restored(&watch.shared, &watch.path);
            if forced {
                watch.notifier.ready();
            }
            continue;
        }
        if !forced && (Some(hash) == applied_hash || Some(hash) == failed_hash) {
            continue;
        }
        if forced {
            watch.notifier.reloading();
        }
        let parsed = rules::parse_rules(&text, &watch.path.display().to_string());
        // A backend whose new settings cannot be built (a secret file that cannot be read) fails
        // the reload as a whole: the running client keeps working. Not remembered as a failed
        // content: once the secret is in place, a touch of the file or SIGHUP applies it.
        let unbuildable = match &parsed {
            Ok(next) => {
                let running = Arc::clone(&watch.rules.borrow());
                MetricBackend::check_changed(&running, next).err()
            }
            Err(_) => None,
        };
        if let Some(err) = unbuildable {
            reload_failed(&watch.shared, &format!("{err}; the previous rules keep running"), &[]);
            if forced {
                watch.notifier.ready();
            }
            continue;
        }
        match parsed {
            Ok(next) => {
                failed_hash = None;
                applied_hash = Some(hash);
                if !apply(&watch, next).await {
                    return;
                }
            }
            Err(err) => {
                failed_hash = Some(hash);
                for problem in &err.problems {
                    tracing::error!(file = %err.origin, problem = %problem, "invalid rules");
                }
                let problems: Vec<String> = err.problems.iter().map(ToString::to_string).collect();
                reload_failed(
                    &watch.shared,
                    &format!("{} problem(s) in {}; the previous rules keep running", err.problems.len(), err.origin),
                    &problems,
                );
            }
        }
        if forced {
            watch.notifier.ready();
        }
    }
}

/// Sends the scheduler the reloaded rules; false when the loop is gone.
async fn apply(watch: &RulesWatch, next: RulesFile) -> bool {
    watch.shared.daemon.reloads.with_label_values(&["success"]).inc();
    watch.shared.daemon.last_reload_successful.set(1);
    watch.shared.board.rules_accepted();
    tracing::info!(file = %watch.path.display(), autoscalers = next.autoscalers.len(), "rules reloaded");
    let (backends, desired) = split(next, watch.shared.dry_run);
    if watch.commands.send(Command::Backends(Arc::clone(&backends))).await.is_err() {
        return false;
    }
    if watch.commands.send(Command::Replace { source: SourceKind::RulesFile, desired }).await.is_err() {
        return false;
    }
    watch.rules.send_replace(backends);
    // The parse's garbage: give it back.
    watch.shared.trim.request();
    true
}

/// A reload that was refused: counted, the gauge at 0, and on the status board until a good
/// file is read, with each problem.
fn reload_failed(shared: &Shared, message: &str, problems: &[String]) {
    shared.daemon.reloads.with_label_values(&["failure"]).inc();
    shared.daemon.last_reload_successful.set(0);
    shared.board.rules_rejected(shared.clock.now(), message, problems);
    tracing::error!("rules reload failed: {message}");
}

/// The file holds the rules that run again, after a refused edit.
fn reload_restored(shared: &Shared, path: &std::path::Path) {
    shared.daemon.last_reload_successful.set(1);
    shared.board.rules_accepted();
    tracing::info!(file = %path.display(), "the rules file is back to the rules that run; the refused edit is over");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rename_or_a_symlink_swap_changes_the_fingerprint() {
        let dir = tempfile::tempdir().expect("temp dir");
        let rules = dir.path().join("rules.toml");
        std::fs::write(&rules, "a = 1\n").expect("write");
        let first = fingerprint(&rules).expect("fingerprint");
        assert_eq!(fingerprint(&rules), Some(first), "stable while nothing changes");

        // An editor's save: a new file renamed over the old one, same size.
        let staged = dir.path().join("rules.toml.tmp");
        std::fs::write(&staged, "a = 2\n").expect("write");
        std::fs::rename(&staged, &rules).expect("rename");
        let renamed = fingerprint(&rules).expect("fingerprint");
        assert_ne!(renamed, first);

        // A ConfigMap volume: rules.toml -> ..data/rules.toml, and ..data is swapped.
        let mounted = dir.path().join("mounted");
        std::fs::create_dir(&mounted).expect("dir");
        for (version, text) in [("v1", "b = 1\n"), ("v2", "b = 2\n")] {
            std::fs::create_dir(mounted.join(version)).expect("dir");
            std::fs::write(mounted.join(version).join("rules.toml"), text).expect("write");
        }
        std::os::unix::fs::symlink("v1", mounted.join("..data")).expect("symlink");
        std::os::unix::fs::symlink("..data/rules.toml", mounted.join("rules.toml")).expect("symlink");
        let before = fingerprint(&mounted.join("rules.toml")).expect("fingerprint");
        std::os::unix::fs::symlink("v2", mounted.join("..data_tmp")).expect("symlink");
        std::fs::rename(mounted.join("..data_tmp"), mounted.join("..data")).expect("swap");
        let after = fingerprint(&mounted.join("rules.toml")).expect("fingerprint");
        assert_ne!(before, after);
        assert_eq!(std::fs::read_to_string(mounted.join("rules.toml")).expect("read"), "b = 2\n");
    }
}
