use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};

/// Autoscales Kubernetes workloads from Datadog or Prometheus metrics with low and high
/// watermarks, velocity limits and forbidden windows.
#[derive(Parser)]
#[command(name = "watermarkd", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate rules files: print every problem, or a one-line summary per autoscaler.
    ///
    /// Exits 1 when any file has a problem.
    Check {
        /// Rules files (TOML) to validate.
        #[arg(value_name = "FILE", required_unless_present = "rules")]
        files: Vec<PathBuf>,
        /// A rules file to validate, as `run --rules` names it (repeatable).
        #[arg(long, value_name = "FILE", visible_alias = "config")]
        rules: Vec<PathBuf>,
    },
    /// Compute one decision per JSON object read on standard input (one document, or JSON Lines).
    ///
    /// Each input carries the rule, `now`, the target's replicas, one reading per metric and
    /// the state; each output line carries every intermediate result. See docs/decide.md.
    Decide,
    /// Replay a metric trace (CSV) through an autoscaler's rule and report what it would do.
    Simulate(watermarkd::commands::simulate::SimulateArgs),
    /// Replay an autoscaler's own metric history through its rule, and through another version
    /// of it with --against, and report what each would have done.
    Backtest(watermarkd::commands::backtest::BacktestArgs),
    /// Ask the backends what every metric of the rules reads right now, and how it was chosen.
    ///
    /// Exits 1 when any metric has no usable value.
    Query(watermarkd::commands::query::QueryArgs),
    /// Write the rules file (TOML) for the autoscalers people already run: HPAs (with
    /// prometheus-adapter's rules or the Datadog Cluster Agent's metrics), KEDA ScaledObjects
    /// and WatermarkPodAutoscalers, from manifests or a cluster.
    ///
    /// Each autoscaler is written with `observe = true` (unless --active) and a comment naming
    /// where it came from and every choice made. What cannot be carried over exactly is listed
    /// on standard error and the command exits 1 writing nothing (--partial writes the rest and
    /// exits 0). See docs/import.md.
    Import(watermarkd::commands::import::ImportArgs),
    /// Show what a running daemon's autoscalers are doing and why, from its status API.
    ///
    /// Without NAME, a table of every autoscaler; with one, the explanation of its last
    /// decision in plain sentences and its recent scale events. Exits 1 when an autoscaler
    /// shown is failing or has no data. See docs/status.md.
    Status(watermarkd::commands::status::StatusArgs),
    /// Print the WatermarkPodAutoscaler CustomResourceDefinition (YAML) that CRD mode reads.
    ///
    /// It accepts exactly the objects the Datadog controller's CRD accepts, so either can be
    /// installed: `watermarkd crd | kubectl apply -f -`. See docs/crd.md.
    Crd,
    /// Run the daemon: every autoscaler of the rules file (and, with --crd, of the cluster's
    /// WatermarkPodAutoscaler objects) on its interval, until SIGTERM.
    ///
    /// Settings come from --settings (default /etc/watermarkd/watermarkd.toml), WATERMARKD__*
    /// variables and these flags, in increasing precedence. SIGHUP reloads the rules file.
    Run(watermarkd::runtime::settings::RunArgs),
    /// Print the shell completion script for watermarkd.
    ///
    /// For example `watermarkd completions bash > /etc/bash_completion.d/watermarkd`.
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the version (as `watermarkd --version` does).
    Version,
    /// Print the man page watermarkd.1 (roff), or write one page per subcommand with --dir.
    ///
    /// For example `watermarkd man > /usr/local/share/man/man1/watermarkd.1`.
    Man {
        /// Write watermarkd.1 and watermarkd-SUBCOMMAND.1 into this directory, and print their paths.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        // A reader that stops early (`| head`) is not a failure of ours.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            // eprintln! would panic if standard error is closed; the exit code still tells.
            let _ = writeln!(io::stderr(), "watermarkd: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let code = match cli.command {
        Command::Check { mut files, rules } => {
            files.extend(rules);
            let ok = watermarkd::commands::check::run_check(&files, &mut out).context("writing the check report")?;
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Command::Decide => {
            let stdin = io::stdin();
            let ok =
                watermarkd::commands::decide::run(stdin.lock(), &mut out).context("reading or writing decisions")?;
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Command::Simulate(args) => {
            watermarkd::commands::simulate::run(&args, &mut out, &mut io::stderr())?;
            ExitCode::SUCCESS
        }
        Command::Backtest(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let mut err = std::io::stderr();
            let terminal = err.is_terminal();
            runtime.block_on(watermarkd::commands::backtest::run(&args, &mut out, &mut err, terminal))?;
            ExitCode::SUCCESS
        }
        Command::Query(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            if runtime.block_on(watermarkd::commands::query::run(&args, &mut out))? {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Command::Import(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let mut err = io::stderr();
            if runtime.block_on(watermarkd::commands::import::run(&args, &mut out, &mut err))? {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Command::Status(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            if runtime.block_on(watermarkd::commands::status::run(&args, &mut out))? {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Command::Run(args) => {
            let settings = watermarkd::runtime::settings::Settings::load(
                &args,
                &watermarkd::runtime::settings::Environment::current(),
            )?;
            watermarkd::adapters::telemetry::logging::init(settings.log_format, &settings.log_level)
                .map_err(anyhow::Error::msg)?;
            // Before any blocking-pool thread exists, so that all of them share the limited arenas.
            watermarkd::runtime::allocator::limit_arenas();
            // One thread: a cycle at 10,000 autoscalers is well under a core-second every 15 s,
            // and a second worker cost a second malloc arena and stack (about 8 MB resident
            // there) without making a cycle cheaper (BENCHMARKS.md).
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(watermarkd::runtime::run(settings))?;
            ExitCode::SUCCESS
        }
        Command::Crd => {
            let yaml = watermarkd::domain::crd::crd_yaml().context("writing the CRD as YAML")?;
            out.write_all(yaml.as_bytes())?;
            ExitCode::SUCCESS
        }
        Command::Completions { shell } => {
            watermarkd::commands::cli_docs::write_completions(Cli::command(), shell, &mut out)
                .context("writing the completion script")?;
            ExitCode::SUCCESS
        }
        Command::Version => {
            writeln!(out, "watermarkd {}", env!("CARGO_PKG_VERSION"))?;
            ExitCode::SUCCESS
        }
        Command::Man { dir: None } => {
            watermarkd::commands::cli_docs::write_man_page(Cli::command(), &mut out).context("writing the man page")?;
            ExitCode::SUCCESS
        }
        Command::Man { dir: Some(dir) } => {
            let pages = watermarkd::commands::cli_docs::write_man_pages(Cli::command(), &dir)
                .with_context(|| format!("writing the man pages into {}", dir.display()))?;
            for page in pages {
                writeln!(out, "{}", page.display())?;
            }
            ExitCode::SUCCESS
        }
    };
    out.flush().context("writing to standard output")?;
    Ok(code)
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| cause.downcast_ref::<io::Error>().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe))
}
