//! Graphite on Strata's storage engine (see `ARCHITECTURE.md`, "Graphite"): a Graphite path is
//! a series whose `__name__` is the path, its tags become labels.
//!
//! What is here so far: the decoders of what carbon senders put on the wire (`carbon`),
//! Graphite 1.1's tagged paths (`path`), glob patterns (`glob`), the nodes a find returns
//! (`find`), retention schemas (`schema`), Graphite's time syntax (`attime`), tag expressions
//! (`tagexpr`), what a render answers for stored points (`render`) and graphite-web's cluster
//! format, Python pickles (`pickle`), the target language (`target`) and the render functions
//! evaluated over it (`functions`, graphite-web's library), and the events store (`events`).

pub mod attime;
pub mod carbon;
pub mod carbonapi;
pub mod events;
pub mod find;
pub mod functions;
pub mod glob;
pub mod msgpack;
pub mod path;
pub mod pickle;
pub mod render;
pub mod schema;
pub mod tagexpr;
pub mod target;
