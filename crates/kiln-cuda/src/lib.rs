//! kiln-cuda: the CUDA side of kiln — device discovery, NVRTC compilation of the kernels in `kernels/*.cu`
//! (for the GPU's exact architecture, cached on disk), device buffers and one method per kernel.
//!
//! - [`Device::open`] opens GPU `N`; with no driver or GPU it returns [`Error::NoDriver`] /
//!   [`Error::NoDevice`] (never a panic), so callers can fall back to or point at `--device cpu`.
//! - [`compile`] holds the kernel sources and the exact NVRTC options (shared by the run-time path and the CI
//!   compile check, `tools/check-kernels.sh`).
//! - [`bench`] times the kernels on a Qwen3-8B decode step's shapes.
//! - [`selftest`] runs every kernel against a host reference, including batch invariance (bit equality of a
//!   row computed alone and among others).
//!
//! The crate builds without any CUDA toolkit: cudarc loads libcuda/libnvrtc at run time.
#![deny(missing_docs)]

pub mod bench;
pub mod compile;
mod device;
mod error;
pub mod selftest;

pub use device::{
    driver_available, supports, AttnShape, DBuf, DKv, DWeight, Device, MoeShape, Options,
};
pub use error::{Error, Result};
