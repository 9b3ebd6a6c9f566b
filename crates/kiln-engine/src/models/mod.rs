//! Models: loading a GGUF into a [`Model`] (hyperparameters, bound weights, backend), one definition per
//! architecture (`llama.rs`, `qwen3.rs`, `qwen3moe.rs`) built from the shared blocks in `blocks.rs`.

pub(crate) mod blocks;
mod llama;
mod qwen3;
mod qwen3moe;

use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::flags::Flags;
use crate::hparams::{Arch, Hparams};
use crate::weights::Binder;
use blocks::Pass;
use kiln_gguf::GgufFile;
use std::path::Path;
use std::sync::Arc;

/// How to load a model. The default: all cores, every optimization on, no progress callback.
#[derive(Default)]
pub struct LoadOptions<'a> {
    /// CPU worker threads (0 = all cores).
    pub threads: usize,
    /// Kill switches (read once at start-up with [`Flags::from_env`]).
    pub flags: Flags,
    /// Called with `(bytes_done, bytes_total)` while the weights are read into memory.
    pub progress: Option<&'a mut dyn FnMut(u64, u64)>,
}

/// The architecture-specific weights.
pub(crate) enum Net {
    Llama(llama::Llama),
    Qwen3(qwen3::Qwen3),
    Qwen3Moe(qwen3moe::Qwen3Moe),
}

/// A loaded model: the mapped GGUF, its hyperparameters, bound weights and the backend that runs it.
/// Sessions ([`crate::Session`]) borrow it; it is immutable after loading and can serve several sessions.
pub struct Model {
    file: Arc<GgufFile>,
    hparams: Hparams,
    net: Net,
    backend: CpuBackend,
    /// Set by [`Model::use_cuda`]: sessions then run on the GPU.
    #[cfg(feature = "cuda")]
    cuda: Option<crate::cuda::CudaBackend>,
    warnings: Vec<String>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Model({:?}, {:?})", self.hparams, self.backend)
    }
}

impl Model {
    /// Opens and binds the GGUF at `path`.
    pub fn load(path: impl AsRef<Path>, opts: LoadOptions) -> Result<Model> {
        let file = GgufFile::open(path.as_ref())?;
        Model::from_gguf(Arc::new(file), opts)
    }

