//! A real disk running full under a real server: the data directory sits on a small tmpfs,
//! a filler file takes the last byte, and then:
//! - remote write answers 5xx (so that senders retry) and names the cause;
//! - queries keep working;
//! - once space returns, ingestion resumes by itself, without a restart;
//! - after a SIGKILL nothing is missing, not even the samples of the refused request (the head
//!   had applied them, and the log wrote them ahead of the next commit).
//!
//! Mounting needs root (CI runs as root); elsewhere the test says so and does nothing.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{http, now_ms, remote_write_body, Server};

struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Option<Mount> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount(dir.to_owned()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system holding `path` to its last byte.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0xa5u8; 64 << 10];
    let mut total = 0;
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc_enospc()), "filling {}: {e}", path.display());
                break;
            }
        }
    }
    total
}

fn libc_enospc() -> i32 {
    28
}

/// Writes `SERIES` series named `name`, one sample each: tens of KiB in the log, more than the
/// free part of the page or block the log's last write ended in (a write that fits there
/// needs no new space, on a real disk as on tmpfs).
fn write(port: u16, name: &str, t: i64, v: f64) -> (u16, String) {
    let series: Vec<support::TestSeries> = (0..SERIES)
        .map(|i| (vec![("__name__", name.to_owned()), ("series", format!("{i:06}"))], vec![(t, v)]))
        .collect();
    http(port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &remote_write_body(&series))
}

const SERIES: usize = 2000;

/// `sum(name)` at `t`.
fn value(port: u16, name: &str, t: i64) -> Option<String> {
    let q = format!("/api/v1/query?query=sum({name})&time={}", t / 1000);
    let (status, body) = http(port, "GET", &q, &[], b"");
    assert_eq!(status, 200, "query {name}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"][0]["value"][1].as_str().map(str::to_owned)
}

#[test]
fn a_full_disk_refuses_writes_with_5xx_keeps_serving_queries_and_recovers_by_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(_mount) = Mount::tmpfs(tmp.path(), "24m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let data = tmp.path().join("data");
    let mut srv = Server::start(&data, &["--wal-fsync", "always"]);
    let t = now_ms() / 1000 * 1000;

    let (status, body) = write(srv.port, "before_full", t, 1.0);
    assert_eq!(status, 204, "{body}");

    let filler = tmp.path().join("filler");
    let filled = fill(&filler);
    assert!(filled > 0);
    let (status, body) = write(srv.port, "while_full", t, 2.0);
    assert!(status >= 500, "a write the disk cannot take must fail with 5xx so that senders retry: {status} {body}");
    assert!(body.contains("No space left") || body.contains("space"), "the error names the cause: {body}");
    let (status, body) = write(srv.port, "while_full_again", t, 3.0);
    assert!(status >= 500, "{status} {body}");

    assert_eq!(value(srv.port, "before_full", t), Some(format!("{SERIES}")), "queries keep working on a full disk");
    let (status, _) = http(srv.port, "GET", "/-/healthy", &[], b"");
    assert_eq!(status, 200);

    std::fs::remove_file(&filler).unwrap();
    let (status, body) = write(srv.port, "after_space_returned", t, 4.0);
    assert_eq!(status, 204, "ingestion resumes by itself once space returns: {body}");

    srv.kill();
    let srv = Server::start(&data, &["--wal-fsync", "always"]);
    assert_eq!(value(srv.port, "before_full", t), Some(format!("{SERIES}")));
    assert_eq!(value(srv.port, "after_space_returned", t), Some(format!("{}", 4 * SERIES)));
    // The refused requests' samples were in memory (and answered queries) before the restart;
    // the log wrote them ahead of the next commit, so the restart keeps them too.
    assert_eq!(value(srv.port, "while_full", t), Some(format!("{}", 2 * SERIES)));
    assert_eq!(value(srv.port, "while_full_again", t), Some(format!("{}", 3 * SERIES)));
}
