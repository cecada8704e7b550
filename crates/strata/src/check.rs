//! `strata check rules FILE...` and `strata check config FILE`: promtool's checks, with its
//! output, so a CI step written for promtool reads the same here. Exit status 1 when any file
//! fails.

use std::path::{Path, PathBuf};

use strata_server::config_file::ConfigFile;
use strata_server::rules::file::{load_file, LoadOptions};
use strata_server::rules::notifier::Notifier;

#[derive(clap::Subcommand, Debug)]
pub enum CheckCommand {
    /// Check rule files as `promtool check rules` does.
    Rules {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Check a configuration file (scrape jobs, alerting, and the rule files it names) as
    /// `promtool check config` does.
    Config {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

/// Runs the check; `Ok(false)` when a file failed (the messages are printed).
pub fn run(cmd: CheckCommand) -> bool {
    match cmd {
        // Every file is checked, not only those up to the first failure.
        CheckCommand::Rules { files } => files.iter().filter(|f| !check_rules(f)).count() == 0,
        CheckCommand::Config { files } => files.iter().filter(|f| !check_config(f)).count() == 0,
    }
}

fn check_rules(path: &Path) -> bool {
    println!("Checking {}", path.display());
    match load_file(path, &LoadOptions::default()) {
        Ok(groups) => {
            let n: usize = groups.iter().map(|g| g.rules.len()).sum();
            println!("  SUCCESS: {n} rules found\n");
            true
        }
        Err(errors) => {
            eprintln!("  FAILED:");
            for e in errors {
                eprintln!("{e}");
            }
            eprintln!();
            false
        }
    }
}

fn check_config(path: &Path) -> bool {
    println!("Checking {}", path.display());
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let checked = ConfigFile::load(path).and_then(|(file, _)| {
        file.scrape_jobs(&base)?;
        Notifier::check(&file.alerting, &base)?;
        let rule_files = strata_server::rules::file::expand_globs(&file.rule_files, &base)?;
        Ok(rule_files)
    });
    match checked {
        Ok(rule_files) => {
            println!("  SUCCESS: {} rule files found", rule_files.len());
            println!(" SUCCESS: {} is valid prometheus config file syntax\n", path.display());
            rule_files.iter().filter(|f| !check_rules(f)).count() == 0
        }
        Err(e) => {
            eprintln!("  FAILED: {e}\n");
            false
        }
    }
}
