//! `strata`: the Strata time series database.
//!
//! Today it opens a data directory (replaying its write-ahead log, repairing a torn tail) and
//! reports what it holds; `strata serve` with Prometheus' HTTP API comes next.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use strata_server::config::{StorageConfig, WalFsync, DATA_DIR_DEFAULT};
use strata_tsdb::Db;

#[derive(Parser, Debug)]
#[command(name = "strata", version, about = "Strata: a time series database compatible with Prometheus")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Open a data directory (creating it if needed), replay its write-ahead log and print its state.
    Status {
        /// Data directory.
        #[arg(long, default_value = DATA_DIR_DEFAULT)]
        data_dir: PathBuf,
        /// WAL fsync policy: "interval" or "always".
        #[arg(long, default_value = "interval")]
        wal_fsync: WalFsync,
        /// Rows in each cardinality table.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Status { data_dir, wal_fsync, top } => {
            let cfg = StorageConfig { data_dir, wal_fsync, ..Default::default() };
            let db = Db::open(&cfg.data_dir, cfg.db_options())?;
            print!("{}", strata_server::status::render(&db.status(top)?));
            db.close()?;
            Ok(())
        }
    }
}
