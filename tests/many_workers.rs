//! The CPU copy engine with more workers than this machine may have cores
//! (`RAYON_NUM_THREADS=16`, as on a 16-core host): the copies small enough for
//! each worker's share to stay in its L2 run in static shares, the larger ones
//! balanced (`copy::cpu::parallel`, whose unit tests cover both schedules
//! whatever the host); every kind of copy must give the same elements either
//! way. With 0.5–3 MiB of L2 per CPU (most hosts) the 4 MiB copies below run
//! static and the 25 MiB ones balanced. Its own test binary: the variable
//! must be set before the copy pool exists.

use devtensor::{DType, Device, Tensor};

/// Checks that `got` (contiguous) holds `view`'s elements, where `view` is a
/// view of a tensor whose element k is k (u32).
fn check(what: &str, view: &Tensor, got: &Tensor) {
    assert!(got.is_contiguous(), "{what}: not contiguous");
    assert_eq!(got.shape(), view.shape(), "{what}: shape");
    let got = got.to_vec::<u32>().unwrap();
    let (shape, strides) = (view.shape(), view.strides());
    let base = (view.byte_offset() / 4) as isize;
    let inner = *shape.last().unwrap();
    let inner_stride = *strides.last().unwrap();
    let mut idx = vec![0usize; shape.len() - 1];
    for (r, row) in got.chunks(inner).enumerate() {
        let start = base + idx.iter().zip(strides).map(|(&i, &s)| i as isize * s).sum::<isize>();
        for (j, &v) in row.iter().enumerate() {
            let want = start + j as isize * inner_stride;
            assert_eq!(v as isize, want, "{what}: row {r}, element {j}");
        }
        for k in (0..idx.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

#[test]
fn copies_with_sixteen_workers_give_the_same_elements_in_static_and_balanced_shares() {
    // SAFETY: the only test of this binary, run before any thread of ours
    // exists; nothing else reads the environment meanwhile.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", "16") };
    // 1 and 4 MiB (static shares where a core's L2 holds 1 MiB or more), 25 MiB (balanced).
    for m in [512usize, 1024, 2560] {
        let data: Vec<u32> = (0..(m * m) as u32).collect();
        let s = Tensor::from_slice(&data, &[m, m]).unwrap();
        assert_eq!(s.dtype(), DType::U32);
        assert_eq!(s.device(), Device::Cpu);
        let c = s.slice(1, Some(5), Some(5 + 64), 1).unwrap();
        let row = s.select(0, 3).unwrap().unsqueeze(0).unwrap();
        let cube = s.view(&[(m / 16) as isize, 16, m as isize]).unwrap();
        let views = [
            ("clone", s.clone()),
            ("transpose", s.transpose(0, 1).unwrap()),
            ("flip rows", s.flip(&[0]).unwrap()),
            ("flip columns", s.flip(&[1]).unwrap()),
            ("flip both", s.flip(&[0, 1]).unwrap()),
            ("64 columns", c),
            ("every other column", s.slice(1, None, None, 2).unwrap()),
            ("rows of 100 bytes", s.slice(1, Some(1), Some(26), 1).unwrap()),
            ("broadcast row", row.expand(&[m as isize, m as isize]).unwrap()),
            ("permute 210", cube.permute(&[2, 1, 0]).unwrap()),
            ("permute 021", cube.permute(&[0, 2, 1]).unwrap()),
            ("permute 102", cube.permute(&[1, 0, 2]).unwrap()),
        ];
        for (what, v) in &views {
            let what = format!("{what} of {m}²");
            check(&what, v, &v.contiguous_copy().unwrap());
            // Into an existing (strided) destination too: the transpose of a fresh tensor.
            let shape: Vec<usize> = v.shape().to_vec();
            if shape.len() == 2 {
                let dst = Tensor::zeros(&[shape[1], shape[0]], DType::U32, Device::Cpu).unwrap();
                let dst_t = dst.transpose(0, 1).unwrap();
                dst_t.copy_from(v).unwrap();
                check(
                    &format!("{what} into a transposed destination"),
                    v,
                    &dst_t.contiguous_copy().unwrap(),
                );
            }
        }
    }
}
