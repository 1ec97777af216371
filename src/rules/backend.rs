//! `[backend.NAME]` tables: where metrics are queried, and where the credentials come from.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::problem::Sink;
use super::reader::Table;
use super::{Backend, DatadogBackend, PrometheusBackend, SecretSource};

const DEFAULT_DATADOG_SITE: &str = "datadoghq.com";
const DATADOG_KEYS: &[&str] = &["type", "site", "url", "api_key_env", "api_key_file", "app_key_env", "app_key_file"];
const PROMETHEUS_KEYS: &[&str] = &["type", "url"];

/// Reads every backend under `[backend]`. Backends with a problem are reported and map to `None`,
/// so that metrics naming them are not also told that the backend does not exist.
pub(crate) fn read_backends(root: &mut Table<'_>, sink: &mut Sink) -> BTreeMap<String, Option<Backend>> {
    let mut backends = BTreeMap::new();
    let Some(mut table) = root.table(sink, "backend") else { return backends };
    for entry in table.drain() {
        let scope = table.scope.child(&entry.key);
        let parsed = Table::new(&entry.value, scope, sink).and_then(|mut backend| read_backend(&mut backend, sink));
        backends.insert(entry.key.clone(), parsed);
    }
    backends
}

fn read_backend(table: &mut Table<'_>, sink: &mut Sink) -> Option<Backend> {
    let kind = table.string(sink, "type");
    match table.require(sink, "type", kind)?.as_str() {
        "datadog" => {
            let backend = read_datadog(table, sink);
            table.finish(sink, DATADOG_KEYS);
            Some(Backend::Datadog(backend?))
        }
        "prometheus" => {
            let url = table.text(sink, "url");
            let url = table.require(sink, "url", url).and_then(|url| checked_url(table, sink, url));
            table.finish(sink, PROMETHEUS_KEYS);
            Some(Backend::Prometheus(PrometheusBackend { url: url? }))
        }
        other => {
            table.report(sink, "type", format!("({other:?}) must be \"datadog\" or \"prometheus\""));
            // Which keys are allowed depends on the type, so there is nothing more to check.
            None
        }
    }
}

fn read_datadog(table: &mut Table<'_>, sink: &mut Sink) -> Option<DatadogBackend> {
    let site = table.text(sink, "site").unwrap_or_else(|| DEFAULT_DATADOG_SITE.to_string());
    let url = table.text(sink, "url").and_then(|url| checked_url(table, sink, url));
    let url_ok = !table.has("url") || url.is_some();
    let api_key = read_secret(table, sink, "api_key");
    let app_key = read_secret(table, sink, "app_key");
    if !url_ok {
        return None;
    }
    Some(DatadogBackend { site, url, api_key: api_key?, app_key: app_key? })
}

fn checked_url(table: &Table<'_>, sink: &mut Sink, url: String) -> Option<String> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Some(url)
    } else {
        table.report(sink, "url", format!("({url:?}) must start with http:// or https://"));
        None
    }
}

/// `NAME_env` or `NAME_file`, exactly one. A secret written inline is refused: rules files end up
/// in Git and ConfigMaps, where a key must never be.
fn read_secret(table: &mut Table<'_>, sink: &mut Sink, name: &str) -> Option<SecretSource> {
    let env_key = format!("{name}_env");
    let file_key = format!("{name}_file");
    if table.take(name).is_some() {
        // The value is not echoed: it is a secret.
        table.report(
            sink,
            name,
            format!("cannot be written in the rules file: secrets never go inline; set {env_key} (an environment variable) or {file_key} (a file holding the key)"),
        );
        // Still read the others, for their own problems.
        table.text(sink, &env_key);
        table.text(sink, &file_key);
        return None;
    }
    let env = table.text(sink, &env_key);
    let file = table.text(sink, &file_key);
    match (env, file) {
        (Some(_), Some(_)) => {
            table.report(sink, &file_key, format!("cannot be set together with {env_key}: choose one"));
            None
        }
        (Some(env), None) => Some(SecretSource::Env(env)),
        (None, Some(file)) => Some(SecretSource::File(PathBuf::from(file))),
        (None, None) => {
            if !table.has(&env_key) && !table.has(&file_key) {
                table.report(sink, name, format!("is required: set {env_key} or {file_key}"));
            }
            None
        }
    }
}
