//! kiln-engine: runs GGUF language models.
//!
//! - [`Model::load`] opens a GGUF, reads its hyperparameters ([`Hparams`]) and binds every tensor the
//!   architecture's definition declares (llama, qwen3, qwen3moe), checking shapes strictly.
//! - [`Session`] owns a KV cache split into sequence slots and runs [`Batch`]es of rows
//!   `(slot, pos, token, wants_logits)`; [`Session::prefill`] and [`Session::decode`] are the common cases, and
//!   [`Model::teacher_forced_logits`] is the one-call path for parity checks.
//! - [`Generator`] is the generation loop: chunked prefill, one-token decode, sampling, stop conditions.
//! - [`Backend`] is the trait the model definitions are written against; [`CpuBackend`] implements it.
//! - [`flags`] is the kill-switch registry (`KILN_NO_*`), read once into a [`Flags`] value.
//!
//! Batch invariance: a row's logits are bit-identical whether it runs alone, batched with other sequences'
//! decode rows, in a speculative verify block or in a prefill chunk, because every op reduces each row in a fixed
//! order independent of the other rows.
//!
//! ```no_run
//! use kiln_engine::{LoadOptions, Model, Session, SessionConfig};
//! let model = Model::load("model.gguf", LoadOptions::default())?;
//! let mut s = Session::new(&model, SessionConfig::default())?;
//! let logits = s.prefill(0, &[1, 2, 3])?; // logits after the last prompt token
//! let next = logits
//!     .iter()
//!     .enumerate()
//!     .max_by(|a, b| a.1.total_cmp(b.1))
//!     .map(|(i, _)| i as u32)
//!     .unwrap();
//! let _ = s.decode(0, next)?;
//! # Ok::<(), kiln_engine::Error>(())
//! ```
#![deny(missing_docs)]

mod backend;
pub mod bench;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dflash;
mod error;
pub mod fidelity;
pub mod flags;
mod generate;
mod hparams;
mod models;
pub mod sampler;
pub mod scheduler;
mod session;
pub mod synth;
mod weights;

pub use backend::{
    AttnParams, AttnRow, Backend, BlockAttn, KvLayout, KvType, MoeFfn, RopeMode, RopeParams,
};
pub use cpu::CpuBackend;
#[cfg(feature = "cuda")]
pub use cuda::CudaBackend;
pub use error::{Error, Result};
pub use flags::Flags;
pub use generate::{FinishReason, GenerateParams, Generator, StepOutcome, StopMatcher};
pub use hparams::{Arch, Hparams};
pub use models::{LoadOptions, Model};
pub use session::{Batch, BatchRow, Output, Session, SessionConfig};
pub use weights::{Weight, WeightView};
