//! watermarkd: autoscales Kubernetes workloads from metrics it queries itself.
//!
//! The binary in `main.rs` is a thin shell over these modules so that tests drive the same
//! code paths a person does.

pub mod backend;
pub mod backtest;
pub mod cli_docs;
pub mod crd;
pub mod decide;
pub mod events;
pub mod instant;
pub mod lease;
pub mod query;
pub mod rbac;
pub mod resource;
pub mod rules;
pub mod runtime;
pub mod settings;
pub mod simulate;
pub mod sparse;
pub mod state;
pub mod telemetry;
pub mod workload;
