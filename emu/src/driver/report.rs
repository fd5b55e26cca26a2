//! Per-launch metrics: in-process totals (for tests) and, with
//! `DEVTENSOR_EMU_REPORT=<file>`, one JSON line per launch appended to the file
//! (counters named as Nsight Compute names them; faults and sanitizer
//! findings are reported there too, with their message).

use std::io::Write;
use std::sync::Mutex;

use super::lock;
use crate::ptx::LaunchStats;

/// Sums over every launch of the process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    pub launches: u64,
    pub failed_launches: u64,
    pub warp_instructions: u64,
    pub lane_instructions: u64,
    pub global_load_requests: u64,
    pub global_store_requests: u64,
    pub global_load_sectors: u64,
    pub global_store_sectors: u64,
    pub global_load_bytes: u64,
    pub global_store_bytes: u64,
    pub shared_requests: u64,
    pub shared_bank_conflicts: u64,
}

static TOTALS: Mutex<Totals> = Mutex::new(Totals {
    launches: 0,
    failed_launches: 0,
    warp_instructions: 0,
    lane_instructions: 0,
    global_load_requests: 0,
    global_store_requests: 0,
    global_load_sectors: 0,
    global_store_sectors: 0,
    global_load_bytes: 0,
    global_store_bytes: 0,
    shared_requests: 0,
    shared_bank_conflicts: 0,
});
static FILE: Mutex<()> = Mutex::new(());

/// The totals so far.
pub fn totals() -> Totals {
    lock(&TOTALS).clone()
}

/// What identifies a launch in the report.
pub struct LaunchInfo<'a> {
    pub kernel: &'a str,
    pub device: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub stream: &'a str,
    pub regs: u32,
    pub shared_bytes: u32,
}

/// JSON string literal.
fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn efficiency(bytes: u64, sectors: u64) -> f64 {
    if sectors == 0 {
        1.0
    } else {
        bytes as f64 / (sectors as f64 * 32.0)
    }
}

fn head(l: &LaunchInfo<'_>) -> String {
    format!(
        "\"kernel\":{},\"device\":{},\"grid\":[{},{},{}],\"block\":[{},{},{}],\"stream\":{},\"registers\":{},\"static_shared_bytes\":{}",
        json_str(l.kernel),
        l.device,
        l.grid[0],
        l.grid[1],
        l.grid[2],
        l.block[0],
        l.block[1],
        l.block[2],
        json_str(l.stream),
        l.regs,
        l.shared_bytes
    )
}

fn append(line: &str) {
    let Some(path) = &crate::config::get().report else {
        return;
    };
    let _g = lock(&FILE);
    let r = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = r {
        eprintln!(
            "devtensor-emu: cannot append to DEVTENSOR_EMU_REPORT={}: {e}",
            path.display()
        );
    }
}

/// The JSON line of a successful launch.
pub fn launch_line(l: &LaunchInfo<'_>, s: &LaunchStats) -> String {
    format!(
        "{{{},\"warp_instructions\":{},\"lane_instructions\":{},\"global_load_requests\":{},\"global_store_requests\":{},\
         \"global_load_sectors\":{},\"global_store_sectors\":{},\"global_load_bytes\":{},\"global_store_bytes\":{},\
         \"sector_efficiency_load\":{:.4},\"sector_efficiency_store\":{:.4},\"shared_requests\":{},\"shared_bank_conflicts\":{}}}",
        head(l),
        s.warp_instructions,
        s.lane_instructions,
        s.global_load_requests,
        s.global_store_requests,
        s.global_load_sectors,
        s.global_store_sectors,
        s.global_load_bytes,
        s.global_store_bytes,
        efficiency(s.global_load_bytes, s.global_load_sectors),
        efficiency(s.global_store_bytes, s.global_store_sectors),
        s.shared_requests,
        s.shared_bank_conflicts,
    )
}

/// Records a completed launch.
pub fn record(l: &LaunchInfo<'_>, s: &LaunchStats) {
    {
        let mut t = lock(&TOTALS);
        t.launches += 1;
        t.warp_instructions += s.warp_instructions;
        t.lane_instructions += s.lane_instructions;
        t.global_load_requests += s.global_load_requests;
        t.global_store_requests += s.global_store_requests;
        t.global_load_sectors += s.global_load_sectors;
        t.global_store_sectors += s.global_store_sectors;
        t.global_load_bytes += s.global_load_bytes;
        t.global_store_bytes += s.global_store_bytes;
        t.shared_requests += s.shared_requests;
        t.shared_bank_conflicts += s.shared_bank_conflicts;
    }
    if crate::config::get().report.is_some() {
        append(&launch_line(l, s));
    }
}

/// Records a launch that faulted (or a sanitizer finding).
pub fn record_error(l: &LaunchInfo<'_>, code: u32, error: &str, message: &str) {
    lock(&TOTALS).failed_launches += 1;
    if crate::config::get().report.is_some() {
        append(&format!(
            "{{{},\"error\":{{\"code\":{code},\"name\":{},\"message\":{}}}}}",
            head(l),
            json_str(error),
            json_str(message)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
    }
}
