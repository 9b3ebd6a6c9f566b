//! Errors of the CUDA backend, each naming what failed.

/// What went wrong on the device side.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CUDA driver library could not be loaded (no NVIDIA driver, or not on the library path).
    #[error("no CUDA driver found (libcuda.so): use --device cpu")]
    NoDriver,
    /// NVRTC could not be loaded.
    #[error("no NVRTC library found (libnvrtc.so): install the CUDA toolkit or nvidia-cuda-nvrtc, or use --device cpu")]
    NoNvrtc,
    /// The driver is there but the requested GPU is not.
    #[error("CUDA device {ordinal} not found ({count} device(s) present): use --device cpu or another index")]
    NoDevice {
        /// Requested index.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// A driver call failed.
    #[error("CUDA {what}: {source}")]
    Driver {
        /// The operation.
        what: String,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// NVRTC rejected a kernel source.
    #[error("NVRTC failed to compile the kernels for {arch} ({options}):\n{log}")]
    Compile {
        /// Target architecture.
        arch: String,
        /// The options passed.
        options: String,
        /// NVRTC's log.
        log: String,
    },
    /// A weight type no kernel handles.
    #[error("tensor '{name}': type {ty} is not supported by the CUDA backend yet")]
    Unsupported {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: kiln_quant::GgmlType,
    },
    /// A shape or argument the kernels cannot take.
    #[error("CUDA {op}: {detail}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The on-disk kernel cache could not be used (reported, never fatal to compilation).
    #[error("kernel cache {path}: {source}")]
    Cache {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps a driver error with the operation's name.
pub(crate) fn drv(what: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    let what = what.into();
    move |source| Error::Driver { what, source }
}
