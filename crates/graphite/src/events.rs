//! Graphite's events: annotations (a deploy, an outage) posted to `/events/` with a time, a
//! description (`what`), free-form `data` and tags, read back by `/events/get_data` (Grafana's
//! Graphite annotations read them there) and counted per second by the `events(...)` render
//! function.
//!
//! graphite-web keeps them in its Django database; Strata keeps them in memory, sorted by
//! time, and on disk in an append-only log of checksummed records (`docs/format/events.md`),
//! each written and synced before the post is acknowledged. A torn or damaged log is found by
//! its checksums at open: a torn last record is cut off, anything worse sets the file aside
//! under a new name before the readable records are written again, and the caller is told
//! (`Opened::damage`) so that it can say so loudly.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// The log's first bytes: what the file is, then its format version.
const MAGIC: &[u8; 8] = b"STRATAEV";
const VERSION: u32 = 1;
/// Magic, version, and the first id the log may give (ids are never given twice, even once the
/// events that had them are gone).
const HEADER_LEN: usize = 8 + 4 + 8;
/// A record's length and checksum, before its payload.
const RECORD_HEADER_LEN: usize = 8;
/// Largest payload a record may declare: an event is a few hundred bytes, and a length past
/// this is damage, not an event.
const PAYLOAD_MAX: usize = 64 << 20;

/// The log's file name in its directory.
pub const FILE_NAME: &str = "events.log";

#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
    /// A posted event graphite-web would not store; the message names what was wrong.
    #[error("{0}")]
    BadEvent(String),
    #[error("the events store holds its most events ({0}; raise --graphite.events-max or shorten the retention)")]
    Full(usize),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> EventError + 'a {
    move |source| EventError::Io { op, path: path.to_owned(), source }
}

/// One event, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: u64,
    /// Microseconds since the epoch (graphite-web keeps a `datetime`, to the microsecond).
    pub when_us: i64,
    pub what: String,
    pub data: String,
    /// The tags as posted (a list joined by spaces): what `get_data` answers, split at
    /// whitespace, as graphite-web does.
    pub tags_text: String,
    /// The tags an event is found by: `tags_text` parsed by django-tagging's rules.
    tags: Vec<String>,
}

impl Event {
    /// The epoch second of `when`, as graphite-web's `epoch()` truncates it.
    pub fn when_s(&self) -> i64 {
        self.when_us.div_euclid(1_000_000)
    }

    /// The tags the event is found by, sorted and distinct.
    pub fn tags(&self) -> &[String] {
        &self.tags
    }

    /// The event as `/events/get_data` lists it: `when` (epoch seconds), `what`, `data`,
    /// `tags` (the posted text split at whitespace) and `id`.
    pub fn to_json(&self) -> Value {
        let tags: Vec<&str> = self.tags_text.split_whitespace().collect();
        json!({"when": self.when_s(), "what": self.what, "data": self.data, "tags": tags, "id": self.id})
    }

    fn matches(&self, tags: &[String], how: TagMatch) -> bool {
        let has = |t: &String| self.tags.binary_search(t).is_ok();
        match how {
            TagMatch::All => tags.iter().all(has),
            TagMatch::Any => tags.iter().any(has),
        }
    }

    /// The record payload (`docs/format/events.md`).
    fn payload(&self) -> Vec<u8> {
        let v = json!({"id": self.id, "when_us": self.when_us, "what": self.what, "data": self.data, "tags": self.tags_text});
        serde_json::to_vec(&v).expect("a JSON value serializes")
    }

    fn from_payload(payload: &[u8]) -> Option<Event> {
        let v: Value = serde_json::from_slice(payload).ok()?;
        let text = |k: &str| v.get(k)?.as_str().map(str::to_owned);
        let tags_text = text("tags")?;
        Some(Event {
            id: v.get("id")?.as_u64()?,
            when_us: v.get("when_us")?.as_i64()?,
            what: text("what")?,
            data: text("data")?,
            tags: parse_tags(&tags_text),
            tags_text,
        })
    }
}

/// An event as posted, before it has an id.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub when_us: i64,
    pub what: String,
    pub data: String,
    pub tags_text: String,
}

