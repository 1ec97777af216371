//! What the status API, `watermarkd status` and the status page say about an autoscaler,
//! without any I/O: its recent evaluations in a compact ring (`history`) and its decisions
//! in plain sentences (`explain`). They are kept in the ledger (`domain::outcome`). And what
//! the backends say about themselves (`backends`), handed to the status API by the backends.

pub mod backends;
pub mod explain;
pub mod history;
