//! Strata's server: how the binary's settings become an open database, the HTTP API
//! (Prometheus' query API, remote write and read, imports), scraping, and how its state is
//! reported.

pub mod analyze;
pub mod carbon;
pub mod config;
pub mod config_file;
pub mod http;
pub mod import;
pub mod metrics;
pub mod otlp;
pub mod process;
pub mod query_cache;
pub mod query_json;
pub mod remote;
pub mod rules;
pub mod scrape;
pub mod status;
pub mod textparse;
pub mod timeparse;
pub mod ui;
pub mod web;
