//! Carbon's pickle protocol: each message is a 4-byte big-endian length and a pickled list of
//! `(path, (timestamp, value))` tuples. Pickle is a program for a stack machine that can call
//! any Python function; this is not a general unpickler. It runs only the opcodes that
//! picklers emit for lists, tuples, strings, numbers and the memo (protocols 0 to 5), builds
//! nothing deeper than `DEPTH_MAX`, and refuses every other opcode (globals, object
//! construction, persistent ids) with an error naming it.
//!
//! Values are shared, not copied, when the memo stores or fetches them (strings, lists and
//! tuples sit behind `Arc`), so fetching a large value over and over costs nothing; a list is
//! copied only when something is appended to it while it is shared, and those copies are
//! charged to a budget proportional to the message, so no message makes more than a small
//! multiple of its size in memory. Difference from Python: appending to a shared list changes
//! only the copy appended to (a list changed after it was memoized is fetched as it was then);
//! carbon senders memoize their list before filling it and never fetch it again.

use std::sync::Arc;

use super::{parse_float, point, CarbonPoint, PointError};

/// Longest message accepted by default (carbon's `MAX_LENGTH` is 1 MiB; relays batch more).
pub const MESSAGE_BYTES_MAX_DEFAULT: usize = 16 << 20;
/// Nesting of lists and tuples: a carbon message needs 3.
const DEPTH_MAX: u8 = 16;

/// Why a pickled message was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    #[error("pickle ends before its STOP opcode")]
    Truncated,
    #[error("pickle opcode {0:#04x} at byte {1} is not one carbon senders use; refused")]
    Opcode(u8, usize),
    #[error("pickle at byte {0}: {1}")]
    Malformed(usize, &'static str),
    #[error("pickle nests lists or tuples deeper than {DEPTH_MAX}")]
    TooDeep,
    #[error("pickle copies more from its memo than its size allows")]
    MemoBudget,
    #[error("the pickle is not a list of datapoints")]
    NotAList,
}

