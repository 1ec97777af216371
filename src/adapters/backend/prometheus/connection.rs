//! Everything fixed when a Prometheus backend is built: the endpoint, the HTTP client (TLS, default
//! headers, timeout), extra parameters and credentials.

use std::path::Path;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT};
use reqwest::{Certificate, ClientBuilder, Identity, RequestBuilder, Url};

use crate::adapters::backend::BackendError;
use crate::adapters::secret::RotatingSecret;
use crate::domain::rules::{PrometheusBackend, TlsSettings};

/// Query parameters watermarkd sets itself on every request.
const OWN_PARAMS: &[&str] = &["query", "time"];

pub(super) struct Connection {
    pub client: reqwest::Client,
    /// `<url>/api/v1/query`, keeping the url's path prefix.
    pub endpoint: Url,
    /// `<url>/api/v1/query_range`, for backtests.
    pub range_endpoint: Url,
    /// The endpoint for messages: without user info or query string.
    pub display_endpoint: String,
    /// `params` from the configuration, sent after `query` and `time`.
    pub params: Vec<(String, String)>,
    pub auth: Auth,
}

impl Connection {
    pub fn new(name: &str, config: &PrometheusBackend) -> Result<Self, BackendError> {
        let invalid = |message: String| BackendError::Invalid { backend: name.to_string(), message };
        let endpoint = endpoint(&config.url).map_err(invalid)?;
        let mut display = endpoint.clone();
        // Only fails for URLs that cannot have user info, which an http(s) URL always can.
        let _ = display.set_username("");
        let _ = display.set_password(None);
        display.set_query(None);

        if let Some(own) = config.params.keys().find(|k| OWN_PARAMS.contains(&k.as_str())) {
            return Err(invalid(format!("params.{own} is set by watermarkd itself for every query: remove it")));
        }
        let params = config.params.iter().map(|(k, v)| (k.clone(), v.clone())).collect();

        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .user_agent(concat!("watermarkd/", env!("CARGO_PKG_VERSION")))
            .redirect(crate::adapters::backend::trust::redirect_policy())
            .default_headers(headers(config).map_err(invalid)?);
        builder = tls(builder, name, &config.tls).map_err(invalid)?;
        let client = builder.build().map_err(|e| invalid(format!("cannot set up the HTTP client: {}", chain(&e))))?;

        if config.basic_auth.is_some() && config.bearer_token.is_some() {
            return Err(invalid("basic_auth and bearer_token exclude each other: keep one".into()));
        }
        let secret_error = |cause| BackendError::Secret { backend: name.to_string(), cause };
        let auth = match (&config.basic_auth, &config.bearer_token) {
            (Some(basic), _) => Auth::Basic {
                username: basic.username.clone(),
                password: RotatingSecret::load(&basic.password).map_err(secret_error)?,
            },
            (None, Some(source)) => Auth::Bearer(RotatingSecret::load(source).map_err(secret_error)?),
            (None, None) => Auth::None,
        };

        let mut range_endpoint = endpoint.clone();
        range_endpoint.set_path(&format!("{}_range", endpoint.path()));
        Ok(Connection { client, endpoint, range_endpoint, display_endpoint: display.to_string(), params, auth })
    }
}

/// `<url>/api/v1/query`: the url's path prefix (`/prometheus`, `/select/0/prometheus`) is kept,
/// with or without a trailing slash.
pub(super) fn endpoint(url: &str) -> Result<Url, String> {
    // The url is not quoted back: it may carry a password (`https://user:pass@host`).
    let mut parsed = Url::parse(url.trim()).map_err(|e| format!("url is not a valid URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.cannot_be_a_base() {
        return Err("url must start with http:// or https://".into());
    }
    let path = format!("{}/api/v1/query", parsed.path().trim_end_matches('/'));
    parsed.set_path(&path);
    parsed.set_fragment(None);
    Ok(parsed)
}

fn headers(config: &PrometheusBackend) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    map.insert(ACCEPT, HeaderValue::from_static("application/json"));
    for (name, value) in &config.headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("headers: {name:?} is not a valid HTTP header name"))?;
        // The value is not repeated in the message: people do put secrets in headers.
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("headers: the value of {name:?} is not a valid HTTP header value"))?;
        map.insert(header, value);
    }
    if let Some(tenant) = &config.tenant {
        let value =
            HeaderValue::from_str(tenant).map_err(|_| format!("tenant {tenant:?} is not a valid HTTP header value"))?;
        map.insert(HeaderName::from_static("x-scope-orgid"), value);
    }
    Ok(map)
}

/// Custom CA, client certificate, and the explicit opt-out of verification. Errors name the file
/// and never quote what is in it: a key file's content is a secret.
pub(crate) fn tls(mut builder: ClientBuilder, name: &str, tls: &TlsSettings) -> Result<ClientBuilder, String> {
    if let Some(ca_file) = &tls.ca_file {
        let pem = read_file("tls.ca_file", ca_file)?;
        let certs = Certificate::from_pem_bundle(&pem).unwrap_or_default();
        if certs.is_empty() {
            return Err(format!("tls.ca_file {} holds no PEM certificate", ca_file.display()));
        }
        // Added to the system roots, not replacing them.
        builder = builder.tls_certs_merge(certs);
    }
    match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(cert_file), Some(key_file)) => {
            let mut pem = read_file("tls.client_cert_file", cert_file)?;
            pem.push(b'\n');
            pem.extend(read_file("tls.client_key_file", key_file)?);
            let identity = Identity::from_pem(&pem).map_err(|_| {
                format!(
                    "tls.client_cert_file {} and tls.client_key_file {} must hold a PEM certificate and its private key",
                    cert_file.display(),
                    key_file.display()
                )
            })?;
            builder = builder.identity(identity);
        }
        (None, None) => {}
        _ => return Err("tls.client_cert_file and tls.client_key_file go together: set both or neither".into()),
    }
    if tls.insecure_skip_verify {
        // Logged here, once per backend, rather than per request.
        tracing::warn!(backend = name, "tls.insecure_skip_verify is set: the server's certificate is not checked");
        builder = builder.danger_accept_invalid_certs(true);
    }
    Ok(builder)
}

