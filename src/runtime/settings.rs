//! Daemon settings for `watermarkd run`: a settings file, then `WATERMARKD__...` environment
//! variables, then command-line flags, each layer over the one before (the `config` crate
//! merges the first two). Rules are not settings: they live in the rules file or in WPA
//! objects and can be reloaded; settings are read once at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::adapters::lease::{self, LeaseSettings};
use crate::adapters::listener::ListenerLimits;
use crate::adapters::status::access::allowed_host;
use crate::adapters::telemetry::logging::LogFormat;
use crate::adapters::telemetry::LabelsAsTags;
use crate::domain::crd::{check_tls_dir, AllowedUrl, RecommenderPolicy, ALLOWED_URLS_SETTING, TLS_DIR_SETTING};
use crate::domain::label_selector::LabelSelector;
use crate::domain::rules::{SecretSource, DEFAULT_INTERVAL};

/// Where the settings file is looked for when `--settings` is not given.
pub const DEFAULT_SETTINGS_FILE: &str = "/etc/watermarkd/watermarkd.toml";
/// Prefix of the environment variables; `__` separates nested keys (`WATERMARKD__LEASE__NAME`).
pub const ENV_PREFIX: &str = "WATERMARKD";

// The defaults of the settings no layer sets. `default_interval`'s is the rules file's
// (`rules::DEFAULT_INTERVAL`), the Lease's are `lease`'s and the listener limits'
// `ListenerLimits::DEFAULT`. The flags' help texts name them too (checked by a test below).
// Loopback: with no settings at all, the status API is open (no token), so only this machine may
// reach it. The Helm chart and the deploy/ manifests set `0.0.0.0:8080` (a pod is scraped and
// probed on its own address).
const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
const DEFAULT_LOG_FORMAT: LogFormat = LogFormat::Text;
const DEFAULT_LOG_LEVEL: &str = "info";
const DEFAULT_MAX_CONCURRENCY: usize = 64;
const DEFAULT_RELOAD_POLL: Duration = Duration::from_secs(1);
/// The backend of WPA metrics without an annotation.
const DEFAULT_BACKEND: &str = "datadog";
/// The shortest `default_interval`.
const MIN_DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// How much history the status board keeps of each autoscaler, and the most it may.
const DEFAULT_STATUS_HISTORY: Duration = Duration::from_secs(3_600);
const MAX_STATUS_HISTORY: Duration = Duration::from_secs(86_400);
/// The audience a reader's token must be minted for with `token_review`
/// (`kubectl create token NAME --audience watermarkd`): a token sent to the status listener, on
/// plain HTTP, is then good for nothing else, the API server included.
pub const DEFAULT_TOKEN_AUDIENCE: &str = "watermarkd";

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("settings file {path}: {message}")]
    File { path: String, message: String },
    #[error("settings: {0}")]
    Invalid(String),
}

/// Everything `watermarkd run` needs besides the rules.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The rules file. Required even with `crd`: it declares the backends WPA metrics go to.
    pub rules: PathBuf,
    /// Run the WatermarkPodAutoscaler objects of the cluster.
    pub crd: bool,
    /// Namespaces whose WPA objects to run; empty: all of them.
    pub namespaces: Vec<String>,
    /// The WPAs this daemon owns (`wpa_selector`, a label selector), so that it runs beside
    /// another WPA controller, each on its own set; the WPAs left out are the other's, and
    /// claim their targets. `None`: every WPA.
    pub wpa_selector: Option<LabelSelector>,
    /// `/metrics`, `/healthz` and `/readyz`.
    pub listen: SocketAddr,
    /// What one client may hold of that listener: `listen_max_connections`,
    /// `listen_header_timeout`, `listen_connection_timeout`.
    pub listen_limits: ListenerLimits,
    pub log_format: LogFormat,
    /// A `tracing` filter, e.g. `info` or `watermarkd=debug,kube=warn`.
    pub log_level: String,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// Interval of autoscalers that do not set one (and of every WPA).
    pub default_interval: Duration,
    /// Compute, log and export everything, write nothing to any target.
    pub dry_run: bool,
    /// Evaluations that may run at once.
    pub max_concurrency: usize,
    /// How often the rules file is checked for a change (it is also reloaded on SIGHUP).
    pub reload_poll: Duration,
    /// The backend (a `[backend.NAME]` of the rules file) that WPA metrics without an
    /// annotation are sent to.
    pub default_backend: String,
    /// The cluster named in replica recommender requests (`targetRef.cluster`) whose recommender
    /// names none: this setting, else the `K8S_CLUSTER_NAME` environment variable the Datadog
    /// controller reads, else none.
    pub cluster_name: Option<String>,
    pub lease: LeaseSettings,
    /// The WPA labels exported on `wpa_controller_labels_info` (the Datadog controller's
    /// `DD_LABELS_AS_TAGS`).
    pub labels_as_tags: LabelsAsTags,
    /// The recommender URLs a WPA may use (`recommender_allowed_urls`) and the directory its TLS
    /// files must be in (`recommender_tls_dir`); by default none. Rules-file autoscalers are
    /// the operator's own and not limited by it.
    pub recommender_policy: RecommenderPolicy,
    /// The status API and page on the listener (`[status]`).
    pub status: StatusSettings,
}

