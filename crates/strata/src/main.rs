//! `strata`: the Strata time series database.
//!
//! `serve` runs the server (Prometheus' HTTP API, remote write and read); `status` opens a data
//! directory and reports what it holds; `tsdb import`, `tsdb analyze` and `tsdb dump` are the
//! operator tools; `check rules` and `check config` are promtool's checks.

mod check;
mod serve;

/// mimalloc instead of glibc's malloc: queries allocate and free many small buffers per series
/// (label sets, chunk lists, copies of open head chunks) on several threads, and glibc's
/// consolidation and arena locking took about a quarter of the instant query's profile.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use strata_server::config::{StorageConfig, WalFsync, DATA_DIR_DEFAULT};
use strata_server::textparse::Format;
use strata_server::{analyze, import};
use strata_tsdb::{Db, DbOptions};

#[derive(Parser, Debug)]
#[command(name = "strata", version, about = "Strata: a time series database compatible with Prometheus")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Least severe log level written: debug, info, warn or error (RUST_LOG, when set, takes
    /// precedence with its per-module filters).
    #[arg(long = "log.level", global = true, default_value = "info")]
    log_level: LogLevel,
    /// Log line format: logfmt-like text (colour only on a terminal) or one JSON object per line.
    #[arg(long = "log.format", global = true, default_value = "logfmt")]
    log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Logfmt,
    Json,
}

/// Logs to stderr as `--log.level` and `--log.format` say.
fn init_logging(level: LogLevel, format: LogFormat) {
    let level = match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into());
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => fmt.json().init(),
        // Colour codes only for a terminal: a log file or journald gets plain text.
        LogFormat::Logfmt => fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
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
    /// Run the server: Prometheus' HTTP API, remote write and read, over one data directory.
    Serve(Box<serve::ServeArgs>),
    /// Operator tools for a data directory (run while no server has it open).
    #[command(subcommand)]
    Tsdb(TsdbCommand),
    /// Check rule and configuration files, as promtool's `check` does.
    #[command(subcommand)]
    Check(check::CheckCommand),
}

