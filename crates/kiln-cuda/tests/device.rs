//! On a machine without the CUDA driver: opening a device is a clear error, not a panic. With a GPU: the whole
//! kernel sweep passes (the same sweep `kiln selftest --device cuda` prints).

#[test]
fn open_reports_missing_driver_or_runs_the_sweep() {
    match kiln_cuda::Device::open(0, kiln_cuda::Options::default()) {
        Err(e) if !kiln_cuda::driver_available() => {
            assert!(matches!(e, kiln_cuda::Error::NoDriver), "{e}");
            assert_eq!(
                e.to_string(),
                "no CUDA driver found (libcuda.so): use --device cpu"
            );
        }
        Err(e) => panic!("a CUDA driver is present but the device did not open: {e}"),
        Ok(dev) => {
            let checks = kiln_cuda::selftest::run(&dev).expect("self-test ran");
            let failed: Vec<_> = checks.iter().filter(|c| !c.ok()).collect();
            assert!(failed.is_empty(), "failed checks: {failed:#?}");
        }
    }
}

#[test]
fn out_of_range_ordinal_is_an_error() {
    if kiln_cuda::driver_available() {
        let e = kiln_cuda::Device::open(1 << 20, kiln_cuda::Options::default())
            .expect_err("no machine has that many GPUs");
        assert!(matches!(e, kiln_cuda::Error::NoDevice { .. }), "{e}");
    } else {
        assert!(matches!(
            kiln_cuda::Device::open(1 << 20, kiln_cuda::Options::default()),
            Err(kiln_cuda::Error::NoDriver)
        ));
    }
}