impl PickleError {
    /// A short stable name for the `reason` label of the counter.
    pub fn reason(&self) -> &'static str {
        match self {
            PickleError::Truncated => "pickle_truncated",
            PickleError::Opcode(..) => "pickle_opcode_refused",
            PickleError::Malformed(..) => "pickle_malformed",
            PickleError::TooDeep => "pickle_too_deep",
            PickleError::MemoBudget => "pickle_memo_budget",
            PickleError::NotAList => "pickle_not_a_list",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Val {
    Str(Arc<str>),
    Bytes(Arc<[u8]>),
    Int(i64),
    Float(f64),
    None,
    Bool(bool),
    List(Arc<Seq>),
    Tuple(Arc<Seq>),
}

/// A list's or tuple's items, with the nesting depth kept as it grows.
#[derive(Debug, Clone, PartialEq)]
struct Seq {
    items: Vec<Val>,
    depth: u8,
}

impl Val {
    fn depth(&self) -> u8 {
        match self {
            Val::List(s) | Val::Tuple(s) => s.depth,
            _ => 0,
        }
    }
}

impl Seq {
    fn empty() -> Arc<Seq> {
        Arc::new(Seq { items: Vec::new(), depth: 1 })
    }

    fn push(&mut self, v: Val) -> Result<(), PickleError> {
        let depth = v.depth() + 1;
        if depth > DEPTH_MAX {
            return Err(PickleError::TooDeep);
        }
        self.depth = self.depth.max(depth);
        self.items.push(v);
        Ok(())
    }

    fn of(items: Vec<Val>) -> Result<Arc<Seq>, PickleError> {
        let mut s = Seq { items: Vec::with_capacity(items.len()), depth: 1 };
        for v in items {
            s.push(v)?;
        }
        Ok(Arc::new(s))
    }
}

/// An entry of the machine's stack: a value or a MARK.
#[derive(Debug)]
enum Entry {
    Mark,
    Val(Val),
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Entry>,
    memo: std::collections::HashMap<u64, Val>,
    /// Items that copies of shared lists may still take.
    budget: usize,
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or(PickleError::Truncated)?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| acc << 8 | x as u64))
    }

    /// The rest of the line (protocol 0 arguments), without its `\n`.
    fn line(&mut self) -> Result<&'a str, PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or(PickleError::Truncated)?;
        self.pos += n + 1;
        std::str::from_utf8(&rest[..n]).map_err(|_| PickleError::Malformed(self.pos, "argument is not UTF-8"))
    }

    fn push(&mut self, v: Val) {
        self.stack.push(Entry::Val(v));
    }

    fn pop(&mut self) -> Result<Val, PickleError> {
        match self.stack.pop() {
            Some(Entry::Val(v)) => Ok(v),
            _ => Err(PickleError::Malformed(self.pos, "stack underflow")),
        }
    }

    fn top(&mut self) -> Result<&mut Val, PickleError> {
        match self.stack.last_mut() {
            Some(Entry::Val(v)) => Ok(v),
            _ => Err(PickleError::Malformed(self.pos, "stack underflow")),
        }
    }

    /// The values above the topmost MARK, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Val>, PickleError> {
        let at = self
            .stack
            .iter()
            .rposition(|e| matches!(e, Entry::Mark))
            .ok_or(PickleError::Malformed(self.pos, "no MARK"))?;
        let items = self.stack.split_off(at + 1);
        self.stack.pop();
        Ok(items
            .into_iter()
            .map(|e| if let Entry::Val(v) = e { v } else { unreachable!("no mark above the topmost") })
            .collect())
    }

    fn string(&mut self, n: usize, utf8: bool) -> Result<(), PickleError> {
        if n > self.data.len() {
            return Err(PickleError::Truncated);
        }
        let b = self.take(n)?;
        let v = match std::str::from_utf8(b) {
            Ok(s) => Val::Str(s.into()),
            Err(_) if utf8 => return Err(PickleError::Malformed(self.pos, "string is not UTF-8")),
            // Python 2's `str` (BINSTRING) and bytes: read as UTF-8 like carbon's `.decode()`.
            Err(_) => Val::Bytes(b.into()),
        };
        self.push(v);
        Ok(())
    }

    fn memo_put(&mut self, key: u64) -> Result<(), PickleError> {
        let v = self.top()?.clone();
        self.memo.insert(key, v);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<(), PickleError> {
        let v = self.memo.get(&key).ok_or(PickleError::Malformed(self.pos, "memo key not found"))?.clone();
        self.push(v);
        Ok(())
    }

    /// The list on top of the stack, ready to take items: copied first if the memo (or
    /// another stack entry) shares it, the copy charged to the budget.
    fn top_list(&mut self, at: usize) -> Result<&mut Seq, PickleError> {
        let Some(Entry::Val(Val::List(seq))) = self.stack.last_mut() else {
            return Err(PickleError::Malformed(at, "APPEND to a non-list"));
        };
        if Arc::strong_count(seq) > 1 {
            self.budget = self.budget.checked_sub(seq.items.len()).ok_or(PickleError::MemoBudget)?;
        }
        Ok(Arc::make_mut(seq))
    }

    fn tuple(&mut self, n: usize) -> Result<(), PickleError> {
        if self.stack.len() < n || self.stack[self.stack.len() - n..].iter().any(|e| matches!(e, Entry::Mark)) {
            return Err(PickleError::Malformed(self.pos, "stack underflow"));
        }
        let items: Vec<Val> = self
            .stack
            .split_off(self.stack.len() - n)
            .into_iter()
            .map(|e| match e {
                Entry::Val(v) => v,
                Entry::Mark => unreachable!("checked above"),
            })
            .collect();
        let t = Val::Tuple(Seq::of(items)?);
        self.push(t);
        Ok(())
    }

    fn run(mut self) -> Result<Val, PickleError> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    self.u8()?; // PROTO n
                }
                0x95 => {
                    self.take(8)?; // FRAME length: frames are only a read-ahead hint
                }
                b'.' => return self.pop(), // STOP
                b'(' => self.stack.push(Entry::Mark),
                b']' => self.push(Val::List(Seq::empty())),
                b')' => self.push(Val::Tuple(Seq::empty())),
                b'l' => {
                    let items = self.pop_mark()?;
                    let l = Val::List(Seq::of(items)?);
                    self.push(l);
                }
                b't' => {
                    let items = self.pop_mark()?;
                    let t = Val::Tuple(Seq::of(items)?);
                    self.push(t);
                }
                0x85 => self.tuple(1)?,
                0x86 => self.tuple(2)?,
                0x87 => self.tuple(3)?,
                b'a' => {
                    let v = self.pop()?;
                    self.top_list(at)?.push(v)?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    let list = self.top_list(at)?;
                    for v in items {
                        list.push(v)?;
                    }
                }
                b'X' => {
                    let n = self.le(4)? as usize;
                    self.string(n, true)?;
                }
                0x8c => {
                    let n = self.u8()? as usize;
                    self.string(n, true)?;
                }
                0x8d => {
                    let n = usize::try_from(self.le(8)?).map_err(|_| PickleError::Truncated)?;
                    self.string(n, true)?;
                }
                b'T' | b'B' => {
                    let n = self.le(4)? as usize;
                    self.string(n, false)?;
                }
                b'U' | b'C' => {
                    let n = self.u8()? as usize;
                    self.string(n, false)?;
                }
                b'V' => {
                    // raw-unicode-escape; carbon paths are ASCII, where it is the text itself.
                    let s = self.line()?;
                    if s.contains('\\') {
                        return Err(PickleError::Malformed(at, "escaped UNICODE argument"));
                    }
                    let v = Val::Str(s.into());
                    self.push(v);
                }
                b'S' => {
                    // A Python string literal: 'text' or "text"; carbon paths need no escapes.
                    let s = self.line()?;
                    let inner = s
                        .strip_prefix('\'')
                        .and_then(|r| r.strip_suffix('\''))
                        .or_else(|| s.strip_prefix('"').and_then(|r| r.strip_suffix('"')))
                        .filter(|r| !r.contains('\\'))
                        .ok_or(PickleError::Malformed(at, "STRING argument is not a plain quoted string"))?;
                    let v = Val::Str(inner.into());
                    self.push(v);
                }
                b'I' => {
                    let s = self.line()?;
                    let v = match s {
                        "00" => Val::Bool(false),
                        "01" => Val::Bool(true),
                        _ => Val::Int(s.trim().parse().map_err(|_| PickleError::Malformed(at, "INT argument"))?),
                    };
                    self.push(v);
                }
                b'L' => {
                    let s = self.line()?;
                    let digits = s.strip_suffix('L').unwrap_or(s);
                    let v = match digits.parse::<i64>() {
                        Ok(i) => Val::Int(i),
                        Err(_) => Val::Float(digits.parse().map_err(|_| PickleError::Malformed(at, "LONG argument"))?),
                    };
                    self.push(v);
                }
                b'J' => {
                    let v = self.le(4)? as u32 as i32;
                    self.push(Val::Int(v as i64));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Val::Int(v as i64));
                }
                b'M' => {
                    let v = self.le(2)?;
                    self.push(Val::Int(v as i64));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a { self.u8()? as usize } else { self.le(4)? as usize };
                    let b = self.take(n)?;
                    self.push(long_le(b));
                }
                b'F' => {
                    let s = self.line()?;
                    let v = parse_float(s).ok_or(PickleError::Malformed(at, "FLOAT argument"))?;
                    self.push(Val::Float(v));
                }
                b'G' => {
                    let b = self.take(8)?;
                    self.push(Val::Float(f64::from_be_bytes(b.try_into().expect("8 bytes"))));
                }
                b'N' => self.push(Val::None),
                0x88 => self.push(Val::Bool(true)),
                0x89 => self.push(Val::Bool(false)),
                b'p' => {
                    let key = self.line()?.parse().map_err(|_| PickleError::Malformed(at, "PUT argument"))?;
                    self.memo_put(key)?;
                }
                b'q' => {
                    let key = self.u8()? as u64;
                    self.memo_put(key)?;
                }
                b'r' => {
                    let key = self.le(4)?;
                    self.memo_put(key)?;
                }
                0x94 => {
                    let key = self.memo.len() as u64;
                    self.memo_put(key)?;
                }
                b'g' => {
                    let key = self.line()?.parse().map_err(|_| PickleError::Malformed(at, "GET argument"))?;
                    self.memo_get(key)?;
                }
                b'h' => {
                    let key = self.u8()? as u64;
                    self.memo_get(key)?;
                }
                b'j' => {
                    let key = self.le(4)?;
                    self.memo_get(key)?;
                }
                other => return Err(PickleError::Opcode(other, at)),
            }
        }
    }
}

