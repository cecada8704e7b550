//! Carbon plaintext lines read alone (no storage, no network), run with
//! `cargo bench -p strata-graphite --bench carbon_parse_bench [-- LINES]` (default 1M lines
//! shaped as `carbon_compare` sends them: host-tree paths, values written as decimals, whole
//! integers and small counts, whole-second timestamps; and a tenth of the lines with exponent
//! values and fractional timestamps, which take the general reader). Prints the median
//! nanoseconds per line of several passes; compare ratios from one run (the machine is noisy).

use std::io::Write;
use std::time::Instant;

use strata_graphite::carbon::plaintext::{self, parse_fields};

fn lines(n: usize, general_every: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 60);
    for p in 0..n {
        let (host, metric) = (p / 100, p % 100);
        let t = 1_700_000_000 + (p % 3) as i64 - 1;
        let _ = match (general_every > 0 && p % general_every == 0, p % 3) {
            (true, _) => writeln!(out, "servers.dc{}.host-{host:05}.m{metric}.value {}e-3 {t}.5", p % 5, p % 1000),
            (false, 0) => {
                writeln!(out, "servers.dc{}.host-{host:05}.m{metric}.value {} {t}", p % 5, (p * 7 % 1000) as f64 / 10.0)
            }
            (false, 1) => writeln!(out, "servers.dc{}.host-{host:05}.m{metric}.value {} {t}", p % 5, p * 1000 + p % 17),
            _ => writeln!(out, "servers.dc{}.host-{host:05}.m{metric}.value {} {t}", p % 5, p % 100),
        };
    }
    out
}

fn median_ns_per_line(buf: &[u8], n: usize) -> f64 {
    let mut times = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        let mut sum = 0.0;
        for line in plaintext::lines(buf).filter(|l| !l.is_empty()) {
            let p = parse_fields(line, 0).expect("the bench's lines parse");
            sum += p.value + p.t_ms as f64 + p.path.len() as f64;
        }
        std::hint::black_box(sum);
        times.push(started.elapsed().as_nanos() as f64 / n as f64);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    for (shape, every) in [("as carbon_compare sends", 0), ("a tenth in general forms", 10)] {
        let buf = lines(n, every);
        println!("{shape:28} {:6.1} ns per line ({n} lines)", median_ns_per_line(&buf, n));
    }
}