/// The status API and page (docs/status.md): whether they are served, how much history each
/// autoscaler keeps, and who may read them.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusSettings {
    pub enabled: bool,
    /// Kept per autoscaler, at its interval (0: no history, only the last decision).
    pub history: Duration,
    /// A bearer token every reader must send (`token_file` or `token_env`).
    pub token: Option<SecretSource>,
    /// Also accept a token the API server authenticates (a TokenReview) whose user RBAC allows
    /// to read the status (a SubjectAccessReview).
    pub token_review: bool,
    /// The TokenReview's audiences; empty: the API server's own.
    pub token_audiences: Vec<String>,
    /// Let connections from exactly 127.0.0.1 or ::1 in without a token (`kubectl
    /// port-forward`). Off unless set: a sidecar or a local proxy makes every request local.
    pub open_on_loopback: bool,
    /// Names a request let in without a token may carry in its Host header besides IP addresses
    /// and `localhost`; lower case, without a final dot.
    pub allowed_hosts: Vec<String>,
}

impl Default for StatusSettings {
    fn default() -> Self {
        StatusSettings {
            enabled: true,
            history: DEFAULT_STATUS_HISTORY,
            token: None,
            token_review: false,
            token_audiences: vec![DEFAULT_TOKEN_AUDIENCE.to_string()],
            open_on_loopback: false,
            allowed_hosts: Vec::new(),
        }
    }
}

/// The file/environment layer. Every field is optional so that a layer only says what it sets.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Layer {
    rules: Option<PathBuf>,
    crd: Option<bool>,
    namespaces: Option<StringList>,
    wpa_selector: Option<String>,
    listen: Option<String>,
    listen_max_connections: Option<usize>,
    listen_max_connections_per_peer: Option<usize>,
    listen_header_timeout: Option<String>,
    listen_connection_timeout: Option<String>,
    log_format: Option<LogFormat>,
    log_level: Option<String>,
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    default_interval: Option<String>,
    dry_run: Option<bool>,
    max_concurrency: Option<usize>,
    reload_poll: Option<String>,
    default_backend: Option<String>,
    cluster_name: Option<String>,
    labels_as_tags: Option<StringList>,
    recommender_allowed_urls: Option<StringList>,
    recommender_tls_dir: Option<PathBuf>,
    lease: Option<LeaseLayer>,
    status: Option<StatusLayer>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusLayer {
    enabled: Option<bool>,
    history: Option<String>,
    token_file: Option<PathBuf>,
    token_env: Option<String>,
    token_review: Option<bool>,
    token_audiences: Option<StringList>,
    open_on_loopback: Option<bool>,
    allowed_hosts: Option<StringList>,
}

