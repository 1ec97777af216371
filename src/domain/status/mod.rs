//! What the status API, `watermarkd status` and the status page say about an autoscaler,
//! without any I/O: its recent evaluations in a compact ring (`history`) and its decisions
//! in plain sentences (`explain`). The store they are kept in is `adapters::status`.

pub mod explain;
pub mod history;
