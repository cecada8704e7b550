//! `dns_sd_configs` end to end: `strata serve` looks names up through a real DNS server
//! (dnsmasq, from Debian's `dnsmasq-base`, on a loopback port given by
//! `STRATA_DNS_SD_NAMESERVER`): SRV, A, AAAA and MX records, a name that does not exist, records
//! that change, and a server that stops answering (the targets stay).

mod support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{free_port, http, sample_value, which, Server};

struct Dnsmasq(Child);

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// dnsmasq answering for `sd.test` alone (NXDOMAIN for other names there), from `records`.
fn dnsmasq(port: u16, records: &[&str]) -> Dnsmasq {
    let mut cmd = Command::new(which("dnsmasq"));
    cmd.args(["--keep-in-foreground", "--bind-interfaces", "--listen-address=127.0.0.1", "--no-resolv", "--no-hosts"])
        .args(["--local=/sd.test/", "--pid-file=", "--log-facility=-"])
        .arg(format!("--port={port}"))
        .args(records)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // As root dnsmasq drops to a `dnsmasq` user that the package may not have made.
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        cmd.arg("--user=root");
    }
    let child = cmd.spawn().unwrap();
    // Ready once it answers on its TCP port.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "dnsmasq did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Dnsmasq(child)
}

type LabelSet = BTreeMap<String, String>;

/// Each job's discovered targets (address and `__meta_dns_*` labels), sorted.
fn discovered(port: u16) -> BTreeMap<String, Vec<LabelSet>> {
    let (_, body) = http(port, "GET", "/api/v1/targets", &[], b"");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut out: BTreeMap<String, Vec<LabelSet>> = BTreeMap::new();
    for t in v["data"]["activeTargets"].as_array().into_iter().flatten() {
        let labels: LabelSet = t["discoveredLabels"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("__meta_dns") || *k == "__address__")
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        out.entry(t["scrapePool"].as_str().unwrap().to_owned()).or_default().push(labels);
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

fn addresses(d: &BTreeMap<String, Vec<LabelSet>>, job: &str) -> Vec<String> {
    d.get(job).into_iter().flatten().map(|l| l["__address__"].clone()).collect()
}

fn wait_until(what: &str, srv: &Server, mut cond: impl FnMut(&BTreeMap<String, Vec<LabelSet>>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let d = discovered(srv.port);
        if cond(&d) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {d:#?}\n{}", srv.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn errors_counted(port: u16) -> f64 {
    let (_, m) = http(port, "GET", "/metrics", &[], b"");
    sample_value(&m, "strata_sd_file_read_errors_total").unwrap_or(0.0)
}

#[test]
fn dns_records_become_targets_and_follow_changes() {
    let dns_port = free_port();
    let records = [
        "--srv-host=_metrics._tcp.sd.test,web1.sd.test,9100,0,10",
        "--srv-host=_metrics._tcp.sd.test,web2.sd.test,9101,0,20",
        "--host-record=web.sd.test,10.0.0.1",
        "--host-record=web.sd.test,10.0.0.2",
        "--host-record=web6.sd.test,fd00::2",
        "--mx-host=sd.test,mail.sd.test,10",
    ];
    let mut server = dnsmasq(dns_port, &records);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("dns.yml");
    let job =
        |name: &str, sd: &str| format!("  - job_name: {name}\n    dns_sd_configs:\n      - refresh_interval: 1s\n{sd}");
    let config = [
        "scrape_configs:\n".to_owned(),
        job("srv", "        names: [_metrics._tcp.sd.test]\n"),
        job("a", "        names: [web.sd.test, nope.sd.test]\n        type: A\n        port: 9100\n"),
        job("aaaa", "        names: [web6.sd.test]\n        type: AAAA\n        port: 9100\n"),
        job("mx", "        names: [sd.test]\n        type: MX\n        port: 25\n"),
    ]
    .concat();
    std::fs::write(&cfg, config).unwrap();
    // SAFETY: set before the server starts, in the only test of this binary.
    unsafe { std::env::set_var("STRATA_DNS_SD_NAMESERVER", format!("127.0.0.1:{dns_port}")) };
    let srv = Server::start(&tmp.path().join("strata"), &["--config", cfg.to_str().unwrap()]);

    wait_until("every job's records", &srv, |d| ["srv", "a", "aaaa", "mx"].iter().all(|j| d.contains_key(*j)));
    let d = discovered(srv.port);
    assert_eq!(addresses(&d, "srv"), ["web1.sd.test:9100", "web2.sd.test:9101"]);
    let web1 = &d["srv"][0];
    assert_eq!(web1["__meta_dns_name"], "_metrics._tcp.sd.test");
    assert_eq!(web1["__meta_dns_srv_record_target"], "web1.sd.test.");
    assert_eq!(web1["__meta_dns_srv_record_port"], "9100");
    assert_eq!(web1["__meta_dns_mx_record_target"], "");
    // A records with the configured port; the name that does not exist gives nothing.
    assert_eq!(addresses(&d, "a"), ["10.0.0.1:9100", "10.0.0.2:9100"]);
    assert_eq!(d["a"][0]["__meta_dns_name"], "web.sd.test");
    assert_eq!(d["a"][0]["__meta_dns_srv_record_target"], "");
    assert_eq!(addresses(&d, "aaaa"), ["[fd00::2]:9100"]);
    assert_eq!(addresses(&d, "mx"), ["mail.sd.test:25"]);
    assert_eq!(d["mx"][0]["__meta_dns_mx_record_target"], "mail.sd.test.");

    // The records change: a third SRV target, one A record gone.
    drop(server);
    server = dnsmasq(
        dns_port,
        &[
            "--srv-host=_metrics._tcp.sd.test,web1.sd.test,9100,0,10",
            "--srv-host=_metrics._tcp.sd.test,web2.sd.test,9101,0,20",
            "--srv-host=_metrics._tcp.sd.test,web3.sd.test,9102,0,30",
            "--host-record=web.sd.test,10.0.0.2",
            "--host-record=web6.sd.test,fd00::2",
            "--mx-host=sd.test,mail.sd.test,10",
        ],
    );
    wait_until("the changed records", &srv, |d| {
        addresses(d, "srv").len() == 3 && addresses(d, "a") == ["10.0.0.2:9100"]
    });

    // The server goes: lookups fail, are counted, and the targets stay.
    drop(server);
    let before = errors_counted(srv.port);
    let deadline = Instant::now() + Duration::from_secs(60);
    while errors_counted(srv.port) <= before {
        assert!(Instant::now() < deadline, "failed lookups were not counted\n{}", srv.log_text());
        std::thread::sleep(Duration::from_millis(250));
    }
    let d = discovered(srv.port);
    assert_eq!(addresses(&d, "srv").len(), 3, "{d:#?}");
    assert_eq!(addresses(&d, "a"), ["10.0.0.2:9100"]);
    assert!(srv.log_text().contains("dns_sd: lookup failed"), "{}", srv.log_text());
}