impl StatusLayer {
    fn merge(self) -> Result<StatusSettings, SettingsError> {
        let defaults = StatusSettings::default();
        let history = duration("status.history", self.history, defaults.history)?;
        if history > MAX_STATUS_HISTORY {
            return Err(SettingsError::Invalid(format!(
                "status.history: {} is more than {}",
                humantime::format_duration(history),
                humantime::format_duration(MAX_STATUS_HISTORY)
            )));
        }
        let token = match (self.token_file, self.token_env) {
            (Some(_), Some(_)) => {
                return Err(SettingsError::Invalid(
                    "status: token_file and token_env cannot both be set; choose one".into(),
                ))
            }
            (Some(path), None) => Some(SecretSource::File(path)),
            (None, Some(variable)) if variable.trim().is_empty() => {
                return Err(SettingsError::Invalid("status.token_env: the variable name is empty".into()))
            }
            (None, Some(variable)) => Some(SecretSource::Env(variable)),
            (None, None) => None,
        };
        let token_audiences = match self.token_audiences {
            None => defaults.token_audiences,
            Some(list) => {
                let audiences: Vec<String> = list.into_vec().into_iter().map(|a| a.trim().to_string()).collect();
                if let Some(at) = audiences.iter().position(String::is_empty) {
                    return Err(SettingsError::Invalid(format!("status.token_audiences[{at}]: an audience is empty")));
                }
                audiences
            }
        };
        let mut allowed_hosts = Vec::new();
        for (at, name) in self.allowed_hosts.map(StringList::into_vec).unwrap_or_default().iter().enumerate() {
            let Some(host) = allowed_host(name) else {
                return Err(SettingsError::Invalid(format!(
                    "status.allowed_hosts[{at}]: {name:?} is not a host name (letters, digits, '-' and '.'; \
                     no scheme, port or wildcard)"
                )));
            };
            allowed_hosts.push(host);
        }
        Ok(StatusSettings {
            enabled: self.enabled.unwrap_or(defaults.enabled),
            history,
            token,
            token_review: self.token_review.unwrap_or(defaults.token_review),
            token_audiences,
            open_on_loopback: self.open_on_loopback.unwrap_or(defaults.open_on_loopback),
            allowed_hosts,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseLayer {
    enabled: Option<bool>,
    name: Option<String>,
    namespace: Option<String>,
    identity: Option<String>,
    duration: Option<String>,
    renew_deadline: Option<String>,
    retry_period: Option<String>,
}

/// A list in the file, or a comma-separated string in the environment.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StringList {
    List(Vec<String>),
    Text(String),
}

impl StringList {
    fn into_vec(self) -> Vec<String> {
        match self {
            StringList::List(items) => items,
            StringList::Text(text) => {
                text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
            }
        }
    }
}

/// The command-line layer: flags override the file and the environment.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct RunArgs {
    /// The rules file to run (reloaded when it changes and on SIGHUP).
    #[arg(long, value_name = "FILE", visible_alias = "config")]
    pub rules: Option<PathBuf>,
    /// Also run the WatermarkPodAutoscaler objects in the cluster.
    #[arg(long)]
    pub crd: bool,
    /// The daemon settings file (default /etc/watermarkd/watermarkd.toml when it exists).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// Namespace of the WPA objects to run (repeat for several; default all).
    #[arg(long = "namespace", value_name = "NAMESPACE")]
    pub namespaces: Vec<String>,
    /// Run only the WPA objects this label selector matches (e.g.
    /// watermarkd.io/controller=watermarkd); the others are another controller's (default all).
    #[arg(long, value_name = "SELECTOR")]
    pub wpa_selector: Option<String>,
    /// Address of /metrics, /healthz, /readyz and the status page (default 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter, e.g. `info` or `watermarkd=debug`.
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// The kubeconfig to use (default: KUBECONFIG, ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Interval of autoscalers that set none (default 15s).
    #[arg(long, value_name = "DURATION")]
    pub default_interval: Option<String>,
    /// Decide and report, never write replicas.
    #[arg(long)]
    pub dry_run: bool,
    /// Evaluations that may run at once (default 64).
    #[arg(long, value_name = "N")]
    pub max_concurrency: Option<usize>,
    /// Run without a Lease (only when exactly one daemon runs).
    #[arg(long)]
    pub no_leader_election: bool,
    /// This daemon's name in the Lease (default: POD_NAME, else the host name).
    #[arg(long, value_name = "NAME")]
    pub identity: Option<String>,
    /// Name of the Lease (default watermarkd).
    #[arg(long, value_name = "NAME")]
    pub lease_name: Option<String>,
    /// Namespace of the Lease (default: the pod's namespace, else watermarkd).
    #[arg(long, value_name = "NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// How long the Lease holds without renewal (default 15s).
    #[arg(long, value_name = "DURATION")]
    pub lease_duration: Option<String>,
}

/// The process environment the defaults depend on, passed in so tests control it.
#[derive(Clone, Debug, Default)]
pub struct Environment {
    /// `WATERMARKD__...` variables (full names).
    pub variables: Vec<(String, String)>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    pub hostname: Option<String>,
    /// `K8S_CLUSTER_NAME`, the default of `cluster_name`.
    pub cluster_name: Option<String>,
    /// `DD_LABELS_AS_TAGS`: the Datadog controller's labels-as-tags, space-separated, used
    /// when `labels_as_tags` is not set, so its deployment's environment carries over.
    pub dd_labels_as_tags: Option<String>,
}

impl Environment {
    /// Reads the real environment.
    pub fn current() -> Self {
        let variables = std::env::vars().filter(|(k, _)| k.starts_with(&format!("{ENV_PREFIX}__"))).collect();
        let non_empty = |v: String| if v.trim().is_empty() { None } else { Some(v.trim().to_string()) };
        let pod_namespace = std::env::var("POD_NAMESPACE").ok().and_then(non_empty).or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok().and_then(non_empty)
        });
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .and_then(non_empty)
            .or_else(|| std::env::var("HOSTNAME").ok().and_then(non_empty));
        Environment {
            variables,
            pod_name: std::env::var("POD_NAME").ok().and_then(non_empty),
            pod_namespace,
            hostname,
            cluster_name: std::env::var(crate::adapters::backend::recommender::CLUSTER_NAME_ENV)
                .ok()
                .and_then(non_empty),
            dd_labels_as_tags: std::env::var("DD_LABELS_AS_TAGS").ok(),
        }
    }
}

