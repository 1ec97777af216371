//! What a WPA's `spec.recommender` may make the daemon do. A WPA author is not the operator:
//! without limits, `spec.recommender.url` would send requests from the daemon's network
//! position to any address, and the TLS file fields would read any file on the daemon's disk.
//! The operator lists the recommenders WPAs may use (`recommender_allowed_urls`) and the
//! directory their TLS files must lie in (`recommender_tls_dir`); with neither set, no WPA may
//! use a recommender. Rules-file autoscalers are the operator's own and are not limited.
//!
//! Pure checks on names: the paths are judged as written here (no `..`, inside the
//! directory); that they still lie inside it once symlinks are followed is checked where the
//! files are read (`backend::recommender`), through `Recommender::tls_dir`.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use reqwest::Url;

/// The setting that lists the recommenders WPAs may use.
pub const ALLOWED_URLS_SETTING: &str = "recommender_allowed_urls";
/// The setting that names the directory of WPA recommender TLS files.
pub const TLS_DIR_SETTING: &str = "recommender_tls_dir";

/// One entry of `recommender_allowed_urls`: an origin (`scheme://host[:port]`) and a path
/// prefix (`/` when none is given: any path of the origin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedUrl {
    scheme: String,
    host: String,
    port: Option<u16>,
    path: String,
}

impl AllowedUrl {
    /// Reads one entry; the error says what is wrong with it, without quoting it (an entry is
    /// the operator's, but the same text goes to a log line).
    pub fn parse(text: &str) -> Result<AllowedUrl, String> {
        let url = Url::parse(text.trim()).map_err(|e| format!("is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("must start with http:// or https://".into());
        }
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or("has no host")?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err("must not carry credentials: it names where requests may go, not how".into());
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err("must not have a query or a fragment: give an origin and at most a path prefix".into());
        }
        Ok(AllowedUrl {
            scheme: url.scheme().to_string(),
            host: host.to_string(),
            port: url.port_or_known_default(),
            path: url.path().to_string(),
        })
    }

    /// Whether `url` is at this origin, under this path prefix (at a segment boundary: `/api`
    /// allows `/api` and `/api/x`, not `/apix`). `url` is parsed, so its `..` segments are
    /// already resolved.
    fn allows(&self, url: &Url) -> bool {
        if url.scheme() != self.scheme
            || url.host_str() != Some(self.host.as_str())
            || url.port_or_known_default() != self.port
        {
            return false;
        }
        let path = url.path();
        if self.path.ends_with('/') {
            return path.starts_with(&self.path);
        }
        path == self.path || path.strip_prefix(&self.path).is_some_and(|rest| rest.starts_with('/'))
    }
}

impl fmt::Display for AllowedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}://{}:{port}{}", self.scheme, self.host, self.path),
            None => write!(f, "{}://{}{}", self.scheme, self.host, self.path),
        }
    }
}

/// The recommenders WPAs may use and where their TLS files may be. The default allows none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecommenderPolicy {
    allowed: Vec<AllowedUrl>,
    tls_dir: Option<PathBuf>,
}

impl RecommenderPolicy {
    /// `tls_dir` must be absolute and without `..` (the settings loader checks it).
    pub fn new(allowed: Vec<AllowedUrl>, tls_dir: Option<PathBuf>) -> RecommenderPolicy {
        RecommenderPolicy { allowed, tls_dir }
    }

    /// The directory TLS files must lie in, if any may be named.
    pub fn tls_dir(&self) -> Option<&Path> {
        self.tls_dir.as_deref()
    }

    /// Why a WPA may not send recommender requests to `url`, if it may not. A url that is not an
    /// http(s) URL is left to the rules reader, which says why.
    pub fn url_problem(&self, url: &str) -> Option<String> {
        let parsed = Url::parse(url).ok().filter(|u| matches!(u.scheme(), "http" | "https"))?;
        let shown = crate::domain::rules::Recommender::redact(url);
        if self.allowed.is_empty() {
            return Some(format!(
                "({shown}) is refused: this daemon lets no WatermarkPodAutoscaler use a recommender (its \
                 {ALLOWED_URLS_SETTING} setting is empty); an operator who trusts this recommender adds its URL there"
            ));
        }
        if self.allowed.iter().any(|allowed| allowed.allows(&parsed)) {
            return None;
        }
        Some(format!(
            "({shown}) is refused: it is not under any URL of the daemon's {ALLOWED_URLS_SETTING} setting; an \
             operator who trusts this recommender adds its URL there"
        ))
    }