fn read_file(setting: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {setting} {}: {}", path.display(), e.kind()))
}

/// An error and its causes on one line (`reqwest` puts the useful part in the causes).
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

pub(super) enum Auth {
    None,
    Basic {
        username: String,
        password: RotatingSecret,
    },
    /// A file is followed as it rotates: Kubernetes rewrites projected service-account tokens in
    /// place.
    Bearer(RotatingSecret),
}

impl Auth {
    /// Adds the credentials as they are now (a rotated file is read again: `RotatingSecret`).
    pub async fn apply(&self, request: RequestBuilder) -> RequestBuilder {
        match self {
            Auth::None => request,
            Auth::Basic { username, password } => request.basic_auth(username, Some(password.current().await.expose())),
            Auth::Bearer(token) => request.bearer_auth(token.current().await.expose()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::domain::rules::SecretSource;
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    fn config(url: &str) -> PrometheusBackend {
        PrometheusBackend {
            url: url.into(),
            timeout: Duration::from_secs(10),
            max_in_flight: 8,
            max_age: None,
            tenant: None,
            headers: BTreeMap::new(),
            params: BTreeMap::new(),
            basic_auth: None,
            bearer_token: None,
            tls: TlsSettings::default(),
            fold_queries: true,
            fold_max_regex_bytes: 4096,
            fold_max_members: None,
        }
    }

    fn build(config: &PrometheusBackend) -> Result<Connection, BackendError> {
        crate::adapters::backend::ensure_crypto_provider();
        Connection::new("prom", config)
    }

    fn invalid_message(config: &PrometheusBackend) -> String {
        match build(config) {
            Err(BackendError::Invalid { backend, message }) => {
                assert_eq!(backend, "prom");
                message
            }
            Err(other) => panic!("expected Invalid, got {other}"),
            Ok(_) => panic!("expected Invalid, got a connection"),
        }
    }

    #[test]
    fn the_endpoint_keeps_the_path_prefix() {
        for (url, expected) in [
            ("http://prom:9090", "http://prom:9090/api/v1/query"),
            ("http://prom:9090/", "http://prom:9090/api/v1/query"),
            ("https://mimir.example/prometheus", "https://mimir.example/prometheus/api/v1/query"),
            ("https://vm.example/select/0/prometheus/", "https://vm.example/select/0/prometheus/api/v1/query"),
        ] {
            assert_eq!(endpoint(url).unwrap().as_str(), expected, "{url}");
        }
        assert!(endpoint("ftp://prom").is_err());
        assert!(endpoint("not a url").is_err());
    }

    #[test]
    fn the_displayed_endpoint_has_no_password() {
        let c = build(&config("http://user:hunter2@prom:9090/p")).ok().unwrap();
        assert_eq!(c.display_endpoint, "http://prom:9090/p/api/v1/query");
    }

    #[test]
    fn own_parameters_cannot_be_overridden() {
        let mut c = config("http://prom:9090");
        c.params.insert("time".into(), "0".into());
        assert!(invalid_message(&c).contains("params.time"));
    }

    #[test]
    fn bad_headers_are_named_without_their_value() {
        let mut c = config("http://prom:9090");
        c.headers.insert("X-Token".into(), "line\nbreak-secret".into());
        let message = invalid_message(&c);
        assert!(message.contains("X-Token") && !message.contains("secret"), "{message}");
        let mut c = config("http://prom:9090");
        c.headers.insert("bad header".into(), "v".into());
        assert!(invalid_message(&c).contains("bad header"));
    }

    #[test]
    fn bad_tls_files_are_named_never_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("ca.pem");
        std::fs::write(&garbage, "SECRET-LOOKING CONTENT, not a certificate").unwrap();
        let mut c = config("https://prom:9090");
        c.tls.ca_file = Some(garbage.clone());
        let message = invalid_message(&c);
        assert!(message.contains(&garbage.display().to_string()), "{message}");
        assert!(!message.contains("SECRET"), "{message}");

        let missing = dir.path().join("missing.pem");
        c.tls.ca_file = Some(missing.clone());
        let message = invalid_message(&c);
        assert!(message.contains(&missing.display().to_string()) && message.contains("not found"), "{message}");

        let mut c = config("https://prom:9090");
        c.tls.client_cert_file = Some(garbage.clone());
        c.tls.client_key_file = Some(garbage.clone());
        let message = invalid_message(&c);
        assert!(message.contains("client_cert_file") && !message.contains("SECRET"), "{message}");

        c.tls.client_key_file = None;
        assert!(invalid_message(&c).contains("go together"));
    }

    #[test]
    fn missing_secrets_are_secret_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config("http://prom:9090");
        c.bearer_token = Some(SecretSource::File(dir.path().join("token")));
        assert!(matches!(build(&c), Err(BackendError::Secret { .. })));
    }
}