impl Settings {
    /// Merges the settings file (the one named, or the default one if it exists), the
    /// environment and the flags, and checks the result.
    pub fn load(args: &RunArgs, env: &Environment) -> Result<Settings, SettingsError> {
        let file = match &args.settings {
            Some(path) => Some(path.clone()),
            None => Some(PathBuf::from(DEFAULT_SETTINGS_FILE)).filter(|p| p.exists()),
        };
        let mut builder = config::Config::builder();
        if let Some(path) = &file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| SettingsError::File { path: path.display().to_string(), message: e.to_string() })?;
            builder = builder.add_source(config::File::from_str(&text, config::FileFormat::Toml));
        }
        let variables: config::Map<String, String> = env.variables.iter().cloned().collect();
        builder = builder.add_source(
            config::Environment::with_prefix(ENV_PREFIX)
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .source(Some(variables)),
        );
        let origin = file.as_deref().map_or_else(|| "environment".to_string(), |p| p.display().to_string());
        let layer: Layer = builder
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| SettingsError::File { path: origin, message: e.to_string() })?;
        Self::merge(layer, args, env)
    }

    /// Each setting from the highest layer that sets it (flags, then the environment and the
    /// file, which `load` has already merged), else its default; checked in the order of the
    /// fields, so that the first problem is the one reported.
    fn merge(layer: Layer, args: &RunArgs, env: &Environment) -> Result<Settings, SettingsError> {
        let listen_limits = listen_limits(&layer)?;
        let listen = listen(args.listen.clone().or(layer.listen))?;
        let default_interval = default_interval(args.default_interval.clone().or(layer.default_interval))?;
        let max_concurrency = args.max_concurrency.or(layer.max_concurrency).unwrap_or(DEFAULT_MAX_CONCURRENCY);
        if max_concurrency == 0 {
            return Err(SettingsError::Invalid("max_concurrency: must be at least 1".into()));
        }
        let lease = layer.lease.unwrap_or_default().merge(args, env)?;
        let namespaces = namespaces(&args.namespaces, layer.namespaces);
        let wpa_selector = args
            .wpa_selector
            .clone()
            .or(layer.wpa_selector)
            .map(|text| LabelSelector::parse(&text).map_err(|e| SettingsError::Invalid(format!("wpa_selector: {e}"))))
            .transpose()?;
        let labels_as_tags = labels_as_tags(layer.labels_as_tags, env)?;
        let recommender_policy =
            recommender_policy(layer.recommender_allowed_urls.map(StringList::into_vec), layer.recommender_tls_dir)?;
        let crd = args.crd || layer.crd.unwrap_or(false);
        let reload_poll = duration("reload_poll", layer.reload_poll, DEFAULT_RELOAD_POLL)?;
        let rules = rules(args.rules.clone().or(layer.rules), crd)?;
        let status = layer.status.unwrap_or_default().merge()?;
        Ok(Settings {
            rules,
            crd,
            namespaces,
            wpa_selector,
            listen,
            listen_limits,
            log_format: args.log_format.or(layer.log_format).unwrap_or(DEFAULT_LOG_FORMAT),
            log_level: args.log_level.clone().or(layer.log_level).unwrap_or_else(|| DEFAULT_LOG_LEVEL.into()),
            kubeconfig: args.kubeconfig.clone().or(layer.kubeconfig),
            context: args.context.clone().or(layer.context),
            default_interval,
            dry_run: args.dry_run || layer.dry_run.unwrap_or(false),
            max_concurrency,
            reload_poll,
            default_backend: layer.default_backend.unwrap_or_else(|| DEFAULT_BACKEND.into()),
            cluster_name: layer.cluster_name.filter(|name| !name.is_empty()).or_else(|| env.cluster_name.clone()),
            lease,
            labels_as_tags,
            recommender_policy,
            status,
        })
    }
}

impl LeaseLayer {
    /// The Lease settings: the flags over this layer, then the pod's environment, then the
    /// defaults of `lease`; checked as the elector needs them.
    fn merge(self, args: &RunArgs, env: &Environment) -> Result<LeaseSettings, SettingsError> {
        let identity = args
            .identity
            .clone()
            .or(self.identity)
            .or_else(|| env.pod_name.clone())
            .or_else(|| env.hostname.clone())
            .unwrap_or_else(|| format!("watermarkd-{}", std::process::id()));
        let settings = LeaseSettings {
            enabled: !args.no_leader_election && self.enabled.unwrap_or(true),
            name: args.lease_name.clone().or(self.name).unwrap_or_else(|| lease::DEFAULT_NAME.into()),
            namespace: args
                .lease_namespace
                .clone()
                .or(self.namespace)
                .or_else(|| env.pod_namespace.clone())
                .unwrap_or_else(|| lease::DEFAULT_NAMESPACE.into()),
            identity,
            lease_duration: duration(
                "lease.duration",
                args.lease_duration.clone().or(self.duration),
                lease::DEFAULT_LEASE_DURATION,
            )?,
            renew_deadline: duration("lease.renew_deadline", self.renew_deadline, lease::DEFAULT_RENEW_DEADLINE)?,
            retry_period: duration("lease.retry_period", self.retry_period, lease::DEFAULT_RETRY_PERIOD)?,
        };
        settings.validate().map_err(SettingsError::Invalid)?;
        Ok(settings)
    }
}

fn listen(text: Option<String>) -> Result<SocketAddr, SettingsError> {
    let text = text.unwrap_or_else(|| DEFAULT_LISTEN.into());
    text.parse()
        .map_err(|_| SettingsError::Invalid(format!("listen: {text:?} is not an address like {DEFAULT_LISTEN}")))
}

fn default_interval(text: Option<String>) -> Result<Duration, SettingsError> {
    let interval = duration("default_interval", text, DEFAULT_INTERVAL)?;
    if interval < MIN_DEFAULT_INTERVAL {
        return Err(SettingsError::Invalid(format!(
            "default_interval: must be at least {}",
            humantime::format_duration(MIN_DEFAULT_INTERVAL)
        )));
    }
    Ok(interval)
}

/// The flags' namespaces, else the layer's; sorted, each once.
fn namespaces(flags: &[String], layer: Option<StringList>) -> Vec<String> {
    let mut namespaces =
        if flags.is_empty() { layer.map(StringList::into_vec).unwrap_or_default() } else { flags.to_vec() };
    namespaces.sort();
    namespaces.dedup();
    namespaces
}