    /// The file a WPA's TLS field names, resolved against `recommender_tls_dir` (a relative path
    /// is taken inside it), or why it may not be read.
    pub fn tls_file(&self, path: &str) -> Result<PathBuf, String> {
        let Some(dir) = &self.tls_dir else {
            return Err(format!(
                "({path}) is refused: this daemon reads no TLS file a WatermarkPodAutoscaler names (its \
                 {TLS_DIR_SETTING} setting is not set); an operator sets it to the directory such files are \
                 mounted in"
            ));
        };
        let named = Path::new(path);
        if named.components().any(|c| c == Component::ParentDir) {
            return Err(format!("({path}) must not contain \"..\""));
        }
        let resolved = dir.join(named);
        if !resolved.starts_with(dir) || resolved == *dir {
            return Err(format!(
                "({path}) is refused: it is not a file inside {}, the daemon's {TLS_DIR_SETTING}",
                dir.display()
            ));
        }
        Ok(resolved)
    }
}

/// Checks the `recommender_tls_dir` setting: an absolute path without `..`.
pub fn check_tls_dir(dir: &Path) -> Result<(), String> {
    if !dir.is_absolute() {
        return Err(format!("{} must be an absolute path", dir.display()));
    }
    if dir.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{} must not contain \"..\"", dir.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allowed: &[&str], tls_dir: Option<&str>) -> RecommenderPolicy {
        let allowed = allowed.iter().map(|a| AllowedUrl::parse(a).expect("valid entry")).collect();
        RecommenderPolicy::new(allowed, tls_dir.map(PathBuf::from))
    }

    #[test]
    fn an_origin_allows_its_paths_and_nothing_else() {
        let policy = policy(&["https://reco.svc:8443", "http://other.svc/api"], None);
        for url in [
            "https://reco.svc:8443/recommend",
            "https://RECO.svc:8443/",
            "https://user:pw@reco.svc:8443/x?y=1",
            "http://other.svc/api",
            "http://other.svc:80/api/v1",
            "http://other.svc/v1/../api/x",
        ] {
            assert_eq!(policy.url_problem(url), None, "{url}");
        }
        for url in [
            "http://reco.svc:8443/recommend",
            "https://reco.svc/recommend",
            "https://reco.svc.evil:8443/",
            "https://evil/?https://reco.svc:8443/",
            "http://other.svc/apix",
            "http://other.svc/",
            "http://other.svc/api/../admin",
            "http://169.254.169.254/latest/meta-data",
        ] {
            let problem = policy.url_problem(url).unwrap_or_else(|| panic!("{url} is allowed"));
            assert!(problem.contains("recommender_allowed_urls"), "{problem}");
        }
    }

    #[test]
    fn a_prefix_with_a_trailing_slash_allows_what_is_under_it() {
        let policy = policy(&["https://reco/team-a/"], None);
        assert_eq!(policy.url_problem("https://reco/team-a/x"), None);
        assert!(policy.url_problem("https://reco/team-a").is_some());
        assert!(policy.url_problem("https://reco/team-ab/x").is_some());
    }

    #[test]
    fn nothing_is_allowed_by_default_and_the_problem_says_which_setting() {
        let problem = RecommenderPolicy::default().url_problem("https://ops:hunter2@reco/r?k=s").expect("refused");
        assert!(problem.starts_with("(https://reco/r) is refused"), "{problem}");
        assert!(problem.contains("recommender_allowed_urls setting is empty"), "{problem}");
        assert_eq!(RecommenderPolicy::default().url_problem("not a url"), None, "the reader reports it");
        assert_eq!(RecommenderPolicy::default().url_problem("reco:80"), None, "the reader reports it");
    }

    #[test]
    fn entries_are_origins_with_a_path_prefix() {
        for (entry, why) in [
            ("reco.svc:8443", "must start with http:// or https://"),
            ("ftp://reco", "must start with http:// or https://"),
            ("https://u:p@reco", "must not carry credentials"),
            ("https://reco/?x=1", "must not have a query"),
            ("nonsense", "is not a URL"),
        ] {
            let err = AllowedUrl::parse(entry).expect_err(entry);
            assert!(err.contains(why), "{entry}: {err}");
        }
        assert_eq!(AllowedUrl::parse("https://Reco:443").expect("valid").to_string(), "https://reco:443/");
    }

    #[test]
    fn tls_files_must_lie_in_the_directory() {
        let refused = policy(&[], None).tls_file("/etc/ca.pem").expect_err("no directory");
        assert!(refused.contains("recommender_tls_dir setting is not set"), "{refused}");
        let policy = policy(&[], Some("/etc/reco-tls"));
        assert_eq!(policy.tls_file("/etc/reco-tls/ca.pem"), Ok(PathBuf::from("/etc/reco-tls/ca.pem")));
        assert_eq!(policy.tls_file("team-a/ca.pem"), Ok(PathBuf::from("/etc/reco-tls/team-a/ca.pem")));
        for path in ["/etc/shadow", "/etc/reco-tls/../shadow", "../shadow", "/etc/reco-tls", "/etc/reco-tlsx/ca.pem"] {
            assert!(policy.tls_file(path).is_err(), "{path}");
        }
        assert!(check_tls_dir(Path::new("relative")).is_err());
        assert!(check_tls_dir(Path::new("/a/../b")).is_err());
        assert_eq!(check_tls_dir(Path::new("/etc/reco-tls")), Ok(()));
    }
}