#[derive(Subcommand, Debug)]
enum TsdbCommand {
    /// Build blocks from a text file whose samples carry timestamps (`.gz` is decompressed).
    Import {
        /// `openmetrics` (timestamps in seconds, `# EOF` at the end) or `prometheus` (text
        /// format 0.0.4, timestamps in milliseconds).
        format: ImportFormat,
        file: PathBuf,
        data_dir: PathBuf,
        #[command(flatten)]
        graphite: GraphiteSchemaArgs,
    },
    /// Blocks, sizes and the highest-cardinality labels, metric names and label pairs.
    Analyze {
        data_dir: PathBuf,
        /// Block to analyse (default: the newest).
        #[arg(long)]
        block: Option<String>,
        /// Rows in each table.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Cut the head's older ranges into blocks and compact them, as the server does every
    /// minute: before a backup, or to check a directory's blocks. Rollup tiers on disk are
    /// filled and kept forever.
    Compact {
        data_dir: PathBuf,
        /// Also delete raw blocks older than this behind the newest sample, as a server with
        /// this `--retention` does (only once every rollup tier on disk holds them); default:
        /// no retention, nothing is deleted.
        #[arg(long)]
        retention: Option<String>,
        #[command(flatten)]
        graphite: GraphiteSchemaArgs,
    },
    /// Print samples as `labels value timestamp_ms` lines.
    Dump {
        data_dir: PathBuf,
        /// Series selector, e.g. `up{job="node"}`; repeatable (union). Default: every series.
        #[arg(long = "match")]
        matchers: Vec<String>,
        /// Start, milliseconds since the epoch (inclusive).
        #[arg(long, default_value_t = i64::MIN, allow_hyphen_values = true)]
        min_time: i64,
        /// End, milliseconds since the epoch (inclusive).
        #[arg(long, default_value_t = i64::MAX, allow_hyphen_values = true)]
        max_time: i64,
    },
}

/// Graphite's retention schemas, for tools that roll data up: given, they roll up as a server
/// with them does (its left-closed tiers added, each keeping the paths its schemas read and
/// whisper's values of the coarse archives); without, the tiers on disk keep every series.
#[derive(clap::Args, Debug, Default)]
struct GraphiteSchemaArgs {
    /// The `storage-schemas.conf` the server reads (`strata serve --graphite.storage-schemas`).
    #[arg(long = "graphite.storage-schemas")]
    storage_schemas: Option<PathBuf>,
    /// The `storage-aggregation.conf` the server reads.
    #[arg(long = "graphite.storage-aggregation")]
    storage_aggregation: Option<PathBuf>,
}

/// Left-closed tiers and the filter that rolls Graphite paths up into them.
type GraphiteRollup = (Vec<strata_tsdb::rollup::RollupTier>, strata_tsdb::rollup::SeriesFilter);

impl GraphiteSchemaArgs {
    /// The left-closed tiers the schemas give (kept forever: a tool never deletes data) and the
    /// filter that rolls paths up by their schemas; `None` without schemas.
    fn rollup(&self) -> Result<Option<GraphiteRollup>, Box<dyn std::error::Error>> {
        let Some(schemas_file) = &self.storage_schemas else {
            if self.storage_aggregation.is_some() {
                return Err("--graphite.storage-aggregation needs --graphite.storage-schemas".into());
            }
            return Ok(None);
        };
        let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("read {}: {e}", p.display()));
        let aggregation = self.storage_aggregation.as_ref().map(read).transpose()?;
        let schemas = strata_graphite::schema::Schemas::parse(&read(schemas_file)?, aggregation.as_deref())
            .map_err(|e| format!("{}: {e}", schemas_file.display()))?;
        let (tiers, notes) = strata_server::config::graphite_rollup_tiers(&schemas, 0, 0);
        for note in notes {
            eprintln!("graphite.storage-schemas: {note}");
        }
        let tiers = tiers.into_iter().map(|t| strata_tsdb::rollup::RollupTier { retention_ms: 0, ..t }).collect();
        Ok(Some((tiers, strata_server::http::graphite_rollup_filter(std::sync::Arc::new(schemas)))))
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ImportFormat {
    Openmetrics,
    Prometheus,
}

/// Opens a data directory for a one-shot tool: no background compaction thread, and no
/// retention: a tool never deletes data (an import of 30 days of history into a directory
/// whose server keeps 15 days used to delete half of what it had just imported). The server
/// applies its own retention when it next compacts, and logs every block it deletes.
fn open_for_tool(data_dir: &std::path::Path) -> Result<Db, Box<dyn std::error::Error>> {
    open_with_retention(data_dir, 0, &GraphiteSchemaArgs::default())
}

/// `open_for_tool`, deleting raw blocks `retention_ms` behind the newest sample when compacting,
/// and rolling up by Graphite's retention schemas when `graphite` names them.
fn open_with_retention(
    data_dir: &std::path::Path,
    retention_ms: i64,
    graphite: &GraphiteSchemaArgs,
) -> Result<Db, Box<dyn std::error::Error>> {
    // The tiers on disk, kept forever: a tool never deletes data.
    let mut rollups = strata_tsdb::db::discover_tiers(&strata_tsdb::vfs::OsFs, data_dir);
    let mut rollup_filter = None;
    if let Some((tiers, filter)) = graphite.rollup()? {
        for t in tiers {
            if !rollups.iter().any(|r| r.dir_name() == t.dir_name()) {
                rollups.push(t);
            }
        }
        rollups.sort_by_key(|t| (t.closed, t.interval_ms));
        rollup_filter = Some(filter);
    }
    let opts = DbOptions {
        compact_interval: None,
        retention_ms,
        retention_bytes: 0,
        rollups,
        rollup_filter,
        ..StorageConfig::default().db_options()
    };
    Ok(Db::open(data_dir, opts)?)
}

fn run_tsdb(cmd: TsdbCommand) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        TsdbCommand::Import { format, file, data_dir, graphite } => {
            let f = std::fs::File::open(&file).map_err(|e| format!("open {}: {e}", file.display()))?;
            let input: Box<dyn std::io::BufRead> = if file.extension().is_some_and(|e| e == "gz") {
                Box::new(std::io::BufReader::with_capacity(1 << 20, flate2::read::GzDecoder::new(f)))
            } else {
                Box::new(std::io::BufReader::with_capacity(1 << 20, f))
            };
            let format = match format {
                ImportFormat::Openmetrics => Format::OpenMetrics,
                ImportFormat::Prometheus => Format::Prometheus,
            };
            let db = open_with_retention(&data_dir, 0, &graphite)?;
            let started = std::time::Instant::now();
            let out = import::import_reader(&db, input, format).map_err(|e| format!("{}: {e}", file.display()))?;
            println!(
                "imported {} samples of {} series into {} blocks in {:.1?}",
                out.samples,
                out.series,
                out.blocks.len(),
                started.elapsed()
            );
            let compacted = db.compact()?;
            println!("compaction: {} merges", compacted.compactions);
            if let (Some(first), Some(last)) =
                (out.blocks.iter().map(|b| b.min_time).min(), out.blocks.iter().map(|b| b.max_time).max())
            {
                let days = (last - first) as f64 / 86_400_000.0;
                println!(
                    "imported data spans {} to {} ({days:.1} days); the import applies no retention: a server on this directory deletes blocks older than its --retention (default 15d) behind the newest sample when it next compacts, and logs each one",
                    strata_server::status::format_ms(first),
                    strata_server::status::format_ms(last),
                );
            }
            db.close()?;
        }
        TsdbCommand::Compact { data_dir, retention, graphite } => {
            let retention_ms = match retention {
                None => 0,
                Some(r) => strata_model::parse_duration_ms(&r).map_err(|e| format!("--retention {r:?}: {e}"))?,
            };
            let db = open_with_retention(&data_dir, retention_ms, &graphite)?;
            let out = db.compact()?;
            println!(
                "wrote {} blocks from the head, ran {} compactions, set aside {} corrupt blocks; {} blocks now",
                out.head_blocks,
                out.compactions,
                out.set_aside,
                db.blocks().len()
            );
            if !db.rollup_tiers().is_empty() {
                println!(
                    "rolled up {} blocks into the rollup tiers, merged rollup blocks {} times",
                    out.rolled_up, out.rollup_compactions
                );
            }
            if retention_ms > 0 {
                println!("retention deleted {} blocks", out.retention_deleted);
            }
            db.close()?;
        }
        TsdbCommand::Analyze { data_dir, block, limit } => {
            let db = open_for_tool(&data_dir)?;
            print!("{}", analyze::analyze(&db, block.as_deref(), limit)?);
            db.close()?;
        }
        TsdbCommand::Dump { data_dir, matchers, min_time, max_time } => {
            let db = open_for_tool(&data_dir)?;
            let sets: Vec<Vec<strata_model::Matcher>> = if matchers.is_empty() {
                vec![vec![strata_model::Matcher::new(strata_model::MatchOp::RegexMatch, "__name__", ".+")?]]
            } else {
                matchers.iter().map(|m| strata_model::parse_selector(m)).collect::<Result<_, _>>()?
            };
            let stdout = std::io::stdout();
            let mut w = std::io::BufWriter::new(stdout.lock());
            for set in &sets {
                analyze::dump(&db, set, min_time, max_time, &mut w)?;
            }
            std::io::Write::flush(&mut w)?;
            drop(w);
            db.close()?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    purge_freed_memory_promptly();
    let cli = Cli::parse();
    init_logging(cli.log_level, cli.log_format);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Opts the process out of transparent huge pages, unless `MIMALLOC_ALLOW_THP` asks for them.
/// mimalloc touches its arenas a few pages at a time; with THP on (`always`, as many distros
/// ship) each first touch faulted in and zeroed a whole 2 MiB page: carbon ingest of 20k paths
/// peaked at 215 MiB RSS instead of 105 MiB, and zeroing pages took a quarter of its CPU time.
/// Blocks are read through file mappings, which THP does not back, so queries lose nothing.
#[cfg(target_os = "linux")]
fn disable_transparent_huge_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        // Old kernels lack it; nothing breaks, memory is only less tight.
        eprintln!("strata: could not opt out of transparent huge pages: {}", std::io::Error::last_os_error());
    }
}

#[cfg(not(target_os = "linux"))]
fn disable_transparent_huge_pages() {}

/// mimalloc's option number for `purge_delay` (`mi_option_purge_delay` in v3's `mimalloc.h`;
/// the `libmimalloc-sys` constants follow v2's numbering, hence our own).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed pages stay with the allocator before they go back to the OS, milliseconds.
/// mimalloc's default is a second, and under ingest with churn its arenas held far more than
/// the live heap (200 instances, 60% replaced every 15 minutes: 490-530 MiB peak RSS for about
/// 300 MiB live). Purging at once (0) brought that to 366-415 MiB with the ingest path keeping
/// its buffers, but every request that builds large transient buffers (a find of 10,000
/// nodes, a render, a carbon batch) then faulted in fresh zeroed pages and purged them again:
/// a third of a leading-star find's time at a million paths. 10 ms keeps pages for the next
/// request of a busy server and still returns them within a blink: side by side on the churn
/// recording, peak RSS 404-415 MiB at 10 ms against 409-415 MiB at 0; carbon ingest of 1M
/// paths 1.43 against 1.62 CPU-s per million points, that find 2.5 against 4.3 ms p50.
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Sets `PURGE_DELAY_MS`, unless `MIMALLOC_PURGE_DELAY` says otherwise, and has kept worker
/// threads give their kept and freed memory back once idle for a second (mimalloc purges a thread's
/// pages only when that thread allocates again, and an idle worker does not).
fn purge_freed_memory_promptly() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one integer option; mimalloc reads options atomically on each use.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
    strata_tsdb::workers::on_idle(release_this_threads_free_memory);
}

/// Frees the buffers query evaluation keeps between queries, then returns the calling
/// thread's free allocator pages to the system.
fn release_this_threads_free_memory() {
    strata_promql::release_idle_memory();
    // SAFETY: collects the calling thread's own heap; no pointers are passed.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Status { data_dir, wal_fsync, top } => {
            let rollup_tiers = strata_tsdb::db::discover_tiers(&strata_tsdb::vfs::OsFs, &data_dir);
            let cfg = StorageConfig { data_dir, wal_fsync, rollup_tiers, ..Default::default() };
            let db = Db::open(&cfg.data_dir, cfg.db_options())?;
            print!("{}", strata_server::status::render(&db.status(top)?));
            db.close()?;
            Ok(())
        }
        Command::Tsdb(cmd) => run_tsdb(cmd),
        Command::Serve(args) => serve::run(*args),
        Command::Check(cmd) => match check::run(cmd) {
            true => Ok(()),
            false => Err("check failed".into()),
        },
    }
}
