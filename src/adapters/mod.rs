//! The edges that do I/O: metric backends, the workloads and their `/scale`, the metrics API,
//! the state ConfigMaps, Events, the Lease, the daemon's own telemetry, and the one listener
//! that telemetry, health and status hand their routes to. Each has one error enum and a thin
//! async surface over decisions that are sync functions with their own tests.

pub mod backend;
pub mod events;
pub mod health;
pub mod lease;
pub mod listener;
pub mod resource;
pub mod secret;
pub mod state_store;
pub mod status;
pub mod telemetry;
pub mod workload;