    /// Binds an already opened GGUF.
    pub fn from_gguf(file: Arc<GgufFile>, mut opts: LoadOptions) -> Result<Model> {
        let meta = file.metadata();
        let arch = Arch::from_name(meta.get_str("general.architecture")?)?;
        let n_embd_key = format!("{}.embedding_length", arch.name());
        let n_embd = meta.get_u64(&n_embd_key)?;
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::MissingTensor {
                name: "token_embd.weight".into(),
                expected: vec![n_embd, 0],
            })?;
        if embd.shape.len() != 2 || embd.shape[0] != n_embd {
            return Err(Error::TensorShape {
                name: "token_embd.weight".into(),
                actual: embd.shape.clone(),
                expected: vec![n_embd, embd.shape.get(1).copied().unwrap_or(0)],
            });
        }
        let hparams = Hparams::from_gguf(arch, meta, embd.shape[1] as usize)?;
        let mut binder = Binder::new(file.clone());
        let net = match arch {
            Arch::Llama => Net::Llama(llama::bind(&mut binder, &hparams)?),
            Arch::Qwen3 => Net::Qwen3(qwen3::bind(&mut binder, &hparams)?),
            Arch::Qwen3Moe => Net::Qwen3Moe(qwen3moe::bind(&mut binder, &hparams)?),
        };
        let warnings = binder.finish();
        if let Some(cb) = opts.progress.as_mut() {
            prefault(&file, *cb);
        }
        let backend = CpuBackend::new(opts.threads, opts.flags)?;
        Ok(Model {
            file,
            hparams,
            net,
            backend,
            #[cfg(feature = "cuda")]
            cuda: None,
            warnings,
        })
    }

    /// Hyperparameters.
    pub fn hparams(&self) -> &Hparams {
        &self.hparams
    }

    /// The GGUF the model was loaded from (metadata for the tokenizer, chat template …).
    pub fn gguf(&self) -> &GgufFile {
        &self.file
    }

    /// The mapped GGUF, shared (a DFlash drafter binds the target's embedding and head from it).
    pub(crate) fn gguf_arc(&self) -> Arc<GgufFile> {
        self.file.clone()
    }

    /// Load-time warnings (unused tensors).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The backend running the model.
    pub fn backend(&self) -> &CpuBackend {
        &self.backend
    }

    /// Vocabulary size (width of a logits row).
    pub fn n_vocab(&self) -> usize {
        self.hparams.n_vocab
    }

    /// Moves the model to GPU `ordinal`: every tensor is uploaded once (`progress(bytes_done, bytes_total)`), and
    /// sessions created afterwards run on the GPU. Fails with a clear message when there is no driver or GPU.
    #[cfg(feature = "cuda")]
    pub fn use_cuda(
        &mut self,
        ordinal: usize,
        progress: Option<&mut dyn FnMut(u64, u64)>,
    ) -> Result<()> {
        self.cuda = Some(crate::cuda::CudaBackend::new(
            ordinal,
            &self.file,
            self.backend.flags(),
            progress,
        )?);
        Ok(())
    }

    /// The GPU backend, when the model was moved there with [`Model::use_cuda`].
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Option<&crate::cuda::CudaBackend> {
        self.cuda.as_ref()
    }

    /// Whether the model runs on a GPU ([`Model::use_cuda`]) rather than the host CPU.
    pub fn on_gpu(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.cuda.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// Times the GPU work of every forward pass from now on (`on`), or none (`kiln bench --draft`'s GPU
    /// columns). Does nothing on the CPU.
    pub fn set_gpu_timing(&self, on: bool) {
        #[cfg(feature = "cuda")]
        if let Some(c) = &self.cuda {
            c.device().set_pass_timing(on);
        }
        #[cfg(not(feature = "cuda"))]
        let _ = on;
    }

    /// GPU time of the passes since the last call, with [`Model::set_gpu_timing`] on; `None` on the CPU or
    /// with timing off.
    pub fn take_gpu_time(&self) -> Result<Option<std::time::Duration>> {
        #[cfg(feature = "cuda")]
        if let Some(c) = &self.cuda {
            return c
                .device()
                .take_pass_time()
                .map_err(|e| Error::Device(e.to_string()));
        }
        Ok(None)
    }

    /// Runs one token through the model on the CPU, so that the work its kernels do at first use (repacking
    /// the weights for the interleaved kernels) is done now, not in the first request's time. Does nothing on
    /// the GPU, whose weights were repacked at upload.
    pub fn warm_up(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if self.cuda.is_some() {
            return Ok(());
        }
        let cfg = crate::SessionConfig {
            n_ctx: 1,
            n_slots: 1,
            batch: 1,
            ..Default::default()
        };
        crate::Session::new(self, cfg)?.decode_argmax(0, 0)?;
        Ok(())
    }

    /// Whether passes marked [`crate::Batch::prefill`] run on other kernels than decode rows (CUDA's prefill
    /// kernels: tensor-core or cuBLAS matmuls, flash attention), so a scheduler gives prompt chunks passes of
    /// their own. The CPU computes every row the same way in any pass.
    pub fn has_prefill_kernels(&self) -> bool {
        #[cfg(feature = "cuda")]
        if self.cuda.is_some() {
            let f = self.backend.flags();
            return f.quant_act && (f.cuda_prefill_mma || f.cuda_flash_attn || f.cuda_prefill_blas);
        }
        false
    }

    /// Runs the architecture's forward pass over one batch.
    pub(crate) fn forward<B: crate::backend::Backend>(
        &self,
        p: &mut Pass<B>,
        tokens: &[u32],
        logit_rows: &[usize],
    ) -> Result<()> {
        match &self.net {
            Net::Llama(m) => m.forward(p, tokens, logit_rows),
            Net::Qwen3(m) => m.forward(p, tokens, logit_rows),
            Net::Qwen3Moe(m) => m.forward(p, tokens, logit_rows),
        }
    }
}

/// Touches every page of the tensor data once, so loading (not the first token) pays for reading the file,
/// reporting progress as it goes.
fn prefault(file: &GgufFile, cb: &mut dyn FnMut(u64, u64)) {
    let total: u64 = file.tensors().iter().map(|t| t.size).sum();
    let mut done = 0u64;
    let mut sink = 0u8;
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        for chunk in bytes.chunks(1 << 20) {
            for page in chunk.chunks(4096) {
                sink ^= page[0];
            }
            done += chunk.len() as u64;
            cb(done, total);
        }
    }
    std::hint::black_box(sink);
    cb(total, total);
}
