//! `devtensor bench`: the strided-copy pattern matrix on the best available
//! device (a CUDA GPU when one is usable, else the CPU), as GB/s (read +
//! write) and % of a same-size memcpy on that device.

use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::patterns::{self, Pattern};

/// Options of `devtensor bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Smaller sizes and shorter timing (a smoke run).
    #[arg(long)]
    pub quick: bool,
    /// One JSON object per pattern on stdout (for bench/cpu_copy_peers.py).
    #[arg(long)]
    pub json: bool,
    /// Only patterns whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// Force a device: "cpu", "cuda:N" or "rocm:N" (default: the best available).
    #[arg(long)]
    pub device: Option<String>,
    /// Print the patterns (JSON, one per line) without measuring.
    #[arg(long)]
    pub list: bool,
}

/// A pattern as one JSON object (what bench scripts rebuild with as_strided).
fn pattern_json(p: &Pattern, extra: &str) -> String {
    format!(
        "{{\"name\":\"{}\",\"elem_size\":{},\"shape\":{:?},\"src_strides\":{:?},\"src_offset\":{},\"src_alloc_elems\":{}{extra}}}",
        p.name, p.elem_size, p.shape, p.src_strides, p.src_offset, p.src_alloc_elems
    )
}

/// One measured row: the copy and the memcpy baseline, in GB/s.
struct Row {
    pattern: Pattern,
    gbps: f64,
    memcpy_gbps: f64,
}

