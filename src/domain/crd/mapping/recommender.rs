//! A WPA's `spec.recommender` as a draft: its url and TLS files must be ones the daemon's
//! policy allows, and what of it watermarkd does not use is said as a note.

use std::path::PathBuf;

use super::super::recommender_policy::RecommenderPolicy;
use super::super::types::RecommenderSpec;
use super::Mapper;
use crate::domain::rules::draft::{Field, Given, Origin, RecommenderDraft};

const AT: &str = "spec.recommender";

impl Mapper {
    /// `spec.recommender`, and what of it has no effect. Its watermarks are the bounds sent to
    /// the service, and the rule's one metric.
    pub(super) fn recommender(
        &mut self,
        recommender: &RecommenderSpec,
        policy: &RecommenderPolicy,
    ) -> (RecommenderDraft, Vec<String>) {
        let mut notes = Vec::new();
        if let Some(problem) = policy.url_problem(&recommender.url) {
            self.problem(&format!("{AT}.url"), problem);
        }
        let nonempty = |text: &Option<String>| text.as_ref().filter(|t| !t.is_empty()).cloned();
        let settings = (!recommender.settings.is_empty()).then(|| recommender.settings.clone());
        let tls = recommender.tls_config.clone().unwrap_or_default();
        let server_name = nonempty(&tls.server_name).filter(|server_name| {
            let field = format!("{AT}.tlsConfig.serverName");
            match server_name_use(server_name, &recommender.url) {
                ServerNameUse::Verify => return true,
                ServerNameUse::UrlHost => {}
                ServerNameUse::NoTls => notes.push(format!(
                    "{field} ({server_name}) has no effect: the url is http://, without TLS, as in the Datadog controller"
                )),
                ServerNameUse::OtherAddress => self.unsupported(
                    &field,
                    format!(
                        "({server_name}) is an IP address other than the url's host: watermarkd verifies the \
                         certificate against another name only when it is a DNS name; put this address in the url"
                    ),
                ),
            }
            false
        });
        for (field, version) in [("minVersion", &tls.min_version), ("maxVersion", &tls.max_version)] {
            if let Some(version) = version.as_ref().filter(|v| !v.is_empty()) {
                notes.push(format!(
                    "{AT}.tlsConfig.{field} ({version}) has no effect: watermarkd always negotiates TLS 1.2 or 1.3"
                ));
            }
        }
        let draft = RecommenderDraft {
            origin: Origin::new(AT, None),
            url: self.text(format!("{AT}.url"), Some(&recommender.url)),
            target_type: Mapper::given(format!("{AT}.targetType"), nonempty(&recommender.target_type)),
            settings: Mapper::given(format!("{AT}.settings"), settings),
            low_watermark: self.quantity(format!("{AT}.lowWatermark"), recommender.low_watermark.as_ref()),
            high_watermark: self.quantity(format!("{AT}.highWatermark"), recommender.high_watermark.as_ref()),
            timeout: Field::absent(Origin::new(AT, None)),
            cluster_name: Field::absent(Origin::new(AT, None)),
            ca_file: self.tls_file(policy, "tlsConfig.caFile", &tls.ca_file),
            client_cert_file: self.tls_file(policy, "tlsConfig.certFile", &tls.cert_file),
            client_key_file: self.tls_file(policy, "tlsConfig.keyFile", &tls.key_file),
            insecure_skip_verify: Mapper::given(format!("{AT}.tlsConfig.insecureSkipVerify"), tls.insecure_skip_verify),
            server_name: Mapper::given(format!("{AT}.tlsConfig.serverName"), server_name),
            // Where the files must still be once symlinks are followed, checked as they are read.
            tls_dir: policy.tls_dir().map(Into::into),
        };
        (draft, notes)
    }

    /// A TLS file the policy must allow, resolved in its directory.
    fn tls_file(&mut self, policy: &RecommenderPolicy, key: &str, path: &Option<String>) -> Field<PathBuf> {
        let origin = Origin::new(format!("{AT}.{key}"), None);
        let Some(path) = path.as_ref().filter(|p| !p.is_empty()) else { return Field::absent(origin) };
        match policy.tls_file(path) {
            Ok(resolved) => Field { given: Given::Value(resolved), origin },
            Err(why) => {
                self.problem(&origin.field(), why);
                // A stand-in keeps compiling from also calling the other half of a client
                // certificate missing; with this problem the WPA does not run.
                Field { given: Given::Value(PathBuf::from(path)), origin }
            }
        }
    }
}

/// What a WPA's `tlsConfig.serverName` becomes.
enum ServerNameUse {
    /// The name to verify the certificate against (and send as SNI). A name compiling refuses
    /// lands here too, so that its problem is said.
    Verify,
    /// The url's own host (an IP address): what is verified anyway.
    UrlHost,
    /// The url is `http://`: there is no certificate, and the Datadog controller ignores it too.
    NoTls,
    /// Another IP address: the client can only verify a DNS name other than the url's host.
    OtherAddress,
}

fn server_name_use(server_name: &str, url: &str) -> ServerNameUse {
    let Ok(parsed) = reqwest::Url::parse(url) else { return ServerNameUse::Verify };
    if parsed.scheme() == "http" {
        return ServerNameUse::NoTls;
    }
    let address = |text: &str| text.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().ok();
    let Some(named) = address(server_name) else { return ServerNameUse::Verify };
    if parsed.host_str().and_then(address) == Some(named) {
        ServerNameUse::UrlHost
    } else {
        ServerNameUse::OtherAddress
    }
}
