//! "Why did it (not) scale?": the status board, a view of the ledger every evaluation reports
//! to (`board`); the read-only JSON API and the page the daemon's listener serves from it
//! (`http`, `page`, the page's charts in `chart`); and who may read them (`access`).
//! `watermarkd status` reads the API back through the same types (`wire` has what serde
//! cannot derive). Documented in docs/status.md.

pub mod access;
pub mod board;
pub mod chart;
pub mod http;
pub mod page;
mod wire;
pub mod worker;

pub use access::{Access, TokenReviewer};
pub use board::{Board, Identity, Leadership, ListQuery, State, TargetView};
pub use http::{routes, StatusApi};
