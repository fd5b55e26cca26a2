//! The GPU test suite, written once and instantiated per backend by
//! `gpu_suite!` (tests/gpu_cuda.rs, and the ROCm twin). Every test skips
//! visibly without a device and fails instead under `DEVTENSOR_REQUIRE_GPU=1`.

/// Instantiates the suite for one backend.
///
/// `$status`: the backend's probe; `$dev(i)`: device memory of GPU i;
/// `$host`: its pinned host memory; `$managed(i)`: managed memory, if any;
/// `$stream`: its stream type (with `new(ordinal)` and `synchronize()`);
/// `$copy_on`: its enqueue-a-copy function; `$handoff`: its DLPack handoff;
/// `$current`: the ordinal current on the calling thread.
#[macro_export]
macro_rules! gpu_suite {
    (
        status: $status:expr,
        dev: $dev:expr,
        host: $host:expr,
        managed: $managed:expr,
        stream: $stream:ty,
        copy_on_stream: $copy_on:path,
        handoff: $handoff:path,
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
                let dl = t.to_dlpack_versioned(Default::default());
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
        }

        /// Enqueues `src → dst` on `stream`.
        fn copy_on(stream: &$stream, dst: &Tensor, src: &Tensor) {
            $copy_on(dst, src, stream).unwrap();
        }

        #[test]
        fn stream_handoff_orders_a_slow_producer_before_the_consumer() {
            if !ready("stream_handoff_orders_a_slow_producer_before_the_consumer") {
                return;
            }
            let producer = <$stream>::new(0).unwrap();
            let consumer = <$stream>::new(0).unwrap();
            let n = 1 << 26; // 256 MiB of u32: each pass takes milliseconds
            let big = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
            let scratch = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
            let expected = arange_u32(n).to(dev(0)).unwrap();
            // A deliberately slow producer: many large transposing passes, then the real write.
            for _ in 0..20 {
                copy_on(
                    &producer,
                    &scratch.reshape(&[8192, -1]).unwrap(),
                    &big.reshape(&[-1, 8192]).unwrap().transpose(0, 1).unwrap(),
                );
            }
            copy_on(&producer, &big, &expected);
            // The DLPack rule: event on the producer, wait on the consumer, no host block.
            $handoff(&producer, &consumer).unwrap();
            let out = Tensor::zeros(&[n], DType::U32, dev(0)).unwrap();
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
                $copy_on(&g, &h, &s),
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
    };
}
