//! watermarkd: autoscales Kubernetes workloads from metrics it queries itself.
//!
//! The binary in `main.rs` is a thin shell over these modules so that tests drive the same
//! code paths a person does. The modules are the layers (`docs/architecture.md`), each using
//! only those below it: the engine (its own crate), the [`domain`], the [`adapters`], the
//! daemon ([`runtime`]) and the [`commands`]. [`testing`] is what the integration tests reach
//! into, and nothing else uses.

pub mod adapters;
pub mod commands;
pub mod domain;
pub mod runtime;
pub mod testing;
