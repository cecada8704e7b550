//! Scraping: Strata collects from targets the way Prometheus does, configured by a
//! `scrape_configs` section that Prometheus would accept.
//!
//! The layout follows the path of a sample: `config` (the YAML), `discovery` (where targets
//! come from: files, `http_sd` for HTTP endpoints, `kubernetes` for an API server, `dns_sd` for DNS records), `relabel` (rules on label sets), `target` (discovered labels to a target),
//! `scrape_loop` (fetch, parse, append, staleness) with its `cache` and `manager` (pools of loops kept in
//! step with discovery and reloads).

pub mod cache;
pub mod config;
pub mod discovery;
pub mod dns_sd;
pub mod http_sd;
pub mod kubernetes;
pub mod manager;
pub mod relabel;
pub mod scrape_loop;
pub mod target;

pub use manager::ScrapeManager;