impl NewEvent {
    /// A posted body as graphite-web reads it: a JSON object with `what` (required), `when`
    /// (epoch seconds, fractions kept to the microsecond; `now_us` when absent), `data` (text;
    /// other JSON is kept as its JSON text) and `tags` (a list of strings, joined by spaces, or
    /// one string).
    pub fn from_json(body: &[u8], now_us: i64) -> Result<NewEvent, EventError> {
        let bad = |m: String| EventError::BadEvent(m);
        let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("the event is not JSON: {e}")))?;
        let Value::Object(o) = v else {
            return Err(bad("the event must be a JSON object with \"what\", \"when\", \"tags\" and \"data\"".into()));
        };
        let what = match o.get("what") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => return Err(bad(format!("\"what\" must be a string, not {other}"))),
            None => return Err(bad("the event has no \"what\"".into())),
        };
        let tags_text = match o.get("tags") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(items)) => {
                let words: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
                words.ok_or_else(|| bad("\"tags\" must be an array of strings".into()))?.join(" ")
            }
            Some(_) => return Err(bad("\"tags\" must be an array or space-separated string".into())),
        };
        let when_us = match o.get("when") {
            None => now_us,
            Some(Value::Number(n)) => {
                let s = n.as_f64().unwrap_or(f64::NAN);
                // Python's datetime spans years 1 to 9999.
                if !(-62_135_596_800.0..253_402_300_800.0).contains(&s) {
                    return Err(bad(format!("\"when\" {n} is not an epoch time from year 1 to 9999")));
                }
                match n.as_i64() {
                    Some(i) => i * 1_000_000,
                    None => (s * 1e6).round() as i64,
                }
            }
            Some(other) => return Err(bad(format!("\"when\" must be epoch seconds, not {other}"))),
        };
        let data = match o.get("data") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        Ok(NewEvent { when_us, what, data, tags_text })
    }
}

/// How a query's tags select events: all of them (graphite-web's default and `intersection`)
/// or any (`union`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagMatch {
    All,
    Any,
}

/// What opening a log found beyond its events.
#[derive(Debug, Default)]
pub struct Opened {
    /// Events dropped for being older than the retention.
    pub expired: usize,
    pub damage: Option<Damage>,
}

/// A log that did not read to its end.
#[derive(Debug)]
pub struct Damage {
    /// Where the first unreadable record starts.
    pub offset: u64,
    pub reason: String,
    /// Events read before it, kept.
    pub kept: usize,
    /// Where the damaged file was moved, unless only a torn last record was cut off.
    pub set_aside: Option<PathBuf>,
}

/// The events, in memory and in their log.
#[derive(Debug)]
pub struct EventLog {
    path: PathBuf,
    file: File,
    /// The log's length: appends go there, and a failed append is cut back to it.
    len: u64,
    /// Sorted by time, then id.
    events: Vec<Event>,
    next_id: u64,
    max_events: usize,
}