/// The setting, else the Datadog controller's `DD_LABELS_AS_TAGS` (space-separated).
fn labels_as_tags(layer: Option<StringList>, env: &Environment) -> Result<LabelsAsTags, SettingsError> {
    let labels = match layer {
        Some(list) => list.into_vec(),
        None => env
            .dd_labels_as_tags
            .as_deref()
            .map(|text| text.split_whitespace().map(String::from).collect())
            .unwrap_or_default(),
    };
    LabelsAsTags::new(&labels).map_err(SettingsError::Invalid)
}

/// The rules file, which every run needs (see [`Settings::rules`]).
fn rules(rules: Option<PathBuf>, crd: bool) -> Result<PathBuf, SettingsError> {
    rules.ok_or_else(|| {
        SettingsError::Invalid(if crd {
            "--crd needs a rules file (--rules or `rules`) that declares the backends WPA metrics are sent to".into()
        } else {
            "nothing to run: give a rules file (--rules or `rules`), and --crd to run WPA objects too".into()
        })
    })
}

/// The listener's limits, each at least 1 (or 1s) and the timeouts at most an hour.
fn listen_limits(layer: &Layer) -> Result<ListenerLimits, SettingsError> {
    const SHORTEST: Duration = Duration::from_millis(100);
    const LONGEST: Duration = Duration::from_secs(3600);
    let defaults = ListenerLimits::DEFAULT;
    let max_connections = layer.listen_max_connections.unwrap_or(defaults.max_connections);
    if max_connections == 0 {
        return Err(SettingsError::Invalid("listen_max_connections: must be at least 1".into()));
    }
    let max_connections_per_peer = layer.listen_max_connections_per_peer.unwrap_or(defaults.max_connections_per_peer);
    if max_connections_per_peer == 0 {
        return Err(SettingsError::Invalid("listen_max_connections_per_peer: must be at least 1".into()));
    }
    let header_timeout =
        duration("listen_header_timeout", layer.listen_header_timeout.clone(), defaults.header_timeout)?;
    let connection_timeout =
        duration("listen_connection_timeout", layer.listen_connection_timeout.clone(), defaults.connection_timeout)?;
    for (field, value) in [("listen_header_timeout", header_timeout), ("listen_connection_timeout", connection_timeout)]
    {
        if value < SHORTEST || value > LONGEST {
            return Err(SettingsError::Invalid(format!(
                "{field}: {} must be between {} and {}",
                humantime::format_duration(value),
                humantime::format_duration(SHORTEST),
                humantime::format_duration(LONGEST)
            )));
        }
    }
    if header_timeout > connection_timeout {
        return Err(SettingsError::Invalid(format!(
            "listen_header_timeout ({}) must not be longer than listen_connection_timeout ({})",
            humantime::format_duration(header_timeout),
            humantime::format_duration(connection_timeout)
        )));
    }
    Ok(ListenerLimits { max_connections, max_connections_per_peer, header_timeout, connection_timeout, ..defaults })
}

/// The longest duration a setting takes (intervals, lease times, the reload poll): a day, as
/// for the rules file's durations, so that no time computed from one can overflow.
const MAX_SETTING_DURATION: Duration = Duration::from_secs(86_400);

