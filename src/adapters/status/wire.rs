//! Reading the API's answers back into the types that wrote them (`board`, `http`), as
//! `watermarkd status` does: the few parts serde cannot derive a reader for. Each refuses what
//! the server never writes, naming it, rather than reading it as something else.

use std::sync::Arc;

use serde::{Deserialize, Deserializer};

use super::board::{Identity, TargetView};
use crate::domain::status::history::Marks;

/// The sources an autoscaler comes from, as `Identity::source` names them.
const SOURCES: [&str; 2] = ["file", "crd"];

/// `Identity` as the API writes it. Its own derive cannot read it: serde would borrow its
/// `&'static str` from the answer, which does not live that long.
#[derive(Deserialize)]
struct IdentityWire {
    id: Arc<str>,
    name: Arc<str>,
    namespace: Arc<str>,
    source: String,
    target: TargetView,
    interval_seconds: u64,
    dry_run: bool,
    paused_until: Option<String>,
    backends: Vec<String>,
    #[serde(default)]
    shadows: Vec<Arc<str>>,
}

impl<'de> Deserialize<'de> for Identity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Identity, D::Error> {
        let wire = IdentityWire::deserialize(deserializer)?;
        let source = SOURCES.into_iter().find(|known| *known == wire.source).ok_or_else(|| {
            serde::de::Error::custom(format!("source {:?} is not one of {}", wire.source, SOURCES.join(", ")))
        })?;
        Ok(Identity {
            id: wire.id,
            name: wire.name,
            namespace: wire.namespace,
            source,
            target: wire.target,
            interval_seconds: wire.interval_seconds,
            dry_run: wire.dry_run,
            paused_until: wire.paused_until,
            backends: wire.backends,
            shadows: wire.shadows,
        })
    }
}

/// `SampleView::marks`: the history's mark names.
pub(super) fn marks<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<&'static str>, D::Error> {
    Vec::<String>::deserialize(deserializer)?
        .iter()
        .map(|text| {
            Marks::known_name(text).ok_or_else(|| serde::de::Error::custom(format!("{text:?} is not a history mark")))
        })
        .collect()
}
