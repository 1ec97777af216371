//! What a person runs besides the daemon: `check`, `query`, `decide`, `import`, `simulate`, `backtest`,
//! `rbac` and the shell completions. Each drives the same domain and adapters as the daemon.

pub mod backtest;
pub mod check;
pub mod cli_docs;
pub mod decide;
pub mod import;
pub mod query;
pub mod rbac;
pub mod simulate;
pub mod status;