impl EventLog {
    /// Opens (or creates) the log in `dir`, dropping events from before `keep_since_us`.
    pub fn open(dir: &Path, max_events: usize, keep_since_us: i64) -> Result<(EventLog, Opened), EventError> {
        std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        let path = dir.join(FILE_NAME);
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes).map_err(io_err("read", &path))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("open", &path)(e)),
        }
        let read = read_log(&bytes);
        let mut opened = Opened::default();
        let mut events = read.events;
        let next_id = events.iter().map(|e| e.id + 1).max().unwrap_or(1).max(read.first_id);
        let before = events.len();
        events.retain(|e| e.when_us >= keep_since_us);
        opened.expired = before - events.len();
        events.sort_by_key(|e| (e.when_us, e.id));
        let mut rewrite = bytes.is_empty() || opened.expired > 0;
        if let Some((offset, reason)) = read.damage {
            let torn_tail = reason.torn_tail;
            let mut damage = Damage { offset, reason: reason.text, kept: events.len(), set_aside: None };
            if !torn_tail {
                let aside = dir.join(format!("{FILE_NAME}.damaged-{}", unix_seconds()));
                std::fs::rename(&path, &aside).map_err(io_err("set aside", &path))?;
                damage.set_aside = Some(aside);
            }
            opened.damage = Some(damage);
            rewrite = true;
        }
        if rewrite {
            write_whole(dir, &path, next_id, &events)?;
        }
        let file = OpenOptions::new().append(true).open(&path).map_err(io_err("open", &path))?;
        let len = file.metadata().map_err(io_err("stat", &path))?.len();
        Ok((EventLog { path, file, len, events, next_id, max_events }, opened))
    }

    /// Stores `e` durably and answers it with its id. Events from before `keep_since_us` are
    /// dropped first when the store is full.
    pub fn add(&mut self, e: NewEvent, keep_since_us: i64) -> Result<&Event, EventError> {
        if self.events.len() >= self.max_events {
            self.drop_before(keep_since_us)?;
            if self.events.len() >= self.max_events {
                return Err(EventError::Full(self.max_events));
            }
        }
        let event = Event {
            id: self.next_id,
            when_us: e.when_us,
            what: e.what,
            data: e.data,
            tags: parse_tags(&e.tags_text),
            tags_text: e.tags_text,
        };
        let record = record(&event.payload());
        let written = self.file.write_all(&record).and_then(|()| self.file.sync_data());
        if let Err(source) = written {
            // Cut a partial record back off, so that the next append does not follow garbage.
            let _ = self.file.set_len(self.len);
            return Err(EventError::Io { op: "append to", path: self.path.clone(), source });
        }
        self.len += record.len() as u64;
        self.next_id += 1;
        let at = self.events.partition_point(|x| (x.when_us, x.id) <= (event.when_us, event.id));
        self.events.insert(at, event);
        Ok(&self.events[at])
    }

    /// Drops the events from before `keep_since_us`, writing the log again if any were.
    pub fn drop_before(&mut self, keep_since_us: i64) -> Result<usize, EventError> {
        let gone = self.events.partition_point(|e| e.when_us < keep_since_us);
        if gone == 0 {
            return Ok(0);
        }
        let kept = self.events.split_off(gone);
        let dir = self.path.parent().expect("the log is in a directory").to_owned();
        write_whole(&dir, &self.path, self.next_id, &kept)?;
        self.file = OpenOptions::new().append(true).open(&self.path).map_err(io_err("open", &self.path))?;
        self.len = self.file.metadata().map_err(io_err("stat", &self.path))?.len();
        self.events = kept;
        Ok(gone)
    }

    /// The events from `from_us` to `until_us` (both included) in time order, those with the
    /// tags when `tags` is given (none when it is given empty, as graphite-web answers).
    pub fn find<'a>(
        &'a self,
        from_us: i64,
        until_us: i64,
        tags: Option<&'a [String]>,
        how: TagMatch,
    ) -> impl Iterator<Item = &'a Event> + 'a {
        let start = self.events.partition_point(|e| e.when_us < from_us);
        let end = self.events.partition_point(|e| e.when_us <= until_us).max(start);
        self.events[start..end].iter().filter(move |e| match tags {
            None => true,
            Some([]) => false,
            Some(tags) => e.matches(tags, how),
        })
    }

    pub fn get(&self, id: u64) -> Option<&Event> {
        self.events.iter().find(|e| e.id == id)
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A record: payload length and CRC-32C (little-endian), then the payload.
fn record(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn header(first_id: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&first_id.to_le_bytes());
    out
}

/// Writes a whole log (header, then `events`) beside `path` and renames it over `path`,
/// synced, so that a crash leaves the old log or the new one.
fn write_whole(dir: &Path, path: &Path, first_id: u64, events: &[Event]) -> Result<(), EventError> {
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let mut bytes = header(first_id);
    for e in events {
        bytes.extend_from_slice(&record(&e.payload()));
    }
    let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(&bytes).and_then(|()| f.sync_all()).map_err(io_err("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err("rename", &tmp))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync", dir))
}

/// Why a log stopped reading, and whether it is only a torn last record.
struct Stop {
    text: String,
    torn_tail: bool,
}

struct ReadLog {
    first_id: u64,
    events: Vec<Event>,
    damage: Option<(u64, Stop)>,
}

/// The events of a log's bytes, up to the first record that does not read.
fn read_log(bytes: &[u8]) -> ReadLog {
    let mut out = ReadLog { first_id: 1, events: Vec::new(), damage: None };
    if bytes.is_empty() {
        return out;
    }
    if bytes.len() < HEADER_LEN {
        // A header cut short is a log whose creation was torn, if what there is of it matches.
        let torn = header(1)[..bytes.len().min(12)] == bytes[..bytes.len().min(12)];
        let text = format!("the header is {} bytes, not {HEADER_LEN}", bytes.len());
        out.damage = Some((0, Stop { text, torn_tail: torn }));
        return out;
    }
    if &bytes[..8] != MAGIC || bytes[8..12] != VERSION.to_le_bytes() {
        let text = "the file does not start with an events log header (version 1)".to_owned();
        out.damage = Some((0, Stop { text, torn_tail: false }));
        return out;
    }
    out.first_id = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    let mut at = HEADER_LEN;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let stop = |text: String, torn_tail: bool| Some((at as u64, Stop { text, torn_tail }));
        if rest.len() < RECORD_HEADER_LEN {
            out.damage = stop(format!("a record header cut short ({} bytes)", rest.len()), true);
            return out;
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        if len > PAYLOAD_MAX {
            out.damage = stop(format!("a record declares {len} bytes"), false);
            return out;
        }
        let end = RECORD_HEADER_LEN + len;
        if rest.len() < end {
            out.damage = stop(format!("a record of {len} bytes cut short at {}", rest.len() - RECORD_HEADER_LEN), true);
            return out;
        }
        let payload = &rest[RECORD_HEADER_LEN..end];
        // The last record failing its checksum is a write the crash tore; one followed by
        // more records is damage.
        let last = rest.len() == end;
        if crc32c::crc32c(payload) != crc {
            out.damage = stop("a record fails its checksum".to_owned(), last);
            return out;
        }
        match Event::from_payload(payload) {
            Some(e) => out.events.push(e),
            None => {
                out.damage = stop("a record's checksum holds but it is not an event".to_owned(), false);
                return out;
            }
        }
        at += end;
    }
    out
}

/// Tag text split into tags by django-tagging's `parse_tag_input` (which graphite-web's events
/// use): words apart at spaces, or at commas when there are any outside double quotes; a
/// double-quoted phrase is one tag. Sorted and distinct.
pub fn parse_tags(input: &str) -> Vec<String> {
    fn split_strip(s: &str, delimiter: char) -> impl Iterator<Item = String> + '_ {
        s.split(delimiter).map(str::trim).filter(|w| !w.is_empty()).map(str::to_owned)
    }
    let mut words: Vec<String> = Vec::new();
    if !input.contains(',') && !input.contains('"') {
        words.extend(split_strip(input, ' '));
    } else {
        let mut to_be_split = Vec::new();
        let (mut buffer, mut saw_loose_comma, mut open_quote) = (String::new(), false, false);
        let mut chars = input.chars();
        'input: while let Some(c) = chars.next() {
            if c == '"' {
                if !buffer.is_empty() {
                    to_be_split.push(std::mem::take(&mut buffer));
                }
                open_quote = true;
                loop {
                    match chars.next() {
                        None => break 'input,
                        Some('"') => break,
                        Some(c) => buffer.push(c),
                    }
                }
                let word = buffer.trim();
                if !word.is_empty() {
                    words.push(word.to_owned());
                }
                buffer.clear();
                open_quote = false;
            } else {
                saw_loose_comma |= c == ',';
                buffer.push(c);
            }
        }
        // A quote never closed: what followed it is split as if unquoted.
        if !buffer.is_empty() {
            saw_loose_comma |= open_quote && buffer.contains(',');
            to_be_split.push(buffer);
        }
        let delimiter = if saw_loose_comma { ',' } else { ' ' };
        for chunk in &to_be_split {
            words.extend(split_strip(chunk, delimiter));
        }
    }
    words.sort();
    words.dedup();
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn posted(when: i64, what: &str, tags: &str) -> NewEvent {
        NewEvent { when_us: when * 1_000_000, what: what.into(), data: String::new(), tags_text: tags.into() }
    }

    #[test]
    fn tags_parse_as_django_tagging_parses_them() {
        assert_eq!(parse_tags("deploy web  web"), ["deploy", "web"]);
        assert_eq!(parse_tags("a b, c d"), ["a b", "c d"]);
        assert_eq!(parse_tags("\"one, two\" three four"), ["four", "one, two", "three"]);
        assert_eq!(parse_tags("\"unclosed, here"), ["here", "unclosed"]);
        assert_eq!(parse_tags(""), Vec::<String>::new());
        assert_eq!(parse_tags(" , ,"), Vec::<String>::new());
    }

    #[test]
    fn posted_events_read_as_graphite_web_reads_them() {
        let e = NewEvent::from_json(br#"{"what":"deploy","tags":["a","b c"],"when":12.5,"data":"v1"}"#, 0).unwrap();
        assert_eq!(
            e,
            NewEvent { when_us: 12_500_000, what: "deploy".into(), data: "v1".into(), tags_text: "a b c".into() }
        );
        let e = NewEvent::from_json(br#"{"what":"x","data":{"k":1}}"#, 7).unwrap();
        assert_eq!((e.when_us, e.data.as_str(), e.tags_text.as_str()), (7, r#"{"k":1}"#, ""));
        for (body, says) in [
            (&br#"{"tags":"a"}"#[..], "no \"what\""),
            (br#"{"what":"x","tags":3}"#, "array or space-separated string"),
            (br#"{"what":"x","tags":[1]}"#, "array of strings"),
            (br#"{"what":"x","when":"yesterday"}"#, "epoch seconds"),
            (br#"{"what":"x","when":1e300}"#, "year 1 to 9999"),
            (br#"[1]"#, "JSON object"),
            (br#"{"what":"#, "not JSON"),
        ] {
            let e = NewEvent::from_json(body, 0).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn events_are_found_by_time_and_tags_and_kept_across_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, opened) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
        assert!(opened.damage.is_none());
        log.add(posted(300, "c", "deploy web"), i64::MIN).unwrap();
        log.add(posted(100, "a", "deploy db"), i64::MIN).unwrap();
        log.add(posted(200, "b", "outage"), i64::MIN).unwrap();
        let find = |log: &EventLog, from: i64, until: i64, tags: Option<&[String]>, how| {
            log.find(from * 1_000_000, until * 1_000_000, tags, how).map(|e| e.what.clone()).collect::<Vec<_>>()
        };
        assert_eq!(find(&log, 0, 1000, None, TagMatch::All), ["a", "b", "c"]);
        assert_eq!(find(&log, 100, 200, None, TagMatch::All), ["a", "b"]);
        let deploy_web = ["deploy".to_owned(), "web".to_owned()];
        assert_eq!(find(&log, 0, 1000, Some(&deploy_web), TagMatch::All), ["c"]);
        assert_eq!(find(&log, 0, 1000, Some(&deploy_web), TagMatch::Any), ["a", "c"]);
        assert_eq!(find(&log, 0, 1000, Some(&[]), TagMatch::Any), Vec::<String>::new());
        drop(log);
        let (log, _) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
        assert_eq!(find(&log, 0, 1000, None, TagMatch::All), ["a", "b", "c"]);
        assert_eq!(
            log.get(2).unwrap().to_json(),
            json!({"when": 100, "what": "a", "data": "", "tags": ["deploy", "db"], "id": 2})
        );
        // Expired events go at open, and their ids are not given again.
        drop(log);
        let (mut log, opened) = EventLog::open(dir.path(), 100, 250 * 1_000_000).unwrap();
        assert_eq!((opened.expired, log.len()), (2, 1));
        assert_eq!(log.add(posted(400, "d", ""), i64::MIN).unwrap().id, 4);
        drop(log);
        let (mut log, _) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
        assert_eq!(log.add(posted(500, "e", ""), i64::MIN).unwrap().id, 5);
    }

    #[test]
    fn a_full_store_refuses_unless_old_events_can_go() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = EventLog::open(dir.path(), 2, i64::MIN).unwrap();
        log.add(posted(1, "a", ""), 0).unwrap();
        log.add(posted(2, "b", ""), 0).unwrap();
        assert!(matches!(log.add(posted(3, "c", ""), 0), Err(EventError::Full(2))));
        log.add(posted(3, "c", ""), 2 * 1_000_000).unwrap();
        let whats: Vec<_> = log.find(i64::MIN, i64::MAX, None, TagMatch::All).map(|e| e.what.as_str()).collect();
        assert_eq!(whats, ["b", "c"]);
    }

    #[test]
    fn a_torn_last_record_is_cut_off_and_damage_sets_the_file_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
        for t in 1..=3 {
            log.add(posted(t, "e", ""), i64::MIN).unwrap();
        }
        drop(log);
        let path = dir.path().join(FILE_NAME);
        let whole = std::fs::read(&path).unwrap();
        // Torn: the last record cut anywhere.
        std::fs::write(&path, &whole[..whole.len() - 5]).unwrap();
        let (log, opened) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
        let damage = opened.damage.unwrap();
        assert_eq!((log.len(), damage.kept, damage.set_aside.is_none()), (2, 2, true));
        drop(log);
        let (log, opened) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
        assert!(opened.damage.is_none(), "the log was repaired");
        assert_eq!(log.len(), 2);
        drop(log);
        // Damage in the middle: a flipped byte in the first record.
        let mut bad = std::fs::read(&path).unwrap();
        bad[HEADER_LEN + RECORD_HEADER_LEN + 3] ^= 0x40;
        std::fs::write(&path, &bad).unwrap();
        let (log, opened) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
        let damage = opened.damage.unwrap();
        assert_eq!((log.len(), damage.offset), (0, HEADER_LEN as u64));
        assert_eq!(std::fs::read(damage.set_aside.unwrap()).unwrap(), bad);
        // Not a log at all.
        drop(log);
        std::fs::write(&path, b"something else entirely").unwrap();
        let (_, opened) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
        assert!(opened.damage.unwrap().set_aside.is_some());
    }

    /// The worked example of `docs/format/events.md`, byte for byte.
    #[test]
    fn a_new_log_with_one_event_is_the_documented_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = EventLog::open(dir.path(), 10, i64::MIN).unwrap();
        let posted = br#"{"what": "deploy", "tags": ["app", "v2"], "when": 1700000000}"#;
        log.add(NewEvent::from_json(posted, 0).unwrap(), i64::MIN).unwrap();
        let payload = br#"{"id":1,"when_us":1700000000000000,"what":"deploy","data":"","tags":"app v2"}"#;
        let mut want = b"STRATAEV\x01\0\0\0\x01\0\0\0\0\0\0\0\x4d\0\0\0".to_vec();
        want.extend_from_slice(&[0x5a, 0x0a, 0x4b, 0xf1]);
        want.extend_from_slice(payload);
        assert_eq!(crc32c::crc32c(payload).to_le_bytes(), [0x5a, 0x0a, 0x4b, 0xf1]);
        assert_eq!(std::fs::read(dir.path().join(FILE_NAME)).unwrap(), want);
    }

    proptest! {
        /// Whatever the bytes, opening reads what it can and never panics; the events it keeps
        /// are those of the longest readable prefix.
        #[test]
        fn any_log_bytes_open(cut in 0usize..400, flip in proptest::option::of((0usize..400, 0u8..8))) {
            let dir = tempfile::tempdir().unwrap();
            let (mut log, _) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
            for t in 0..5 {
                log.add(posted(t, "event", "a b"), i64::MIN).unwrap();
            }
            drop(log);
            let path = dir.path().join(FILE_NAME);
            let mut bytes = std::fs::read(&path).unwrap();
            bytes.truncate(cut.min(bytes.len()));
            if let Some((at, bit)) = flip {
                if at < bytes.len() {
                    bytes[at] ^= 1 << bit;
                }
            }
            std::fs::write(&path, &bytes).unwrap();
            let (log, _) = EventLog::open(dir.path(), 100, i64::MIN).unwrap();
            prop_assert!(log.len() <= 5);
            prop_assert!(log.find(i64::MIN, i64::MAX, None, TagMatch::All).all(|e| e.what == "event"));
        }

        #[test]
        fn tags_parse_without_panicking(input in "[ a-c,\"]{0,24}") {
            let tags = parse_tags(&input);
            prop_assert!(tags.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(tags.iter().all(|t| !t.is_empty() && t.trim() == t));
        }
    }
}