/// A little-endian two's complement integer of any length (LONG1, LONG4): exact when it fits
/// an i64, a float otherwise.
fn long_le(b: &[u8]) -> Val {
    if b.is_empty() {
        return Val::Int(0);
    }
    let negative = b[b.len() - 1] & 0x80 != 0;
    if b.len() <= 8 {
        let mut v: u64 = if negative { u64::MAX } else { 0 };
        for (i, &x) in b.iter().enumerate() {
            v &= !(0xff << (8 * i));
            v |= (x as u64) << (8 * i);
        }
        return Val::Int(v as i64);
    }
    // Wider than 64 bits: magnitude by floating point (a timestamp or value that large is
    // refused later anyway).
    let mut f = 0.0f64;
    for &x in b.iter().rev() {
        f = f * 256.0 + if negative { (!x) as f64 } else { x as f64 };
    }
    Val::Float(if negative { -(f + 1.0) } else { f })
}

fn number(v: &Val) -> Option<(f64, String)> {
    match v {
        Val::Int(i) => Some((*i as f64, i.to_string())),
        Val::Float(f) => Some((*f, f.to_string())),
        Val::Bool(b) => Some((*b as u8 as f64, (*b as u8).to_string())),
        // carbon calls float() on what it gets: numeric strings pass.
        Val::Str(s) => parse_float(s).map(|f| (f, s.to_string())),
        _ => None,
    }
}

