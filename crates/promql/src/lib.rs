//! PromQL for Strata: parse, plan, evaluate step-vectorized over `strata_tsdb::querier`.
//!
//! Empty until the PromQL engine milestone; the crate exists so that the workspace already has
//! its final shape and the server can depend on it.
