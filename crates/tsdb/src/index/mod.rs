//! Series indexes. For now the postings lists and their set operations, shared by the head's
//! in-memory index and (next) the persisted block index.

pub mod matchers;
pub mod name_dict;
pub mod postings;