fn progress(n: usize, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

pub fn run(args: &BenchArgs) -> devtensor::Result<()> {
    let mut matrix = if args.quick {
        patterns::quick_matrix()
    } else {
        patterns::cpu_matrix()
    };
    if let Some(f) = &args.filter {
        matrix.retain(|p| p.name.contains(f.as_str()));
    }
    let device = match &args.device {
        Some(d) => d.parse()?,
        None if devtensor::backend::cuda_status().is_available() => devtensor::Device::Cuda(0),
        None if devtensor::backend::rocm_status().is_available() => devtensor::Device::Rocm(0),
        None => devtensor::Device::Cpu,
    };
    if args.list {
        for p in &matrix {
            println!("{}", pattern_json(p, ""));
        }
        return Ok(());
    }
    if super::bench_emulated::is_emulated(device) {
        return run_emulated(device, &matrix);
    }
    let min_time = Duration::from_millis(if args.quick { 100 } else { 400 });
    let bar = progress(matrix.len(), args.json);
    let mut rows = Vec::new();
    for p in &matrix {
        bar.set_message(p.name.clone());
        let row = match device {
            devtensor::Device::Cpu => {
                let r = patterns::measure_pattern(p, min_time)?;
                Row {
                    pattern: p.clone(),
                    gbps: r.copy.gbps,
                    memcpy_gbps: r.memcpy.gbps,
                }
            }
            other => gpu::measure(p, other, args.quick)?,
        };
        if args.json {
            println!(
                "{}",
                pattern_json(
                    p,
                    &format!(",\"gbps\":{:.4},\"memcpy_gbps\":{:.4}", row.gbps, row.memcpy_gbps)
                )
            );
        }
        rows.push(row);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if !args.json {
        print_table(&device.to_string(), &rows);
    }
    Ok(())
}

/// On the emulated driver: one copy per pattern and its launch metrics, no timings.
#[cfg(feature = "cuda")]
fn run_emulated(device: devtensor::Device, matrix: &[Pattern]) -> devtensor::Result<()> {
    use super::bench_emulated::{metrics_of, report_path};
    let Some(path) = report_path() else {
        return Err(devtensor::Error::Config {
            var: "DEVTENSOR_EMU_REPORT",
            reason: "not set (run under ci/emu.sh)".into(),
        });
    };
    let devtensor::Device::Cuda(ordinal) = device else {
        return Err(devtensor::Error::UnsupportedDevice { op: "bench", device });
    };
    let stream = devtensor::backend::cuda::stream::CudaStream::default_stream(ordinal);
    println!(
        "strided copy on {device}: EMULATED driver (emu/): timings are meaningless there; these are the\n\
         emulator's per-launch metrics, as Nsight Compute counts them (sector efficiency = bytes the\n\
         lanes asked for / bytes of the 32-byte sectors moved; conflicts = extra shared wavefronts)"
    );
    println!(
        "{:<40} {:>8} {:>8} {:>10} {:>10}  kernels",
        "pattern", "ld eff", "st eff", "conflicts", "instr/elem"
    );
    for p in matrix {
        let (view, dst) = gpu::materialize(p, device)?;
        stream.synchronize()?;
        let m = metrics_of(&path, || {
            dst.copy_from(&view)?;
            stream.synchronize()
        })?;
        let mut kernels = m.kernels.clone();
        kernels.dedup();
        println!(
            "{:<40} {:>7.1}% {:>7.1}% {:>10} {:>10.1}  {}",
            p.name,
            100.0 * m.load_efficiency(),
            100.0 * m.store_efficiency(),
            m.bank_conflicts,
            m.lane_instructions as f64 / p.numel().max(1) as f64,
            if kernels.is_empty() {
                "(DMA: no kernel)".to_owned()
            } else {
                kernels.join(",")
            }
        );
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn run_emulated(device: devtensor::Device, _matrix: &[Pattern]) -> devtensor::Result<()> {
    Err(devtensor::Error::UnsupportedDevice { op: "bench", device })
}

fn print_table(device: &str, rows: &[Row]) {
    println!("strided copy on {device}: GB/s = (read + write) bytes / time; memcpy = same-size contiguous copy");
    println!(
        "{:<40} {:>10} {:>12} {:>9}",
        "pattern", "GB/s", "memcpy GB/s", "% memcpy"
    );
    for r in rows {
        let pct = 100.0 * r.gbps / r.memcpy_gbps;
        println!(
            "{:<40} {:>10.2} {:>12.2} {:>8.1}%",
            r.pattern.name, r.gbps, r.memcpy_gbps, pct
        );
    }
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
mod gpu {
    use devtensor::{DType, Device, Tensor};

    use super::{Pattern, Row};

    pub(super) fn dtype_of(elem: usize) -> devtensor::Result<DType> {
        Ok(match elem {
            1 => DType::U8,
            2 => DType::U16,
            4 => DType::U32,
            8 => DType::U64,
            16 => DType::C128,
            _ => {
                return Err(devtensor::Error::InvalidArgument {
                    op: "bench",
                    reason: "no dtype of this element size".into(),
                });
            }
        })
    }

    /// `fn $name(ordinal, quick, f)`: average seconds of `f` over enough
    /// iterations, timed with events on the default stream (where devtensor
    /// enqueues its blocking copies), for one runtime's stream and event types.
    macro_rules! event_timer {
        ($name:ident, $default_stream:path, $event:ty) => {
            fn $name(
                ordinal: u32,
                quick: bool,
                mut f: impl FnMut() -> devtensor::Result<()>,
            ) -> devtensor::Result<f64> {
                let stream = $default_stream(ordinal);
                f()?; // warm-up (and kernel compilation)
                stream.synchronize()?;
                let (start, end) = (<$event>::new(ordinal, true)?, <$event>::new(ordinal, true)?);
                let iters = if quick { 5 } else { 20 };
                start.record(&stream)?;
                for _ in 0..iters {
                    f()?;
                }
                end.record(&stream)?;
                end.synchronize()?;
                Ok(f64::from(start.elapsed_ms(&end)?) / 1e3 / f64::from(iters))
            }
        };
    }

    #[cfg(feature = "cuda")]
    event_timer!(
        time_cuda,
        devtensor::backend::cuda::stream::CudaStream::default_stream,
        devtensor::backend::cuda::stream::CudaEvent
    );
    #[cfg(feature = "rocm")]
    event_timer!(
        time_rocm,
        devtensor::backend::rocm::stream::RocmStream::default_stream,
        devtensor::backend::rocm::stream::RocmEvent
    );

    fn time(device: Device, quick: bool, f: impl FnMut() -> devtensor::Result<()>) -> devtensor::Result<f64> {
        match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => time_cuda(i, quick, f),
            #[cfg(feature = "rocm")]
            Device::Rocm(i) => time_rocm(i, quick, f),
            _ => {
                let _ = (quick, f);
                Err(devtensor::Error::UnsupportedDevice { op: "bench", device })
            }
        }
    }

    /// The pattern's source view on `device` and a destination for it. Element
    /// sizes without a dtype of their own (3, 12 bytes, ...) become an inner
    /// dim of bytes, which the planner coalesces as it would the wider element.
    pub(super) fn materialize(p: &Pattern, device: Device) -> devtensor::Result<(Tensor, Tensor)> {
        if let Ok(dtype) = dtype_of(p.elem_size) {
            let buf = Tensor::zeros(&[p.src_alloc_elems], dtype, device)?;
            let view = buf.as_strided(&p.shape, &p.src_strides, p.src_offset)?;
            return Ok((view, Tensor::empty(&p.shape, dtype, device)?));
        }
        let e = p.elem_size;
        let buf = Tensor::zeros(&[p.src_alloc_elems * e], DType::U8, device)?;
        let mut shape = p.shape.clone();
        shape.push(e);
        let mut strides: Vec<isize> = p.src_strides.iter().map(|&s| s * e as isize).collect();
        strides.push(1);
        let view = buf.as_strided(&shape, &strides, p.src_offset * e)?;
        Ok((view, Tensor::empty(&shape, DType::U8, device)?))
    }

    pub(super) fn measure(p: &Pattern, device: Device, quick: bool) -> devtensor::Result<Row> {
        let dtype = dtype_of(p.elem_size).unwrap_or(DType::U8);
        let (view, dst) = materialize(p, device)?;
        let secs = time(device, quick, || dst.copy_from(&view))?;
        let flat = p.numel() * p.elem_size / dtype.size();
        let flat_src = Tensor::zeros(&[flat], dtype, device)?;
        let flat_dst = Tensor::empty(&[flat], dtype, device)?;
        let base = time(device, quick, || flat_dst.copy_from(&flat_src))?;
        let bytes = p.bytes_moved() as f64;
        Ok(Row {
            pattern: p.clone(),
            gbps: bytes / secs / 1e9,
            memcpy_gbps: bytes / base / 1e9,
        })
    }
}

#[cfg(not(any(feature = "cuda", feature = "rocm")))]
mod gpu {
    use super::{Pattern, Row};

    pub(super) fn measure(_p: &Pattern, device: devtensor::Device, _quick: bool) -> devtensor::Result<Row> {
        Err(devtensor::Error::UnsupportedDevice { op: "bench", device })
    }
}