/// `recommender_allowed_urls` (each an origin with an optional path prefix) and
/// `recommender_tls_dir` (an absolute path; that it exists is the pod's business, checked when
/// a file in it is read).
fn recommender_policy(
    allowed: Option<Vec<String>>,
    tls_dir: Option<PathBuf>,
) -> Result<RecommenderPolicy, SettingsError> {
    let allowed = allowed
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            AllowedUrl::parse(entry)
                .map_err(|why| SettingsError::Invalid(format!("{ALLOWED_URLS_SETTING}[{index}] {why}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tls_dir = tls_dir.filter(|dir| !dir.as_os_str().is_empty());
    if let Some(dir) = &tls_dir {
        check_tls_dir(dir).map_err(|why| SettingsError::Invalid(format!("{TLS_DIR_SETTING}: {why}")))?;
    }
    Ok(RecommenderPolicy::new(allowed, tls_dir))
}

fn duration(field: &str, text: Option<String>, default: Duration) -> Result<Duration, SettingsError> {
    let Some(text) = text else { return Ok(default) };
    let value = humantime::parse_duration(text.trim())
        .map_err(|e| SettingsError::Invalid(format!("{field}: {text:?} is not a duration like 15s ({e})")))?;
    if value > MAX_SETTING_DURATION {
        return Err(SettingsError::Invalid(format!(
            "{field}: {text:?} must be at most {} ({}s)",
            humantime::format_duration(MAX_SETTING_DURATION),
            MAX_SETTING_DURATION.as_secs()
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(variables: &[(&str, &str)]) -> Environment {
        Environment {
            variables: variables.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            pod_name: None,
            pod_namespace: None,
            hostname: Some("host-a".into()),
            cluster_name: None,
            dd_labels_as_tags: None,
        }
    }

    fn args_with_file(text: &str) -> (tempfile::TempDir, RunArgs) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("watermarkd.toml");
        std::fs::write(&path, text).expect("write settings");
        (dir, RunArgs { settings: Some(path), ..RunArgs::default() })
    }

    #[test]
    fn defaults_need_something_to_run() {
        let (_dir, args) = args_with_file("");
        let err = Settings::load(&args, &env(&[])).expect_err("nothing to run");
        assert!(err.to_string().contains("nothing to run"), "{err}");
        let (_dir, args) = args_with_file("crd = true\n");
        let err = Settings::load(&args, &env(&[])).expect_err("no backends for WPAs");
        assert!(err.to_string().contains("declares the backends"), "{err}");
    }

    #[test]
    fn file_then_environment_then_flags() {
        let (_dir, mut args) = args_with_file(
            "rules = \"/etc/watermarkd/rules.toml\"\nlog_level = \"debug\"\nlisten = \"127.0.0.1:9000\"\n\
             namespaces = [\"b\", \"a\"]\n[lease]\nname = \"from-file\"\n",
        );
        let environment = env(&[("WATERMARKD__LOG_LEVEL", "warn"), ("WATERMARKD__LEASE__NAME", "from-env")]);
        let settings = Settings::load(&args, &environment).expect("valid");
        assert_eq!(settings.rules, std::path::Path::new("/etc/watermarkd/rules.toml"));
        assert_eq!(settings.log_level, "warn");
        assert_eq!(settings.lease.name, "from-env");
        assert_eq!(settings.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(settings.namespaces, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(settings.lease.identity, "host-a");
        assert_eq!(settings.default_interval, Duration::from_secs(15));

        args.log_level = Some("error".into());
        args.lease_name = Some("from-flag".into());
        args.dry_run = true;
        let settings = Settings::load(&args, &environment).expect("valid");
        assert_eq!(settings.log_level, "error");
        assert_eq!(settings.lease.name, "from-flag");
        assert!(settings.dry_run);
    }

    #[test]
    fn environment_lists_are_comma_separated() {
        let (_dir, args) = args_with_file("crd = true\nrules = \"r.toml\"\n");
        let settings = Settings::load(&args, &env(&[("WATERMARKD__NAMESPACES", "prod, staging")])).expect("valid");
        assert_eq!(settings.namespaces, vec!["prod".to_string(), "staging".to_string()]);
    }

    #[test]
    fn labels_as_tags_come_from_the_settings_or_the_datadog_variable() {
        let (_dir, args) = args_with_file("rules = \"r.toml\"\n");
        let mut environment = env(&[]);
        environment.dd_labels_as_tags = Some(" team  app.kubernetes.io/name ".into());
        let settings = Settings::load(&args, &environment).expect("valid");
        assert_eq!(settings.labels_as_tags, LabelsAsTags::new(&["team", "app.kubernetes.io/name"]).expect("valid"));

        let (_dir, args) = args_with_file("rules = \"r.toml\"\nlabels_as_tags = [\"service\"]\n");
        let settings = Settings::load(&args, &environment).expect("valid");
        assert_eq!(settings.labels_as_tags, LabelsAsTags::new(&["service"]).expect("valid"), "the setting wins");

        let (_dir, args) = args_with_file("rules = \"r.toml\"\nlabels_as_tags = [\"wpa_name\"]\n");
        let err = Settings::load(&args, &env(&[])).expect_err("collides with a join label");
        assert!(err.to_string().contains("labels_as_tags"), "{err}");
    }

    #[test]
    fn the_wpa_selector_comes_from_the_file_the_environment_or_the_flag() {
        let (_dir, mut args) =
            args_with_file("rules = \"r.toml\"\nwpa_selector = \"watermarkd.io/controller=watermarkd\"\n");
        let settings = Settings::load(&args, &env(&[])).expect("valid");
        assert_eq!(
            settings.wpa_selector.as_ref().map(LabelSelector::as_str),
            Some("watermarkd.io/controller=watermarkd")
        );
        let settings = Settings::load(&args, &env(&[("WATERMARKD__WPA_SELECTOR", "team in (a,b)")])).expect("valid");
        assert_eq!(settings.wpa_selector.as_ref().map(LabelSelector::as_str), Some("team in (a,b)"));
        args.wpa_selector = Some("tier=web".into());
        let settings = Settings::load(&args, &env(&[])).expect("valid");
        assert_eq!(settings.wpa_selector.as_ref().map(LabelSelector::as_str), Some("tier=web"));
        let (_dir, args) = args_with_file("rules = \"r.toml\"\n");
        assert_eq!(Settings::load(&args, &env(&[])).expect("valid").wpa_selector, None, "unset: every WPA");
    }

    #[test]
    fn bad_values_name_their_field() {
        for (text, field) in [
            ("rules = \"r\"\ndefault_interval = \"soon\"\n", "default_interval"),
            ("rules = \"r\"\ndefault_interval = \"500ms\"\n", "default_interval"),
            (
                "rules = \"r\"\ndefault_interval = \"2days\"\n",
                "default_interval: \"2days\" must be at most 1day (86400s)",
            ),
            ("rules = \"r\"\nreload_poll = \"9999999999999s\"\n", "reload_poll"),
            ("rules = \"r\"\nlisten = \"everywhere\"\n", "listen"),
            ("rules = \"r\"\n[lease]\nduration = \"5s\"\n", "lease.renew_deadline"),
            ("rules = \"r\"\nmax_concurrency = 0\n", "max_concurrency"),
            ("rules = \"r\"\nlisten_max_connections = 0\n", "listen_max_connections"),
            ("rules = \"r\"\nlisten_max_connections_per_peer = 0\n", "listen_max_connections_per_peer"),
            ("rules = \"r\"\nlisten_header_timeout = \"0s\"\n", "listen_header_timeout"),
            ("rules = \"r\"\nlisten_connection_timeout = \"2h\"\n", "listen_connection_timeout"),
            (
                "rules = \"r\"\nlisten_header_timeout = \"30s\"\nlisten_connection_timeout = \"10s\"\n",
                "listen_header_timeout (30s)",
            ),
            ("rules = \"r\"\nlog_levl = \"x\"\n", "log_levl"),
            ("rules = \"r\"\nwpa_selector = \"a in b\"\n", "wpa_selector: label selector \"a in b\""),
            ("rules = \"r\"\nwpa_selector = \"\"\n", "wpa_selector: label selector \"\": is empty"),
        ] {
            let (_dir, args) = args_with_file(text);
            let err = Settings::load(&args, &env(&[])).expect_err(text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
    }

    #[test]
    fn the_cluster_name_is_the_setting_else_k8s_cluster_name() {
        let (_dir, args) = args_with_file("rules = \"r.toml\"\n");
        assert_eq!(Settings::load(&args, &env(&[])).expect("valid").cluster_name, None);
        let from_datadog_variable = Environment { cluster_name: Some("eu-1".into()), ..env(&[]) };
        assert_eq!(Settings::load(&args, &from_datadog_variable).expect("valid").cluster_name.as_deref(), Some("eu-1"));
        let (_dir, args) = args_with_file("rules = \"r.toml\"\ncluster_name = \"us-2\"\n");
        assert_eq!(Settings::load(&args, &from_datadog_variable).expect("valid").cluster_name.as_deref(), Some("us-2"));
        let overridden =
            Environment { cluster_name: Some("eu-1".into()), ..env(&[("WATERMARKD__CLUSTER_NAME", "ap-3")]) };
        assert_eq!(Settings::load(&args, &overridden).expect("valid").cluster_name.as_deref(), Some("ap-3"));
    }

    #[test]
    fn leader_election_off_keeps_the_identity_and_the_checks() {
        let (_dir, mut args) = args_with_file("rules = \"r.toml\"\n[lease]\nname = \"from-file\"\n");
        args.no_leader_election = true;
        let settings = Settings::load(&args, &env(&[])).expect("valid");
        assert!(!settings.lease.enabled);
        assert_eq!(settings.lease.identity, "host-a", "Events still name this daemon");
        assert_eq!(settings.lease.lease_duration, lease::DEFAULT_LEASE_DURATION);
        args.lease_duration = Some("5s".into());
        let err = Settings::load(&args, &env(&[])).expect_err("renew deadline past the duration");
        assert!(
            err.to_string().contains("lease.renew_deadline (10s) must be shorter than lease.duration (5s)"),
            "{err}"
        );
    }

    #[test]
    fn the_listener_limits_default_and_can_be_set() {
        let (_dir, args) = args_with_file("rules = \"r.toml\"\n");
        assert_eq!(Settings::load(&args, &env(&[])).expect("valid").listen_limits, ListenerLimits::DEFAULT);
        let (_dir, args) = args_with_file(
            "rules = \"r.toml\"\nlisten_max_connections = 8\nlisten_header_timeout = \"2s\"\n\
             listen_connection_timeout = \"30s\"\nlisten_max_connections_per_peer = 4\n",
        );
        let settings = Settings::load(&args, &env(&[("WATERMARKD__LISTEN_MAX_CONNECTIONS", "16")])).expect("valid");
        assert_eq!(
            settings.listen_limits,
            ListenerLimits {
                max_connections: 16,
                max_connections_per_peer: 4,
                probe_reserve: ListenerLimits::DEFAULT.probe_reserve,
                header_timeout: Duration::from_secs(2),
                connection_timeout: Duration::from_secs(30)
            }
        );
    }

    #[test]
    fn recommender_limits_come_from_the_file_or_the_environment_and_are_checked() {
        let (_dir, args) = args_with_file("rules = \"r.toml\"\n");
        let settings = Settings::load(&args, &env(&[])).expect("valid");
        assert_eq!(settings.recommender_policy, RecommenderPolicy::default(), "none allowed by default");
        assert!(settings.recommender_policy.url_problem("http://reco/").is_some());

        let tls = tempfile::tempdir().expect("temp dir");
        let (_dir, args) = args_with_file(&format!(
            "rules = \"r.toml\"\nrecommender_allowed_urls = [\"https://reco.svc:8443/api\"]\n\
             recommender_tls_dir = \"{}\"\n",
            tls.path().display()
        ));
        let policy = Settings::load(&args, &env(&[])).expect("valid").recommender_policy;
        assert_eq!(policy.url_problem("https://reco.svc:8443/api/recommend"), None);
        assert!(policy.url_problem("https://reco.svc:8443/admin").is_some());
        assert_eq!(policy.tls_dir(), Some(tls.path()));

        let (_dir, args) = args_with_file("rules = \"r.toml\"\n");
        let from_env = [("WATERMARKD__RECOMMENDER_ALLOWED_URLS", "http://a.svc, https://b.svc/x")];
        let policy = Settings::load(&args, &env(&from_env)).expect("valid").recommender_policy;
        assert_eq!((policy.url_problem("http://a.svc/r"), policy.url_problem("https://b.svc/x/r")), (None, None));

        for (text, expected) in [
            ("recommender_allowed_urls = [\"https://a\", \"reco:80\"]", "recommender_allowed_urls[1] must start with"),
            (
                "recommender_allowed_urls = [\"https://u:p@a\"]",
                "recommender_allowed_urls[0] must not carry credentials",
            ),
            ("recommender_tls_dir = \"certs\"", "recommender_tls_dir: certs must be an absolute path"),
            ("recommender_tls_dir = \"/a/../certs\"", "recommender_tls_dir: /a/../certs must not contain \"..\""),
        ] {
            let (_dir, args) = args_with_file(&format!("rules = \"r.toml\"\n{text}\n"));
            let err = Settings::load(&args, &env(&[])).expect_err(text).to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn the_flags_help_names_the_defaults() {
        use clap::Args as _;
        let command = RunArgs::augment_args(clap::Command::new("run"));
        let help = |id: &str| {
            command
                .get_arguments()
                .find(|arg| arg.get_id() == id)
                .and_then(|arg| arg.get_help())
                .map(ToString::to_string)
                .unwrap_or_default()
        };
        let default = |value: String| format!("(default {value})");
        for (id, expected) in [
            ("listen", default(DEFAULT_LISTEN.to_string())),
            ("default_interval", default(humantime::format_duration(DEFAULT_INTERVAL).to_string())),
            ("max_concurrency", default(DEFAULT_MAX_CONCURRENCY.to_string())),
            ("lease_name", default(lease::DEFAULT_NAME.to_string())),
            ("lease_duration", default(humantime::format_duration(lease::DEFAULT_LEASE_DURATION).to_string())),
        ] {
            assert!(help(id).contains(&expected), "--{id}: {:?} does not say {expected}", help(id));
        }
    }

    #[test]
    fn a_named_settings_file_must_exist() {
        let args = RunArgs { settings: Some("/nonexistent/watermarkd.toml".into()), crd: true, ..RunArgs::default() };
        let err = Settings::load(&args, &env(&[])).expect_err("missing file");
        assert!(err.to_string().contains("/nonexistent/watermarkd.toml"), "{err}");
    }

    #[test]
    fn with_no_settings_the_listener_is_this_machine_s_and_the_status_open_to_it_only() {
        let (_dir, args) = args_with_file("rules = \"r.toml\"\n");
        let settings = Settings::load(&args, &env(&[])).expect("valid");
        assert_eq!(settings.listen.to_string(), "127.0.0.1:8080");
        assert!(settings.listen.ip().is_loopback());
        assert_eq!(
            settings.status,
            StatusSettings {
                enabled: true,
                history: DEFAULT_STATUS_HISTORY,
                token: None,
                token_review: false,
                token_audiences: vec!["watermarkd".into()],
                open_on_loopback: false,
                allowed_hosts: Vec::new(),
            }
        );
    }

    #[test]
    fn status_audiences_and_allowed_hosts_from_the_file_and_the_environment() {
        let (_dir, args) = args_with_file(
            "rules = \"r.toml\"\n[status]\ntoken_review = true\ntoken_audiences = [\"status\", \"other\"]\n\
             allowed_hosts = [\"Status.Example.COM.\", \"watermarkd-metrics.watermarkd.svc\"]\n",
        );
        let status = Settings::load(&args, &env(&[])).expect("valid").status;
        assert_eq!(status.token_audiences, ["status", "other"]);
        assert_eq!(status.allowed_hosts, ["status.example.com", "watermarkd-metrics.watermarkd.svc"]);
        assert!(!status.open_on_loopback, "off unless set, token or not");
        let (_dir, args) = args_with_file("rules = \"r.toml\"\n[status]\ntoken_audiences = []\n");
        assert!(Settings::load(&args, &env(&[])).expect("valid").status.token_audiences.is_empty());
        let (_dir, args) = args_with_file("rules = \"r.toml\"\n");
        let environment = env(&[
            ("WATERMARKD__STATUS__ALLOWED_HOSTS", "a.example, b.example"),
            ("WATERMARKD__STATUS__TOKEN_AUDIENCES", "x"),
            ("WATERMARKD__STATUS__OPEN_ON_LOOPBACK", "true"),
        ]);
        let status = Settings::load(&args, &environment).expect("valid").status;
        assert_eq!(status.allowed_hosts, ["a.example", "b.example"]);
        assert_eq!(status.token_audiences, ["x"]);
        assert!(status.open_on_loopback);
        for (text, field) in [
            ("[status]\nallowed_hosts = [\"ok.example\", \"http://x.example\"]\n", "status.allowed_hosts[1]"),
            ("[status]\nallowed_hosts = [\"x.example:8080\"]\n", "status.allowed_hosts[0]"),
            ("[status]\nallowed_hosts = [\"*.example\"]\n", "no scheme, port or wildcard"),
            ("[status]\ntoken_audiences = [\"a\", \" \"]\n", "status.token_audiences[1]: an audience is empty"),
        ] {
            let (_dir, args) = args_with_file(&format!("rules = \"r.toml\"\n{text}"));
            let err = Settings::load(&args, &env(&[])).expect_err(text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
    }
}
