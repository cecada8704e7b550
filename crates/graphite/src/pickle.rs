//! Writing Python pickles: graphite-web's cluster format (`format=pickle` of `/metrics/find` and
//! `/render`), which graphite-web reads from its `CLUSTER_SERVERS` with a restricted unpickler.
//!
//! Only plain data is written (lists, dicts, tuples, text, numbers, booleans, `None`), in
//! protocol 2 opcodes, without a memo: every Python since 2.3 reads it, and nothing in it names
//! a class. Containers are built as Python's own pickler builds them: the empty container, a
//! mark, the items, then one opcode that adds them all.

/// Protocol 2's opcodes, as `pickletools` names them.
mod op {
    pub const PROTO: u8 = 0x80;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const EMPTY_LIST: u8 = b']';
    pub const APPENDS: u8 = b'e';
    pub const EMPTY_DICT: u8 = b'}';
    pub const SETITEMS: u8 = b'u';
    pub const TUPLE: u8 = b't';
    pub const BINUNICODE: u8 = b'X';
    pub const BININT: u8 = b'J';
    pub const LONG1: u8 = 0x8a;
    pub const BINFLOAT: u8 = b'G';
    pub const NONE: u8 = b'N';
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
}

/// Builds one pickle. Open containers must be closed in order (checked in debug builds);
/// `finish` adds the final `STOP`.
#[derive(Debug)]
pub struct Pickler {
    out: Vec<u8>,
    /// The containers open, innermost last: what closes each.
    open: Vec<u8>,
}

impl Default for Pickler {
    fn default() -> Self {
        Pickler::new()
    }
}

impl Pickler {
    pub fn new() -> Self {
        Pickler { out: vec![op::PROTO, 2], open: Vec::new() }
    }

    /// Starts a list; its items follow, then `end`.
    pub fn begin_list(&mut self) -> &mut Self {
        self.open(op::EMPTY_LIST, op::APPENDS)
    }

    /// Starts a dict; its keys and values follow, alternating, then `end`.
    pub fn begin_dict(&mut self) -> &mut Self {
        self.open(op::EMPTY_DICT, op::SETITEMS)
    }

    /// Starts a tuple; its items follow, then `end`.
    pub fn begin_tuple(&mut self) -> &mut Self {
        self.out.push(op::MARK);
        self.open.push(op::TUPLE);
        self
    }

    fn open(&mut self, empty: u8, close: u8) -> &mut Self {
        self.out.extend_from_slice(&[empty, op::MARK]);
        self.open.push(close);
        self
    }

    /// Closes the innermost open container.
    pub fn end(&mut self) -> &mut Self {
        let close = self.open.pop().expect("a container is open");
        self.out.push(close);
        self
    }

    pub fn str(&mut self, s: &str) -> &mut Self {
        let len = u32::try_from(s.len()).expect("a pickled string is under 4 GiB");
        self.out.push(op::BINUNICODE);
        self.out.extend_from_slice(&len.to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
        self
    }

    pub fn int(&mut self, v: i64) -> &mut Self {
        match i32::try_from(v) {
            Ok(small) => {
                self.out.push(op::BININT);
                self.out.extend_from_slice(&small.to_le_bytes());
            }
            Err(_) => {
                // Little-endian two's complement, as short as keeps the sign.
                let bytes = v.to_le_bytes();
                let mut n = 8;
                while n > 1 {
                    let (top, next) = (bytes[n - 1], bytes[n - 2]);
                    if (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0) {
                        n -= 1;
                    } else {
                        break;
                    }
                }
                self.out.extend_from_slice(&[op::LONG1, n as u8]);
                self.out.extend_from_slice(&bytes[..n]);
            }
        }
        self
    }

    pub fn float(&mut self, v: f64) -> &mut Self {
        self.out.push(op::BINFLOAT);
        self.out.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn none(&mut self) -> &mut Self {
        self.out.push(op::NONE);
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.out.push(if v { op::NEWTRUE } else { op::NEWFALSE });
        self
    }

    /// A float, or `None` for a gap.
    pub fn opt_float(&mut self, v: Option<f64>) -> &mut Self {
        match v {
            Some(v) => self.float(v),
            None => self.none(),
        }
    }

    /// The pickle's bytes.
    pub fn finish(mut self) -> Vec<u8> {
        assert!(self.open.is_empty(), "{} containers left open", self.open.len());
        self.out.push(op::STOP);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_value_is_written_opcode_by_opcode() {
        // [{'a': (1, None)}, -2.5, True]
        let mut p = Pickler::new();
        p.begin_list().begin_dict().str("a").begin_tuple().int(1).none().end().end().float(-2.5).bool(true).end();
        let want: Vec<u8> = [
            &b"\x80\x02](}("[..],
            b"X\x01\x00\x00\x00a",
            b"(J\x01\x00\x00\x00Nt",
            b"u",
            b"G\xc0\x04\x00\x00\x00\x00\x00\x00",
            b"\x88e.",
        ]
        .concat();
        assert_eq!(p.finish(), want);
    }

    #[test]
    fn large_integers_take_the_fewest_bytes_that_keep_their_sign() {
        let long = |v: i64| {
            let mut p = Pickler::new();
            p.int(v);
            p.finish()[2..].to_vec()
        };
        assert_eq!(long(1 << 31), b"\x8a\x05\x00\x00\x00\x80\x00.");
        assert_eq!(long(-(1 << 31) - 1), b"\x8a\x05\xff\xff\xff\x7f\xff.");
        assert_eq!(long(i64::MIN), b"\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80.");
        assert_eq!(long(-1), b"J\xff\xff\xff\xff.");
    }

    /// Python's own unpickler reads what is written (skipped where there is no `python3`; CI
    /// installs it with graphite-web).
    #[test]
    fn python_reads_it_back() {
        let mut p = Pickler::new();
        p.begin_list();
        for i in 0..3000 {
            p.begin_dict().str("path").str(&format!("a.b{i}")).str("is_leaf").bool(i % 2 == 0).end();
        }
        p.begin_tuple().int(1_700_000_000_000).int(-7).float(0.1).none().str("é✓").end();
        p.end();
        let bytes = p.finish();
        let script = "import pickle, sys\nv = pickle.load(sys.stdin.buffer)\n\
                      assert len(v) == 3001 and v[2999] == {'path': 'a.b2999', 'is_leaf': False}, v[2999]\n\
                      assert v[-1] == (1700000000000, -7, 0.1, None, 'é✓'), v[-1]\nprint('ok')";
        let child = std::process::Command::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("no python3: skipped");
            return;
        };
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), &bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    }
}
