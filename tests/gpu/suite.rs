//! The GPU test suite, written once and instantiated per backend by
//! `gpu_suite!` (tests/gpu_cuda.rs, and the ROCm twin). Every test skips
//! visibly without a device and fails instead under `DEVTENSOR_REQUIRE_GPU=1`.

/// Instantiates the suite for one backend.
///
/// `$status`: the backend's probe; `$dev(i)`: device memory of GPU i;
/// `$host`: its pinned host memory; `$managed(i)`: managed memory, if any;
/// `$stream`: its stream type (with `new(ordinal)` and `synchronize()`);
/// `$default_stream(i)`: the stream blocking calls (fills, copies) run on;
/// `$handoff`: its DLPack handoff;
/// `$synchronize_streams`: its wait for a storage's recorded streams;
/// `$current`: the ordinal current on the calling thread.
#[macro_export]
macro_rules! gpu_suite {
    (
        status: $status:expr,
        dev: $dev:expr,
        host: $host:expr,
        managed: $managed:expr,
        stream: $stream:ty,
        default_stream: $default_stream:path,
        handoff: $handoff:path,
        synchronize_streams: $synchronize_streams:path,
        current_device: $current:path $(,)?
    ) => {
        use devtensor::{DType, Device, Tensor};

        fn ready(test: &str) -> bool {
            common::gpu_or_skip(test, $status)
        }

        fn dev(i: u32) -> Device {
            ($dev)(i)
        }

        fn arange_u32(n: usize) -> Tensor {
            Tensor::from_slice(&(0..n as u32).collect::<Vec<_>>(), &[n]).unwrap()
        }

        /// Asserts that GPU view `g` copies to the bytes of its host twin
        /// (`want`): contiguously, and into every other element of the second
        /// innermost dim of a destination twice as wide (the others untouched).
        fn assert_copies_as_on_the_host(g: &Tensor, want: &[u8], what: &str) {
            assert_eq!(g.contiguous().unwrap().to_vec::<u8>().unwrap(), want, "{what}");
            let mut wide_shape = g.shape().to_vec();
            let d = wide_shape.len() - 2;
            wide_shape[d] *= 2;
            let wide = Tensor::zeros(&wide_shape, DType::U8, dev(0)).unwrap();
            let every_other = wide.slice(d as isize, None, None, 2).unwrap();
            every_other.copy_from(g).unwrap();
            assert_eq!(every_other.to_vec::<u8>().unwrap(), want, "{what}, strided");
            let skipped = wide.slice(d as isize, Some(1), None, 2).unwrap();
            assert!(
                skipped.to_vec::<u8>().unwrap().iter().all(|&b| b == 0),
                "{what}: untouched"
            );
        }

        #[test]
        fn allocates_every_memory_kind() {
            if !ready("allocates_every_memory_kind") {
                return;
            }
            let managed: Option<Device> = ($managed)(0);
            for d in [Some(dev(0)), Some($host), managed].into_iter().flatten() {
                let t = Tensor::zeros(&[3, 1000], DType::F32, d).unwrap();
                assert_eq!(t.device(), d);
                assert_eq!(t.nbytes(), 12_000);
                assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0; 3000]);
                t.fill(2.5f32).unwrap();
                assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.5; 3000]);
                let dl = t.to_dlpack_versioned(Default::default()).into_raw();
                // SAFETY: a live export read, then freed once.
                unsafe {
                    assert_eq!((*dl).dl_tensor.device, d.to_dlpack());
                    ((*dl).deleter.unwrap())(dl);
                }
            }
        }

        #[test]
        fn calls_leave_the_callers_device_current() {
            if !ready("calls_leave_the_callers_device_current") {
                return;
            }
            // A fresh thread: what is current there is only what we leave behind.
            // torch and CuPy read their current device from it, so allocating,
            // filling, copying and syncing on the last GPU must not change it.
            let last = ($status).devices.len() as u32 - 1;
            std::thread::spawn(move || {
                let before = $current().unwrap();
                let t = Tensor::zeros(&[1000], DType::F32, dev(last)).unwrap();
                t.fill(1.0f32).unwrap();
                let s = <$stream>::new(last).unwrap();
                let u = Tensor::zeros(&[1000], DType::F32, dev(last)).unwrap();
                // The fills ran on the default stream: order them before `s` reads.
                $handoff(&$default_stream(last), &s).unwrap();
                copy_on(&s, &u, &t);
                s.synchronize().unwrap();
                drop((s, t));
                assert_eq!(u.to_vec::<f32>().unwrap(), vec![1.0; 1000]);
                assert_eq!($current().unwrap(), before, "the current device moved");
            })
            .join()
            .unwrap();
        }

        #[test]
        fn copies_match_the_cpu_engine_on_random_layouts() {
            if !ready("copies_match_the_cpu_engine_on_random_layouts") {
                return;
            }
            let mut rng = common::Rng(0x5eed);
            for case in 0..200 {
                let ndim = 1 + rng.below(4) as usize;
                let shape: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(40) as usize).collect();
                let n: usize = shape.iter().product();
                let base = arange_u32(n + 7)
                    .slice(0, Some(rng.below(7) as isize), None, 1)
                    .unwrap();
                let base = base
                    .slice(0, None, Some(n as isize), 1)
                    .unwrap()
                    .reshape(&shape.iter().map(|&d| d as isize).collect::<Vec<_>>())
                    .unwrap();
                // A random permutation, flip and step of the CPU source.
                let mut perm: Vec<isize> = (0..ndim as isize).collect();
                for i in (1..ndim).rev() {
                    perm.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let mut view = base.permute(&perm).unwrap();
                if rng.below(2) == 0 {
                    view = view.flip(&[rng.below(ndim as u64) as isize]).unwrap();
                }
                let d0 = rng.below(ndim as u64) as isize;
                view = view.slice(d0, None, None, 1 + rng.below(2) as isize).unwrap();
                let expected = view.to_vec::<u32>().unwrap();
                // H2D from a strided host view, D2D permutes, D2H into a strided host view.
                let g = view.to(dev(0)).unwrap();
                assert_eq!(g.to_vec::<u32>().unwrap(), expected, "case {case}: h2d");
                let gt = g.flip(&[0]).unwrap().contiguous().unwrap();
                assert_eq!(
                    gt.flip(&[0]).unwrap().to_vec::<u32>().unwrap(),
                    expected,
                    "case {case}: d2d"
                );
                let host = Tensor::zeros(view.shape(), DType::U32, Device::Cpu).unwrap();
                let host_t = host.flip(&[0]).unwrap();
                host_t.copy_from(&g.flip(&[0]).unwrap()).unwrap();
                assert_eq!(host.to_vec::<u32>().unwrap(), expected, "case {case}: d2h");
            }
        }

        #[test]
        fn transposes_of_every_element_size() {
            if !ready("transposes_of_every_element_size") {
                return;
            }
            // [m, n, e] bytes permuted (1, 0, 2): the planner widens the inner e
            // bytes into one element, so each element size gets its tiled kernel.
            for e in [1usize, 2, 4, 8, 16] {
                for (m, n) in [(1usize, 1usize), (33, 65), (512, 300), (17, 4096)] {
                    let bytes: Vec<u8> = (0..m * n * e).map(|i| (i * 31 % 251) as u8).collect();
                    let src = Tensor::from_slice(&bytes, &[m, n, e]).unwrap();
                    let want = src.permute(&[1, 0, 2]).unwrap().to_vec::<u8>().unwrap();
                    let g = src
                        .to(dev(0))
                        .unwrap()
                        .permute(&[1, 0, 2])
                        .unwrap()
                        .contiguous()
                        .unwrap();
                    assert_eq!(g.to_vec::<u8>().unwrap(), want, "e={e} {m}x{n}");
                }
            }
        }

        #[test]
        fn transposes_of_strided_views_of_every_element_size() {
            if !ready("transposes_of_strided_views_of_every_element_size") {
                return;
            }
            // Views read along a stride of 2 or 3 (-3) elements, which the
            // tiled kernel pairs with the destination's rows: x[:, ::2].T,
            // x[::-1, ::3].T, batched; each also into every other column of a
            // wider destination. Inner dims of e bytes, widened to one element.
            for e in [1usize, 2, 4, 8] {
                for (m, n) in [(33usize, 65usize), (64, 48), (17, 300)] {
                    let bytes: Vec<u8> = (0..2 * m * 3 * n * e).map(|i| (i * 31 % 251) as u8).collect();
                    let host = Tensor::from_slice(&bytes, &[2, m, 3 * n, e]).unwrap();
                    let gpu = host.to(dev(0)).unwrap();
                    let views = |t: &Tensor| -> Vec<(&'static str, Tensor)> {
                        let x = t.select(0, 0).unwrap();
                        vec![
                            (
                                "x[:, ::2].T",
                                x.slice(1, None, None, 2).unwrap().permute(&[1, 0, 2]).unwrap(),
                            ),
                            (
                                "x[::-1, ::3].T",
                                x.flip(&[0])
                                    .unwrap()
                                    .slice(1, None, None, 3)
                                    .unwrap()
                                    .permute(&[1, 0, 2])
                                    .unwrap(),
                            ),
                            (
                                "batched x[:, :, ::2].mT",
                                t.slice(2, None, None, 2).unwrap().permute(&[0, 2, 1, 3]).unwrap(),
                            ),
                        ]
                    };
                    for ((what, h), (_, g)) in views(&host).into_iter().zip(views(&gpu)) {
                        let want = h.to_vec::<u8>().unwrap();
                        assert_copies_as_on_the_host(&g, &want, &format!("e={e} {m}x{n}: {what}"));
                    }
                }
            }
        }

        #[test]
        fn transposes_of_pixels_of_every_channel_size() {
            if !ready("transposes_of_pixels_of_every_channel_size") {
                return;
            }
            // Images of three channels of e bytes (widened to one element),
            // rows and columns swapped: whole, batched, cropped (by a pixel:
            // bases off whole u32s; by 4 and 8: on them), and into every other
            // row of a wider destination (the rows untouched between). Sides
            // a multiple of 4 pixels take the packed byte kernel; sides under
            // a tile's edge (17) the element kernels.
            for e in [1usize, 2, 4, 8] {
                for (b, h, w) in [
                    (1usize, 33usize, 65usize),
                    (2, 64, 48),
                    (1, 36, 100),
                    (1, 17, 300),
                    (3, 40, 1),
                ] {
                    let bytes: Vec<u8> = (0..b * h * w * 3 * e).map(|i| (i * 37 % 251) as u8).collect();
                    let host = Tensor::from_slice(&bytes, &[b, h, w, 3, e]).unwrap();
                    let gpu = host.to(dev(0)).unwrap();
                    let views = |t: &Tensor| -> Vec<(&'static str, Tensor)> {
                        let crop = |r: isize, c: isize| {
                            let v = t
                                .slice(1, Some(r), None, 1)
                                .unwrap()
                                .slice(2, Some(c), None, 1)
                                .unwrap();
                            v.permute(&[0, 2, 1, 3, 4]).unwrap()
                        };
                        vec![
                            ("x.transpose(1, 2)", t.permute(&[0, 2, 1, 3, 4]).unwrap()),
                            ("x[:, 1:, 1:].transpose(1, 2)", crop(1, 1)),
                            ("x[:, 4:, 8:].transpose(1, 2)", crop(4, 8)),
                        ]
                    };
                    for ((what, hv), (_, g)) in views(&host).into_iter().zip(views(&gpu)) {
                        let what = format!("e={e} {b}x{h}x{w}: {what}");
                        let want = hv.to_vec::<u8>().unwrap();
                        assert_eq!(g.contiguous().unwrap().to_vec::<u8>().unwrap(), want, "{what}");
                        let mut wide_shape = g.shape().to_vec();
                        wide_shape[1] *= 2;
                        let wide = Tensor::zeros(&wide_shape, DType::U8, dev(0)).unwrap();
                        let every_other = wide.slice(1, None, None, 2).unwrap();
                        every_other.copy_from(&g).unwrap();
                        assert_eq!(
                            every_other.to_vec::<u8>().unwrap(),
                            want,
                            "{what}, every other row"
                        );
                        let skipped = wide.slice(1, Some(1), None, 2).unwrap();
                        assert!(
                            skipped.to_vec::<u8>().unwrap().iter().all(|&x| x == 0),
                            "{what}: untouched"
                        );
                    }
                }
            }
        }

        #[test]
        fn permutes_with_a_short_dim_of_every_element_size() {
            if !ready("permutes_with_a_short_dim_of_every_element_size") {
                return;
            }
            // A dim shorter than a tile's edge beside a long one: NHWC <->
            // NCHW with 2, 3, 4 and 7 channels, a complex matrix split into
            // planes, a reversed 5-D shape; each also into a destination of
            // every other element. Inner dims of e bytes.
            for e in [1usize, 2, 4, 8] {
                let bytes: Vec<u8> = (0..3 * 37 * 41 * 7 * e).map(|i| (i * 29 % 253) as u8).collect();
                let host = Tensor::from_slice(&bytes, &[bytes.len()]).unwrap();
                let gpu = host.to(dev(0)).unwrap();
                let views = |t: &Tensor| -> Vec<(String, Tensor)> {
                    let take = |shape: &[isize]| {
                        let n: isize = shape.iter().product();
                        let mut shape = shape.to_vec();
                        shape.push(e as isize);
                        t.slice(0, None, Some(n * e as isize), 1)
                            .unwrap()
                            .reshape(&shape)
                            .unwrap()
                    };
                    let mut v = Vec::new();
                    for c in [2isize, 3, 4, 7] {
                        v.push((
                            format!("nhwc -> nchw, {c} channels"),
                            take(&[3, 37, 41, c]).permute(&[0, 3, 1, 2, 4]).unwrap(),
                        ));
                        v.push((
                            format!("nchw -> nhwc, {c} channels"),
                            take(&[3, c, 37, 41]).permute(&[0, 2, 3, 1, 4]).unwrap(),
                        ));
                    }
                    v.push((
                        "pairs to planes".into(),
                        take(&[1000, 2]).permute(&[1, 0, 2]).unwrap(),
                    ));
                    v.push((
                        "reversed 5-D".into(),
                        take(&[3, 5, 8, 4, 17]).permute(&[4, 3, 2, 1, 0, 5]).unwrap(),
                    ));
                    v
                };
                for ((what, h), (_, g)) in views(&host).into_iter().zip(views(&gpu)) {
                    let want = h.to_vec::<u8>().unwrap();
                    assert_copies_as_on_the_host(&g, &want, &format!("e={e}: {what}"));
                }
            }
        }

        #[test]
        fn transposes_whose_short_fast_dims_fold_a_batch_dim() {
            if !ready("transposes_whose_short_fast_dims_fold_a_batch_dim") {
                return;
            }
            // Fast dims at most half a tile's edge long (16 of a plain tile,
            // 18 to 64 of a packed one) whose tiles take runs of a batch
            // dim's consecutive indices: the source-fast side short, the
            // destination-fast side, both, a fold dim whose extent is no
            // whole number of runs (no fold there), a short dim not a power
            // of two (slots past its end idle), and a view one element off
            // (not whole u32s: the one-element kernel). Inner dims of e
            // bytes; each also into a destination of every other element.
            for e in [1usize, 2, 4, 8] {
                let bytes: Vec<u8> = (0..8 * 32 * 8 * 32 * e + e)
                    .map(|i| (i * 31 % 251) as u8)
                    .collect();
                let host = Tensor::from_slice(&bytes, &[bytes.len()]).unwrap();
                let gpu = host.to(dev(0)).unwrap();
                let views = |t: &Tensor| -> Vec<(String, Tensor)> {
                    let take = |skip: isize, shape: &[isize]| {
                        let n: isize = shape.iter().product();
                        let mut shape = shape.to_vec();
                        shape.push(e as isize);
                        t.slice(0, Some(skip * e as isize), Some((skip + n) * e as isize), 1)
                            .unwrap()
                            .reshape(&shape)
                            .unwrap()
                    };
                    let mut v = Vec::new();
                    for (what, skip, shape, perm) in [
                        (
                            "source-fast 16",
                            0,
                            vec![20isize, 6, 4, 16],
                            vec![3isize, 2, 1, 0],
                        ),
                        ("destination-fast 16", 0, vec![16, 6, 4, 20], vec![3, 2, 1, 0]),
                        ("both 16", 0, vec![16, 4, 6, 16], vec![3, 2, 1, 0]),
                        ("odd fold dim", 0, vec![20, 5, 16], vec![2, 1, 0]),
                        ("32 x 32 blocks", 0, vec![2, 4, 32, 4, 32], vec![0, 3, 1, 4, 2]),
                        ("24 x 20 blocks", 0, vec![2, 4, 24, 4, 20], vec![0, 3, 1, 4, 2]),
                        (
                            "32 x 32 blocks, one off",
                            1,
                            vec![2, 4, 32, 4, 32],
                            vec![0, 3, 1, 4, 2],
                        ),
                    ] {
                        let mut perm = perm;
                        perm.push(perm.len() as isize);
                        v.push((what.to_string(), take(skip, &shape).permute(&perm).unwrap()));
                    }
                    v
                };
                for ((what, h), (_, g)) in views(&host).into_iter().zip(views(&gpu)) {
                    let want = h.to_vec::<u8>().unwrap();
                    assert_copies_as_on_the_host(&g, &want, &format!("e={e}: {what}"));
                }
            }
        }

        #[test]
        fn vector_copies_of_every_element_size() {
            if !ready("vector_copies_of_every_element_size") {
                return;
            }
            // Layouts whose destination has unit-stride runs of whole 16-byte
            // vectors (copy_vec_eE): images of 3 and 4 channels between NCHW
            // and NHWC (a run of pixels' channels, the inner index wrapping
            // inside a vector), broadcast columns, flipped rows, a stepped
            // gather; each also into a destination one element past the
            // vector alignment (element by element there). Inner dims of e
            // bytes, which the planner widens to one element.
            for e in [1usize, 2, 4, 8] {
                let views = |src: &Tensor| -> Vec<(&'static str, Tensor)> {
                    // The first `n` elements of `e` bytes, shaped.
                    let take = |n: usize, shape: &[isize]| {
                        let t = src.slice(0, None, Some((n * e) as isize), 1).unwrap();
                        let mut shape = shape.to_vec();
                        shape.push(e as isize);
                        t.reshape(&shape).unwrap()
                    };
                    vec![
                        (
                            "nchw -> nhwc",
                            take(288, &[2, 3, 8, 6]).permute(&[0, 2, 3, 1, 4]).unwrap(),
                        ),
                        (
                            "nchw -> nhwc, 4 channels",
                            take(384, &[2, 4, 8, 6]).permute(&[0, 2, 3, 1, 4]).unwrap(),
                        ),
                        (
                            "nhwc -> nchw",
                            take(288, &[2, 8, 6, 3]).permute(&[0, 3, 1, 2, 4]).unwrap(),
                        ),
                        (
                            "broadcast column",
                            take(16, &[16, 1]).expand(&[16, 64, e as isize]).unwrap(),
                        ),
                        ("flipped rows", take(288, &[9, 32]).flip(&[1]).unwrap()),
                        (
                            "stepped gather",
                            take(384, &[384]).slice(0, None, Some(192), 3).unwrap(),
                        ),
                    ]
                };
                let bytes: Vec<u8> = (0..384 * e).map(|i| (i * 31 % 251) as u8).collect();
                let host = Tensor::from_slice(&bytes, &[384 * e]).unwrap();
                let gpu = host.to(dev(0)).unwrap();
                for ((what, h), (_, g)) in views(&host).into_iter().zip(views(&gpu)) {
                    let want = h.to_vec::<u8>().unwrap();
                    assert_eq!(
                        g.contiguous().unwrap().to_vec::<u8>().unwrap(),
                        want,
                        "e={e}: {what}"
                    );
                    // One element past an aligned start.
                    let n = want.len() / e;
                    let out = Tensor::zeros(&[n + 1, e], DType::U8, dev(0)).unwrap();
                    let out_view = out
                        .slice(0, Some(1), None, 1)
                        .unwrap()
                        .reshape(&g.shape().iter().map(|&d| d as isize).collect::<Vec<_>>())
                        .unwrap();
                    out_view.copy_from(&g).unwrap();
                    assert_eq!(
                        out_view.to_vec::<u8>().unwrap(),
                        want,
                        "e={e}: {what}, shifted by one"
                    );
                }
            }
        }

        #[test]
        // Its pinned-memory check reads the host pool's total, which another
        // test's 2 GiB of pinned rows would move.
        #[serial_test::serial(gpu_memory)]
        fn index_math_beyond_2_pow_31_elements() {
            if !ready("index_math_beyond_2_pow_31_elements") {
                return;
            }
            // A broadcast source read into 2^31 + 96 one-byte elements: the
            // 64-bit kernel path (or the planner's fill) must address all of them.
            let cols = (1usize << 30) + 48;
            let src = Tensor::from_slice(&[7u8, 9u8], &[2, 1])
                .unwrap()
                .to(dev(0))
                .unwrap();
            let dst = Tensor::empty(&[2, cols], DType::U8, dev(0)).unwrap();
            dst.copy_from(&src.expand(&[2, cols as isize]).unwrap()).unwrap();
            for (row, want) in [(0isize, 7u8), (1, 9)] {
                let tail = dst.select(0, row).unwrap().slice(0, Some(-5), None, 1).unwrap();
                assert_eq!(tail.to_vec::<u8>().unwrap(), vec![want; 5]);
            }
            // Transposed > 2^31-element view: flip the long dim.
            let flipped = dst.flip(&[1]).unwrap().slice(1, Some(0), Some(4), 1).unwrap();
            assert_eq!(flipped.to_vec::<u8>().unwrap(), vec![7, 7, 7, 7, 9, 9, 9, 9]);

            // A fill of 2^31 + 95 one-byte elements from an odd address (no wider
            // element fits it) runs on the device, one launch per 32-bit piece: no
            // host scalar expanded through a full-size pinned staging tensor.
            let pinned_before = devtensor::backend::memory_stats($host).unwrap().reserved;
            let flat = dst.reshape(&[-1]).unwrap();
            let odd = flat.slice(0, Some(1), None, 1).unwrap();
            assert!(odd.numel() > 1 << 31);
            odd.fill(5u8).unwrap();
            let pinned_after = devtensor::backend::memory_stats($host).unwrap().reserved;
            assert!(
                pinned_after <= pinned_before + (64 << 20),
                "a device fill staged through pinned memory: {pinned_before} -> {pinned_after} bytes"
            );
            let n = flat.numel() as isize;
            for (at, want) in [(0isize, 7u8), (1, 5), (2, 5), (n / 2, 5), (n - 1, 5)] {
                assert_eq!(
                    flat.slice(0, Some(at), Some(at + 1), 1)
                        .unwrap()
                        .to_vec::<u8>()
                        .unwrap(),
                    vec![want]
                );
            }
        }

        /// Enqueues `src → dst` on `stream` (`Tensor::copy_from_on_stream`).
        fn enqueue_copy(dst: &Tensor, src: &Tensor, stream: &$stream) -> devtensor::Result<()> {
            dst.copy_from_on_stream(src, stream.handle())
        }

        fn copy_on(stream: &$stream, dst: &Tensor, src: &Tensor) {
            enqueue_copy(dst, src, stream).unwrap();
        }

        #[test]
        fn stream_handoff_orders_a_slow_producer_before_the_consumer() {
            if !ready("stream_handoff_orders_a_slow_producer_before_the_consumer") {
                return;
            }
            let producer = <$stream>::new(0).unwrap();
            let consumer = <$stream>::new(0).unwrap();
            // 256 MiB of u32 on a GPU: each pass takes milliseconds. The emulated driver proves
            // the ordering with its happens-before race detector whatever the timing, so a
            // small tensor shows the same there.
            let n = if common::emulated($status) {
                1 << 16
            } else {
                1 << 26
            };
            let big = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
            let scratch = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
            let expected = arange_u32(n).to(dev(0)).unwrap();
            // The zero fills and the upload ran on the default stream.
            $handoff(&$default_stream(0), &producer).unwrap();
            // A deliberately slow producer: many large transposing passes, then the real write.
            for _ in 0..20 {
                copy_on(
                    &producer,
                    &scratch.reshape(&[256, -1]).unwrap(),
                    &big.reshape(&[-1, 256]).unwrap().transpose(0, 1).unwrap(),
                );
            }
            copy_on(&producer, &big, &expected);
            // The DLPack rule: event on the producer, wait on the consumer, no host block.
            $handoff(&producer, &consumer).unwrap();
            let out = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
            $handoff(&$default_stream(0), &consumer).unwrap(); // out's zero fill
            copy_on(&consumer, &out, &big);
            consumer.synchronize().unwrap();
            producer.synchronize().unwrap();
            let got = out
                .slice(0, Some(-1000), None, 1)
                .unwrap()
                .to_vec::<u32>()
                .unwrap();
            assert_eq!(got, ((n - 1000) as u32..n as u32).collect::<Vec<_>>());
        }

        #[test]
        fn copies_on_a_stream_refuse_other_devices() {
            if !ready("copies_on_a_stream_refuse_other_devices") {
                return;
            }
            let s = <$stream>::new(0).unwrap();
            let g = Tensor::zeros(&[4], DType::U32, dev(0)).unwrap();
            let h = Tensor::zeros(&[4], DType::U32, Device::Cpu).unwrap();
            assert!(matches!(
                enqueue_copy(&g, &h, &s),
                Err(devtensor::Error::DeviceMismatch { .. })
            ));
        }

        #[test]
        fn peer_copies_between_gpus() {
            if !ready("peer_copies_between_gpus") {
                return;
            }
            if $status.devices.len() < 2 {
                println!("SKIP peer_copies_between_gpus: one {} device", $status.backend);
                return;
            }
            let src = arange_u32(1 << 20).reshape(&[1024, 1024]).unwrap();
            let a = src.to(dev(0)).unwrap();
            let b = Tensor::zeros(&[1024, 1024], DType::U32, dev(1)).unwrap();
            b.copy_from(&a.transpose(0, 1).unwrap()).unwrap();
            assert_eq!(
                b.to_vec::<u32>().unwrap(),
                src.transpose(0, 1).unwrap().to_vec::<u32>().unwrap()
            );
        }

        #[test]
        fn fills_of_odd_offsets_and_negative_strides() {
            if !ready("fills_of_odd_offsets_and_negative_strides") {
                return;
            }
            let t = Tensor::zeros(&[101], DType::U16, dev(0)).unwrap();
            t.slice(0, Some(1), None, 3).unwrap().fill(5u16).unwrap();
            t.slice(0, None, None, -7).unwrap().fill(9u16).unwrap();
            let cpu = Tensor::zeros(&[101], DType::U16, Device::Cpu).unwrap();
            cpu.slice(0, Some(1), None, 3).unwrap().fill(5u16).unwrap();
            cpu.slice(0, None, None, -7).unwrap().fill(9u16).unwrap();
            assert_eq!(t.to_vec::<u16>().unwrap(), cpu.to_vec::<u16>().unwrap());
        }
        #[test]
        fn copies_between_overlapping_views_of_one_tensor_match_the_cpu_engine() {
            if !ready("copies_between_overlapping_views_of_one_tensor_match_the_cpu_engine") {
                return;
            }
            // In place: a reversal, a square transpose, shifts by one element both
            // ways (one DMA each, whose areas may not overlap), a copy onto itself;
            // then views whose rows interleave and whose elements do not (copied
            // without a temporary: the emulator checks that no kernel reads what
            // it writes and that no DMA's areas overlap); on the default stream
            // and on a stream of our own.
            let n = 4096;
            fn cols(t: &Tensor, rows: isize, start: isize, step: isize) -> Tensor {
                t.reshape(&[rows, -1])
                    .unwrap()
                    .slice(1, Some(start), None, step)
                    .unwrap()
            }
            let cases: [(&str, fn(&Tensor) -> (Tensor, Tensor)); 8] = [
                ("reverse", |t| (t.clone(), t.flip(&[0]).unwrap())),
                ("transpose", |t| {
                    let m = t.reshape(&[64, 64]).unwrap();
                    (m.clone(), m.transpose(0, 1).unwrap())
                }),
                ("shift right", |t| {
                    (
                        t.slice(0, Some(1), None, 1).unwrap(),
                        t.slice(0, None, Some(-1), 1).unwrap(),
                    )
                }),
                ("shift left", |t| {
                    (
                        t.slice(0, None, Some(-1), 1).unwrap(),
                        t.slice(0, Some(1), None, 1).unwrap(),
                    )
                }),
                ("itself", |t| (t.clone(), t.clone())),
                ("even columns from odd", |t| {
                    (cols(t, 64, 0, 2), cols(t, 64, 1, 2))
                }),
                ("left halves from right halves", |t| {
                    let m = t.reshape(&[64, 64]).unwrap();
                    (
                        m.slice(1, None, Some(32), 1).unwrap(),
                        m.slice(1, Some(32), None, 1).unwrap(),
                    )
                }),
                ("even columns from odd, transposed", |t| {
                    let top = |c| cols(t, 64, c, 2).slice(0, None, Some(32), 1).unwrap(); // 32 × 32
                    (top(0), top(1).transpose(0, 1).unwrap())
                }),
            ];
            // A broadcast destination copied onto itself is refused, as on the CPU.
            for d in [Device::Cpu, dev(0)] {
                let t = arange_u32(4).to(d).unwrap();
                let b = t.slice(0, None, Some(1), 1).unwrap().expand(&[4]).unwrap();
                assert!(
                    matches!(b.copy_from(&b), Err(devtensor::Error::OverlappingDestination)),
                    "{d}"
                );
            }
            let stream = <$stream>::new(0).unwrap();
            for (name, views) in cases {
                // The reference: through a fresh copy of the source, which
                // shares nothing with the destination.
                let cpu = arange_u32(n);
                let (d, s) = views(&cpu);
                let snapshot = Tensor::empty(s.shape(), s.dtype(), Device::Cpu).unwrap();
                snapshot.copy_from(&s).unwrap();
                d.copy_from(&snapshot).unwrap();
                let want = cpu.to_vec::<u32>().unwrap();
                for on_stream in [false, true] {
                    let gpu = arange_u32(n).to(dev(0)).unwrap();
                    let (d, s) = views(&gpu);
                    if on_stream {
                        $handoff(&$default_stream(0), &stream).unwrap(); // the upload
                        copy_on(&stream, &d, &s);
                        stream.synchronize().unwrap();
                    } else {
                        d.copy_from(&s).unwrap();
                    }
                    assert_eq!(
                        gpu.to_vec::<u32>().unwrap(),
                        want,
                        "{name}, on a stream: {on_stream}"
                    );
                }
            }
        }

        #[test]
        fn interleaved_views_of_distinct_elements_are_copied_and_filled() {
            if !ready("interleaved_views_of_distinct_elements_are_copied_and_filled") {
                return;
            }
            // Rows 1001 elements apart of every other element, 1000 long: the
            // rows interleave, their elements do not (as NumPy and torch write).
            let n = 1001 * 99 + 1999;
            let run = |d: Device| -> Vec<u32> {
                let t = Tensor::zeros(&[n], DType::U32, d).unwrap();
                let v = t.as_strided(&[100, 1000], &[1001, 2], 0).unwrap();
                v.copy_from(&arange_u32(100_000).reshape(&[100, 1000]).unwrap().to(d).unwrap())
                    .unwrap();
                t.as_strided(&[2, 3], &[3, 2], 7).unwrap().fill(7u32).unwrap(); // 7 9 11 / 10 12 14
                t.to_vec::<u32>().unwrap()
            };
            let (gpu, cpu) = (run(dev(0)), run(Device::Cpu));
            assert_eq!(cpu[1001 * 7 + 2 * 5], 7005);
            assert_eq!(gpu, cpu);
        }

        #[test]
        fn device_copies_of_random_views_match_the_cpu_engine() {
            if !ready("device_copies_of_random_views_match_the_cpu_engine") {
                return;
            }
            // The source lives on the device: every permutation, flip, step,
            // offset and broadcast below is read by the device's kernels, into a
            // contiguous tensor or into a strided view of another one.
            let mut rng = common::Rng(0xd1ce);
            let base_host = arange_u32(1 << 14);
            let base = base_host.to(dev(0)).unwrap();
            for case in 0..120 {
                let ndim = 1 + rng.below(4) as usize;
                let shape: Vec<isize> = (0..ndim).map(|_| 1 + rng.below(12) as isize).collect();
                let n: usize = shape.iter().map(|&d| d as usize).product();
                let offset = rng.below(64) as isize;
                let views = |b: &Tensor| -> Tensor {
                    let mut r = common::Rng(case as u64 + 1);
                    let mut v = b
                        .slice(0, Some(offset), Some(offset + n as isize), 1)
                        .unwrap()
                        .reshape(&shape)
                        .unwrap();
                    let mut perm: Vec<isize> = (0..ndim as isize).collect();
                    for i in (1..ndim).rev() {
                        perm.swap(i, r.below(i as u64 + 1) as usize);
                    }
                    v = v.permute(&perm).unwrap();
                    if r.below(2) == 0 {
                        v = v.flip(&[r.below(ndim as u64) as isize]).unwrap();
                    }
                    let d = r.below(ndim as u64) as isize;
                    v = v.slice(d, None, None, 1 + r.below(3) as isize).unwrap();
                    if r.below(3) == 0 {
                        // A broadcast: a new leading dim of 3 with stride 0.
                        let mut to: Vec<isize> = vec![3];
                        to.extend(v.shape().iter().map(|&x| x as isize));
                        v = v.unsqueeze(0).unwrap().expand(&to).unwrap();
                    }
                    v
                };
                let want = views(&base_host).contiguous().unwrap().to_vec::<u32>().unwrap();
                let view = views(&base);
                let got = view.contiguous().unwrap();
                assert_eq!(got.device(), dev(0));
                assert_eq!(got.to_vec::<u32>().unwrap(), want, "case {case}: contiguous");
                // Into a flipped, transposed destination on the device.
                let dst = Tensor::zeros(view.shape(), DType::U32, dev(0)).unwrap();
                let nd = dst.ndim() as isize;
                let dst_view = dst.flip(&[nd - 1]).unwrap().transpose(0, nd - 1).unwrap();
                let src_t = view.flip(&[nd - 1]).unwrap().transpose(0, nd - 1).unwrap();
                dst_view.copy_from(&src_t).unwrap();
                assert_eq!(
                    dst.to_vec::<u32>().unwrap(),
                    want,
                    "case {case}: strided destination"
                );
            }
        }

        #[test]
        fn pitched_rows_cross_between_host_and_device() {
            if !ready("pitched_rows_cross_between_host_and_device") {
                return;
            }
            // Column slices of a row-major matrix: rows of `w` elements, `n` apart
            // (what a 2-D copy with a pitch moves), both directions, pageable and pinned.
            for host_dev in [Device::Cpu, $host] {
                for (m, n, a, w) in [
                    (37usize, 64usize, 3usize, 17usize),
                    (256, 1000, 500, 300),
                    (5, 8, 0, 8),
                ] {
                    let all = arange_u32(m * n)
                        .reshape(&[m as isize, n as isize])
                        .unwrap()
                        .to(host_dev)
                        .unwrap();
                    let cols = all.slice(1, Some(a as isize), Some((a + w) as isize), 1).unwrap();
                    let want = cols.to_vec::<u32>().unwrap();
                    let g = Tensor::zeros(&[m, w], DType::U32, dev(0)).unwrap();
                    g.copy_from(&cols).unwrap();
                    assert_eq!(
                        g.to_vec::<u32>().unwrap(),
                        want,
                        "{host_dev} h2d {m}x{n}[{a}..{}]",
                        a + w
                    );
                    let back = Tensor::zeros(&[m, n], DType::U32, host_dev).unwrap();
                    let back_cols = back
                        .slice(1, Some(a as isize), Some((a + w) as isize), 1)
                        .unwrap();
                    back_cols.copy_from(&g).unwrap();
                    assert_eq!(back_cols.to_vec::<u32>().unwrap(), want, "{host_dev} d2h");
                    let outside = back
                        .slice(1, Some((a + w) as isize), None, 1)
                        .unwrap()
                        .to_vec::<u32>()
                        .unwrap();
                    assert!(
                        outside.iter().all(|&x| x == 0),
                        "{host_dev} d2h wrote outside its columns"
                    );
                }
            }
        }

        #[test]
        fn kernels_run_on_pinned_and_managed_memory() {
            if !ready("kernels_run_on_pinned_and_managed_memory") {
                return;
            }
            let managed: Option<Device> = ($managed)(0);
            for d in [Some($host), managed].into_iter().flatten() {
                let src = arange_u32(96 * 70).reshape(&[96, 70]).unwrap();
                let want = src
                    .transpose(0, 1)
                    .unwrap()
                    .contiguous()
                    .unwrap()
                    .to_vec::<u32>()
                    .unwrap();
                let there = src.to(d).unwrap();
                // host-accessible memory → device, transposing
                let g = Tensor::zeros(&[70, 96], DType::U32, dev(0)).unwrap();
                g.copy_from(&there.transpose(0, 1).unwrap()).unwrap();
                assert_eq!(g.to_vec::<u32>().unwrap(), want, "{d} -> device");
                // device → host-accessible memory, transposing back
                let out = Tensor::zeros(&[96, 70], DType::U32, d).unwrap();
                out.copy_from(&g.transpose(0, 1).unwrap()).unwrap();
                assert_eq!(
                    out.to_vec::<u32>().unwrap(),
                    src.to_vec::<u32>().unwrap(),
                    "device -> {d}"
                );
                out.slice(1, None, None, 7).unwrap().fill(5u32).unwrap();
                let mut want_filled = src.to_vec::<u32>().unwrap();
                want_filled
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| i % 70 % 7 == 0)
                    .for_each(|(_, x)| *x = 5);
                assert_eq!(out.to_vec::<u32>().unwrap(), want_filled, "fill of {d}");
            }
        }

        #[test]
        fn freed_blocks_wait_for_the_streams_that_used_them() {
            if !ready("freed_blocks_wait_for_the_streams_that_used_them") {
                return;
            }
            // A block read on a side stream is freed while that read may still be
            // queued; the next allocation of its size is written at once on the
            // default stream. A pool that reuses the block before the side stream's
            // work is done lets the write race the read (the emulated driver's race
            // detector reports it whatever the timing; a GPU shows wrong values).
            let side = <$stream>::new(0).unwrap();
            let n = 1 << 16;
            for round in 0..8u32 {
                let out = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
                let tmp = Tensor::full(&[n], round, dev(0)).unwrap();
                $handoff(&$default_stream(0), &side).unwrap(); // the fills before the read
                copy_on(&side, &out, &tmp.flip(&[0]).unwrap());
                drop(tmp);
                let again = Tensor::empty(&[n], DType::U32, dev(0)).unwrap();
                again.fill(0xdead_beefu32).unwrap();
                side.synchronize().unwrap();
                assert_eq!(out.to_vec::<u32>().unwrap(), vec![round; n], "round {round}");
                assert_eq!(again.to_vec::<u32>().unwrap(), vec![0xdead_beef; n]);
            }
        }

        /// The stream handle `record_stream` and `ExportOptions::stream` take.
        fn handle_of(s: &$stream) -> devtensor::stream::StreamHandle {
            s.handle()
        }

        /// A consumer's own view of an export's memory, as a foreign framework's
        /// tensor would be: it owns nothing (its descriptor's deleter only frees
        /// the descriptor), so the export's deleter is the consumer's to call.
        ///
        /// # Safety
        ///
        /// `dl` is a live export.
        unsafe fn alias_of(dl: *mut devtensor::dlpack::ffi::DLManagedTensorVersioned) -> Tensor {
            use devtensor::dlpack::ffi::DLManagedTensorVersioned;
            unsafe extern "C" fn free_descriptor(m: *mut DLManagedTensorVersioned) {
                // SAFETY: made by `Box::into_raw` below, called once.
                drop(unsafe { Box::from_raw(m) });
            }
            // SAFETY: `dl` is live (caller); the import copies shape and strides.
            unsafe {
                let view = Box::into_raw(Box::new(DLManagedTensorVersioned {
                    version: (*dl).version,
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(free_descriptor),
                    flags: 0,
                    dl_tensor: (*dl).dl_tensor,
                }));
                devtensor::dlpack::from_dlpack_versioned(view).unwrap()
            }
        }

        #[test]
        fn exports_keep_memory_from_reuse_until_the_consumer_stream_is_done() {
            if !ready("exports_keep_memory_from_reuse_until_the_consumer_stream_is_done") {
                return;
            }
            // The DLPack consumer (torch, CuPy) imports on its stream S, queues a read
            // there and calls the deleter when its tensor dies, with the read still
            // queued. The block goes back to the pool; the next allocation of its size,
            // written at once on the default stream, must wait for S's work (the export
            // records S on the storage), or the write races the read (the emulated
            // driver's race detector reports it whatever the timing).
            let consumer = <$stream>::new(0).unwrap();
            let n = 1 << 16;
            for round in 0..8u32 {
                let out = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
                let t = Tensor::full(&[n], round, dev(0)).unwrap();
                let dl = t
                    .to_dlpack_versioned(devtensor::dlpack::ExportOptions {
                        stream: Some(handle_of(&consumer)),
                        ..Default::default()
                    })
                    .into_raw();
                drop(t);
                // The DLPack handoff: our fills before the consumer's work.
                $handoff(&$default_stream(0), &consumer).unwrap();
                // SAFETY: `dl` is live until its deleter runs below.
                let alias = unsafe { alias_of(dl) };
                copy_on(&consumer, &out, &alias.flip(&[0]).unwrap());
                drop(alias);
                // SAFETY: a live export, freed once.
                unsafe { ((*dl).deleter.unwrap())(dl) };
                let again = Tensor::empty(&[n], DType::U32, dev(0)).unwrap();
                again.fill(0xdead_beefu32).unwrap();
                consumer.synchronize().unwrap();
                assert_eq!(out.to_vec::<u32>().unwrap(), vec![round; n], "round {round}");
                assert_eq!(again.to_vec::<u32>().unwrap(), vec![0xdead_beef; n]);
            }
            devtensor::dlpack::drain_deleters();
        }

        #[test]
        fn a_consumer_stream_dropped_before_the_release_still_orders_the_free() {
            if !ready("a_consumer_stream_dropped_before_the_release_still_orders_the_free") {
                return;
            }
            // The consumer drops its stream (one of ours) before the exported memory
            // is freed, with a read of the memory still queued there. Our streams are
            // never destroyed (a real driver crashed recording on a destroyed one), so
            // the free still records an event there and the next user of the block
            // waits for the read. Dropping streams before the tensors they used, as
            // any `drop((stream, tensor))` does, is safe.
            let n = 1 << 12;
            for round in 0..3u32 {
                let out = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
                let t = Tensor::full(&[n], round, dev(0)).unwrap();
                let consumer = <$stream>::new(0).unwrap();
                let dl = t
                    .to_dlpack_versioned(devtensor::dlpack::ExportOptions {
                        stream: Some(handle_of(&consumer)),
                        ..Default::default()
                    })
                    .into_raw();
                assert!(
                    t.storage().streams().contains(&handle_of(&consumer)),
                    "our own consumer stream is recorded on the exported memory"
                );
                drop(t);
                $handoff(&$default_stream(0), &consumer).unwrap();
                // SAFETY: `dl` is live until its deleter runs below.
                let alias = unsafe { alias_of(dl) };
                copy_on(&consumer, &out, &alias);
                drop(alias);
                drop(consumer); // read still queued
                // SAFETY: a live export, freed once.
                unsafe { ((*dl).deleter.unwrap())(dl) };
                let again = Tensor::full(&[n], 0xdead_beefu32, dev(0)).unwrap();
                // `out` was written on the consumer's stream: read on another
                // only after that work (recorded on `out`) is done. The fill
                // above orders it only where `again` took `t`'s block, which
                // a test running beside may have taken first (the emulator
                // then reported this read as a race).
                $synchronize_streams(0, &out.storage().streams()).unwrap();
                assert_eq!(out.to_vec::<u32>().unwrap(), vec![round; n], "round {round}");
                assert_eq!(again.to_vec::<u32>().unwrap(), vec![0xdead_beef; n]);
            }
            devtensor::dlpack::drain_deleters();
        }

        #[test]
        fn imported_tensors_outlive_the_device_work_that_uses_them() {
            if !ready("imported_tensors_outlive_the_device_work_that_uses_them") {
                return;
            }
            use devtensor::dlpack::ffi::{DLManagedTensorVersioned, DLPackVersion};
            use std::sync::Arc;
            use std::sync::atomic::{AtomicUsize, Ordering};
            // A producer (torch, say) exports a tensor it wrote on its stream P; its
            // deleter gives the block back to its caching allocator, which reuses it for
            // its next op on P. Our copy_from / contiguous_copy (clone) / contiguous
            // queue work on the default stream and return: dropping the import must not
            // run the deleter before that work is done, or the producer's write races
            // our read (the emulated driver reports it whatever the timing).
            #[repr(C)]
            struct Producer {
                managed: DLManagedTensorVersioned,
                shape: [i64; 1],
                block: Tensor,
                next_op: Tensor,
                stream: Arc<$stream>,
                ran: Arc<AtomicUsize>,
            }
            unsafe extern "C" fn release(m: *mut DLManagedTensorVersioned) {
                // SAFETY: `m` starts a Box<Producer> (repr(C), managed first), freed once.
                let p = unsafe { Box::from_raw(m.cast::<Producer>()) };
                // The producer's allocator reuses the block for its next op on P
                // (an error would be the race, reported by the test's later calls).
                let _ = enqueue_copy(&p.block, &p.next_op, &*p.stream);
                p.ran.fetch_add(1, Ordering::SeqCst);
            }
            let n = 1 << 16;
            let producer = Arc::new(<$stream>::new(0).unwrap());
            let ran = Arc::new(AtomicUsize::new(0));
            let expected = arange_u32(n).to(dev(0)).unwrap();
            let reversed: Vec<u32> = (0..n as u32).rev().collect();
            let ops = ["copy_from", "contiguous_copy", "contiguous"];
            for (i, op) in ops.iter().enumerate() {
                let block = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
                let next_op = Tensor::full(&[n], 0xdead_beefu32, dev(0)).unwrap();
                let out = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
                $handoff(&$default_stream(0), &*producer).unwrap(); // the fills first
                copy_on(&producer, &block, &expected);
                // The producer's side of the DLPack handoff, to our default stream.
                $handoff(&*producer, &$default_stream(0)).unwrap();
                let dl = block.to_dlpack_versioned(Default::default()).into_raw();
                // SAFETY: `dl` is a live export read once; the Producer owns the rest.
                let imported = unsafe {
                    let mut p = Box::new(Producer {
                        managed: DLManagedTensorVersioned {
                            version: DLPackVersion { major: 1, minor: 0 },
                            manager_ctx: std::ptr::null_mut(),
                            deleter: Some(release),
                            flags: 0,
                            dl_tensor: (*dl).dl_tensor,
                        },
                        shape: [n as i64],
                        block: block.clone(),
                        next_op,
                        stream: producer.clone(),
                        ran: ran.clone(),
                    });
                    p.managed.dl_tensor.shape = p.shape.as_mut_ptr();
                    p.managed.dl_tensor.strides = std::ptr::null_mut();
                    ((*dl).deleter.unwrap())(dl);
                    devtensor::dlpack::from_dlpack_versioned(Box::into_raw(p).cast()).unwrap()
                };
                drop(block);
                let flipped = imported.flip(&[0]).unwrap();
                let result = match *op {
                    "copy_from" => {
                        out.copy_from(&flipped).unwrap();
                        out
                    }
                    "contiguous_copy" => flipped.contiguous_copy().unwrap(),
                    _ => flipped.contiguous().unwrap(),
                };
                drop((imported, flipped));
                assert_eq!(result.to_vec::<u32>().unwrap(), reversed, "{op}");
                producer.synchronize().unwrap();
                assert!(ran.load(Ordering::SeqCst) <= i + 1, "a deleter ran twice");
            }
            devtensor::dlpack::drain_deleters();
            producer.synchronize().unwrap();
            assert_eq!(ran.load(Ordering::SeqCst), ops.len(), "every deleter ran once");
        }

        #[test]
        #[serial_test::serial(gpu_memory)]
        fn out_of_memory_is_typed_and_the_pool_recovers() {
            if !ready("out_of_memory_is_typed_and_the_pool_recovers") {
                return;
            }
            let last = ($status).devices.len() as u32 - 1;
            let total = ($status).devices[last as usize].total_memory;
            let chunk = (total / 8).max(1 << 20);
            let mut held = Vec::new();
            let err = loop {
                match Tensor::empty(&[chunk], DType::U8, dev(last)) {
                    Ok(t) => held.push(t),
                    Err(e) => break e,
                }
                assert!(
                    held.len() <= 9,
                    "{} chunks of {chunk} bytes fit in {total}",
                    held.len()
                );
            };
            assert!(
                matches!(err, devtensor::Error::OutOfMemory { .. }),
                "expected OutOfMemory, got {err:?}"
            );
            assert!(
                held.len() >= 4,
                "only {} chunks of {chunk} bytes before OOM",
                held.len()
            );
            // Freed blocks go back to the pool; a bigger request must free the
            // cached ones and retry instead of failing.
            held.clear();
            let big = Tensor::empty(&[chunk * 3], DType::U8, dev(last)).unwrap();
            big.slice(0, Some(-1000), None, 1).unwrap().fill(1u8).unwrap();
            assert_eq!(
                big.slice(0, Some(-10), None, 1).unwrap().to_vec::<u8>().unwrap(),
                vec![1; 10]
            );
            drop(big);
            devtensor::backend::empty_cache(dev(last)).unwrap();
        }

        #[test]
        fn zero_size_tensors_on_the_device() {
            if !ready("zero_size_tensors_on_the_device") {
                return;
            }
            let z = Tensor::zeros(&[0, 7], DType::F32, dev(0)).unwrap();
            assert_eq!(z.nbytes(), 0);
            z.fill(1.0f32).unwrap();
            let t = z.transpose(0, 1).unwrap().contiguous().unwrap();
            assert_eq!(t.shape(), &[7, 0]);
            assert!(t.to_vec::<f32>().unwrap().is_empty());
            let h = Tensor::zeros(&[7, 0], DType::F32, Device::Cpu).unwrap();
            h.copy_from(&t).unwrap();
            let dl = t.to_dlpack_versioned(Default::default()).into_raw();
            // SAFETY: a live export, freed once.
            unsafe { ((*dl).deleter.unwrap())(dl) };
        }
        #[test]
        fn misaligned_wide_elements_are_copied_and_filled() {
            if !ready("misaligned_wide_elements_are_copied_and_filled") {
                return;
            }
            // complex128 views 8 bytes into device buffers, as DLPack's byte_offset
            // allows: 16-byte vector accesses there fault (a sticky error that
            // poisons the context a framework shares), so kernels must use 8-byte units.
            let n = 40usize;
            let view_at_8 = |raw: &Tensor| -> Tensor {
                let dl = raw.to_dlpack_versioned(Default::default()).into_raw();
                // SAFETY: the export is live and owned here; its shape array holds one
                // writable entry; the view stays inside the buffer (8 + 16n ≤ its size).
                unsafe {
                    (*dl).dl_tensor.dtype = DType::C128.to_dlpack();
                    *(*dl).dl_tensor.shape = n as i64;
                    (*dl).dl_tensor.strides = std::ptr::null_mut();
                    (*dl).dl_tensor.byte_offset = 8;
                    devtensor::dlpack::from_dlpack_versioned(dl).unwrap()
                }
            };
            let raw = Tensor::zeros(&[8 + 16 * n + 8], DType::U8, dev(0)).unwrap();
            let t = view_at_8(&raw);
            assert_eq!(t.data_ptr() as usize % 16, 8);
            let value: Vec<u8> = (1..=16).collect();
            t.slice(0, None, None, 2).unwrap().fill_bytes(&value).unwrap();
            let want = |i: usize| -> &[u8] { if i % 2 == 0 { &value } else { &[0; 16] } };
            let bytes = raw.to_vec::<u8>().unwrap();
            for i in 0..n {
                assert_eq!(&bytes[8 + 16 * i..8 + 16 * (i + 1)], want(i), "fill: element {i}");
            }
            assert_eq!(&bytes[..8], &[0; 8], "nothing written before the view");
            // Misaligned source and destination: a flipped copy between two such views.
            let raw2 = Tensor::zeros(&[8 + 16 * n + 8], DType::U8, dev(0)).unwrap();
            view_at_8(&raw2).copy_from(&t.flip(&[0]).unwrap()).unwrap();
            let bytes2 = raw2.to_vec::<u8>().unwrap();
            for i in 0..n {
                assert_eq!(
                    &bytes2[8 + 16 * i..8 + 16 * (i + 1)],
                    want(n - 1 - i),
                    "copy: element {i}"
                );
            }
            // Misaligned source into an aligned new tensor.
            let c = t.flip(&[0]).unwrap().contiguous().unwrap();
            assert_eq!(c.data_ptr() as usize % 16, 0);
            let raw3 = Tensor::zeros(&[8 + 16 * n + 8], DType::U8, dev(0)).unwrap();
            view_at_8(&raw3).copy_from(&c).unwrap();
            assert_eq!(
                raw3.to_vec::<u8>().unwrap(),
                bytes2,
                "contiguous() then copied back"
            );
        }
        #[test]
        #[serial_test::serial(gpu_memory)]
        fn rows_further_apart_than_the_max_pitch_still_copy() {
            if !ready("rows_further_apart_than_the_max_pitch_still_copy") {
                return;
            }
            // Two rows of pinned memory 2^31 + 64 bytes apart: past the pitch a 2-D DMA
            // takes (CU_DEVICE_ATTRIBUTE_MAX_PITCH is 2^31 - 1 on current GPUs), which
            // cuMemcpy2D refuses with CUDA_ERROR_INVALID_VALUE: the copy must take
            // another path instead of failing.
            let (pitch, w) = ((1usize << 31) + 64, 100usize);
            let host = Tensor::empty(&[pitch + w], DType::U8, $host).unwrap();
            let rows = host.as_strided(&[2, w], &[pitch as isize, 1], 0).unwrap();
            let data: Vec<u8> = (0..2 * w).map(|i| (i * 7 % 251) as u8).collect();
            rows.copy_from(&Tensor::from_slice(&data, &[2, w]).unwrap())
                .unwrap();
            let g = Tensor::zeros(&[2, w], DType::U8, dev(0)).unwrap();
            g.copy_from(&rows).unwrap();
            assert_eq!(g.to_vec::<u8>().unwrap(), data, "pinned rows -> device");
            rows.fill(0u8).unwrap();
            rows.copy_from(&g).unwrap();
            assert_eq!(rows.to_vec::<u8>().unwrap(), data, "device -> pinned rows");
            drop((rows, host));
            devtensor::backend::empty_cache($host).unwrap();
        }
    };
}
