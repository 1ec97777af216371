//! The TOML rules file: backends and autoscalers, each compiled into an engine `Rule`.
//!
//! Reading happens in steps. The text becomes a small document tree whose nodes know their
//! line (`tree`). Typed reads over that tree (`reader`) turn each `[[autoscaler]]` into a
//! draft (`document` -> `draft`), reporting what the document's shape gets wrong; `compile`
//! then checks the draft (what is required, what cannot go together, the engine's own
//! `Rule::new`) and names each problem where its field was written. A WPA (`crate::domain::crd`) and a
//! JSON rule for `decide` become the same draft and go through the same `compile`, so the
//! sources cannot drift apart. Every problem is collected, so one `watermarkd check` lists all
//! of them.

pub mod backend;
mod check;
mod compile;
mod document;
pub(crate) mod draft;
mod file;
mod model;
mod problem;
mod promql;
pub mod quantity;
pub(crate) mod reader;
pub mod selector;
pub(crate) mod tree;

pub(crate) use backend::plain_http_host;
pub use backend::{Backend, BasicAuth, DatadogBackend, PrometheusBackend};
pub(crate) use check::plural;
pub use check::{summary, warnings, warnings_at};
pub(crate) use compile::{compile, Require};
pub(crate) use document::{
    parse_instant, parse_reducer, read_fallback, read_forecast, read_schedule_list, ALGORITHMS, POD_AGGREGATIONS,
    REDUCERS, RESOURCES,
};
pub use file::{load_rules, parse_rules, rule_from_json};
pub use model::{
    intern, Autoscaler, MetricSource, ObjectIdentity, PodAggregation, Recommender, Reducer, ResourceName,
    ResourceSource, RulesFile, SecretSource, TargetRef, TlsSettings, DEFAULT_INTERVAL, OBSERVING, RESOURCE_BACKEND,
    RESOURCE_MAX_AGE,
};
pub(crate) use problem::{Problem, RulesError, Sink, TableScope};
pub(crate) use quantity::parse_quantity;

#[cfg(test)]
mod tests;
