//! What a person runs besides the daemon: `check`, `query`, `decide`, `simulate`, `backtest`,
//! `rbac` and the shell completions. Each drives the same domain and adapters as the daemon.

pub mod backtest;
pub mod check;
pub mod cli_docs;
pub mod decide;
pub mod query;
pub mod rbac;
pub mod simulate;
pub mod status;
