//! The `process_*` metrics Prometheus' client libraries export (the Go client's process
//! collector, what dashboards and alerts on any Prometheus-style server expect): CPU time,
//! memory, file descriptors and start time, read from `/proc/self` on Linux. Elsewhere, or when
//! a file cannot be read, the families it would give are left out rather than reported as 0.

/// What `/proc/self` says about this process.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_memory_bytes: Option<f64>,
    pub virtual_memory_bytes: Option<f64>,
    pub virtual_memory_max_bytes: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
}

/// The fields of `/proc/self/stat` this reads, in clock ticks and pages where the kernel
/// counts so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    utime_ticks: u64,
    stime_ticks: u64,
    start_ticks: u64,
    vsize_bytes: u64,
    rss_pages: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may hold spaces
/// and parentheses itself, so fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name, the first field is field 3 (state): field n is at n - 3.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// The boot time in seconds since the epoch, from `/proc/stat`'s `btime` line.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

/// A resource limit's soft value; `None` when unlimited or unknown.
#[cfg(target_os = "linux")]
fn soft_limit(resource: libc::__rlimit_resource_t) -> Option<f64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we pass and keeps no pointer.
    let rc = unsafe { libc::getrlimit(resource, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur as f64)
}

#[cfg(target_os = "linux")]
pub fn read() -> ProcessStats {
    // SAFETY: sysconf reads a configuration value and touches no memory of ours.
    let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    let stat = std::fs::read_to_string("/proc/self/stat").ok().as_deref().and_then(parse_stat);
    let boot = std::fs::read_to_string("/proc/stat").ok().as_deref().and_then(parse_boot_time);
    let per_tick = (ticks > 0).then(|| 1.0 / ticks as f64);
    ProcessStats {
        cpu_seconds: stat.zip(per_tick).map(|(s, t)| (s.utime_ticks + s.stime_ticks) as f64 * t),
        resident_memory_bytes: stat.filter(|_| page > 0).map(|s| s.rss_pages as f64 * page as f64),
        virtual_memory_bytes: stat.map(|s| s.vsize_bytes as f64),
        virtual_memory_max_bytes: soft_limit(libc::RLIMIT_AS),
        start_time_seconds: stat.zip(per_tick).zip(boot).map(|((s, t), b)| b as f64 + s.start_ticks as f64 * t),
        open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as f64),
        max_fds: soft_limit(libc::RLIMIT_NOFILE),
    }
}

#[cfg(not(target_os = "linux"))]
pub fn read() -> ProcessStats {
    ProcessStats::default()
}

impl ProcessStats {
    /// The families known, as `(name, help, type, value)`, in the order Prometheus' clients
    /// export them.
    pub fn families(&self) -> Vec<(&'static str, &'static str, &'static str, f64)> {
        [
            (
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                "counter",
                self.cpu_seconds,
            ),
            ("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge", self.resident_memory_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge", self.virtual_memory_bytes),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                "gauge",
                self.virtual_memory_max_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                "gauge",
                self.start_time_seconds,
            ),
            ("process_open_fds", "Number of open file descriptors.", "gauge", self.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors.", "gauge", self.max_fds),
        ]
        .into_iter()
        .filter_map(|(name, help, kind, value)| Some((name, help, kind, value?)))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis of its own.
        let line = "4242 (strata (x) y) S 1 4242 4242 0 -1 4194560 1200 0 0 0 150 25 0 0 20 0 9 0 \
                    987654 2147483648 30000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                utime_ticks: 150,
                stime_ticks: 25,
                start_ticks: 987_654,
                vsize_bytes: 2_147_483_648,
                rss_pages: 30_000
            })
        );
        assert_eq!(parse_stat("4242 (cut short) S 1 2"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
        assert_eq!(parse_boot_time("cpu  1 2 3\nbtime 1764000000\nprocesses 9\n"), Some(1_764_000_000));
        assert_eq!(parse_boot_time("cpu  1 2 3\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_read_from_proc() {
        let s = read();
        assert!(s.resident_memory_bytes.is_some_and(|b| b > 1e6), "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 3.0), "{s:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        // Started before now, and not before the test run began (a generous hour).
        assert!(s.start_time_seconds.is_some_and(|t| t <= now + 1.0 && t > now - 3600.0), "{s:?}");
        let names: Vec<&str> = s.families().iter().map(|f| f.0).collect();
        assert!(names.contains(&"process_cpu_seconds_total") && names.contains(&"process_open_fds"), "{names:?}");
    }
}
