//! Graphite on Strata's storage engine (see `ARCHITECTURE.md`, "Graphite"): a Graphite path is
//! a series whose `__name__` is the path, its tags become labels.
//!
//! What is here so far: the decoders of what carbon senders put on the wire (`carbon`) and
//! Graphite 1.1's tagged paths (`path`). The listeners, the glob index, find and render come
//! next.

pub mod carbon;
pub mod path;