/// The two items of a tuple or list of two.
fn pair(v: &Val) -> Option<(&Val, &Val)> {
    match v {
        Val::Tuple(s) | Val::List(s) => match s.items.as_slice() {
            [a, b] => Some((a, b)),
            _ => None,
        },
        _ => None,
    }
}

fn datapoint(v: &Val, now_ms: i64) -> Result<CarbonPoint, PointError> {
    let (path, ts_value) = pair(v).ok_or(PointError::BadShape)?;
    let path = match path {
        Val::Str(s) => s,
        Val::Bytes(_) => return Err(PointError::NotUtf8),
        _ => return Err(PointError::BadShape),
    };
    let (ts, value) = pair(ts_value).ok_or(PointError::BadShape)?;
    let (seconds, raw_ts) = number(ts).ok_or_else(|| PointError::BadTimestamp(format!("{ts:?}")))?;
    let (value, _) = number(value).ok_or_else(|| PointError::BadValue(format!("{value:?}")))?;
    point(path, value, seconds, &raw_ts, now_ms)
}

/// Decodes one message body (without its length prefix): the datapoints in order, each taken
/// or refused on its own; the message as a whole fails only if it is not a pickled list.
pub fn decode(message: &[u8], now_ms: i64) -> Result<Vec<Result<CarbonPoint, PointError>>, PickleError> {
    let m = Machine {
        data: message,
        pos: 0,
        stack: Vec::new(),
        memo: std::collections::HashMap::new(),
        // A sender's pickle copies nothing (it fills its list before anything shares it): the
        // budget only stops a message that copies lists from growing far past its own size.
        budget: 1024 + message.len() / 8,
    };
    match m.run()? {
        Val::List(s) => Ok(s.items.iter().map(|v| datapoint(v, now_ms)).collect()),
        _ => Err(PickleError::NotAList),
    }
}

#[cfg(test)]
mod tests;
