//! The DFlash drafter: weights from a z-lab directory (`config.json` + `model.safetensors`) or a converted GGUF,
//! and its forward pass exactly as the reference `dflash` package (0.1.0) defines it:
//!
//! - context features (the target's hidden states after each tapped layer, concatenated per token) → `fc` →
//!   `hidden_norm`; they skip the drafter's layernorms and MLP and only feed each layer's K/V projections;
//! - the block `[anchor, MASK × (B−1)]` is embedded with the target's embedding table (× `input_embedding_scale`);
//! - every layer: `input_layernorm` → Q from the block only, K/V = [proj(context); proj(block)], QK-norm, NEOX
//!   RoPE at absolute positions, attention non-causal over context + the whole block (a sliding-window layer:
//!   causal, and only positions less than `sliding_window` away; [`crate::BlockAttn`]), `o_proj`, residual,
//!   `post_attention_layernorm` → SwiGLU MLP → residual; then `norm`;
//! - draft logits = the target's output head applied to the normed hidden states (no target output norm),
//!   × `output_multiplier`, optionally soft-capped.
//!
//! The forward is written once against the [`Backend`] ops, so the drafter runs where its target runs: on the
//! CPU, or, when the target was moved to a GPU, on a GPU backend holding the drafter's tensors and the target's
//! output head. The context's K/V live in a KV cache ([`DraftState`]); the block's are written after them each
//! round and overwritten by the next. Matrices run in the type they are stored in (a converted GGUF may hold
//! Q8_0; a z-lab directory's bf16 tensors are widened to f32), norms in f32.

use super::config::DraftConfig;
use super::gguf::{CONFIG_KEY, DRAFT_ARCH};
use crate::backend::{AttnParams, AttnRow, Backend, KvLayout, KvType, RopeMode, RopeParams};
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::models::Model;
use crate::weights::{Binder, Weight};
use kiln_gguf::GgufFile;
use kiln_quant::GgmlType;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

struct Layer {
    input_norm: Weight,
    post_norm: Weight,
    q: Weight,
    k: Weight,
    v: Weight,
    o: Weight,
    q_norm: Weight,
    k_norm: Weight,
    gate: Weight,
    up: Weight,
    down: Weight,
}

/// A loaded drafter bound to its target's embedding table and output head.
pub struct Drafter {
    cfg: DraftConfig,
    fc: Weight,
    hidden_norm: Weight,
    norm: Weight,
    layers: Vec<Layer>,
    embd: Weight,
    head: Weight,
    /// A host drafter's 4-bit copy of `head` for its proposals when `head` is 8 bits or wider ([`CpuBackend::requantized`],
    /// [`Drafter::rescore`]; `KILN_NO_DRAFT_HEAD_Q4` proposes from `head` itself).
    draft_head: Option<Weight>,
    /// A host drafter's proposing pass finishes its last layer on the drafted rows only ([`Drafter::block_rows`];
    /// `KILN_NO_DRAFT_PRUNE` runs every row through).
    prune: bool,
    /// Drafts proposed per round at most (block size − 1 unless [`Drafter::set_max_drafts`] lowers it): the block
    /// still has all its rows, only the first ones are proposed and verified.
    max_drafts: usize,
    /// With [`Drafter::set_auto_drafts`]: the chooser of the drafts a round (at most `max_drafts`), kept across
    /// generations so a server or a benchmark's later runs start from what the earlier ones measured.
    auto: Option<std::sync::Mutex<super::adaptive::DraftLength>>,
    /// Whether auto rounds on the host are cut by the drafts' margins (`KILN_NO_DRAFT_MARGINS` turns it off).
    margin_cuts: bool,
    /// The GPU backend holding the drafter's tensors and the target's head, when the target runs on a GPU.
    #[cfg(feature = "cuda")]
    gpu: Option<crate::cuda::CudaBackend>,
    /// The GPU drafter's passes are marked prefill and its matmuls of any row count take cuBLAS
    /// (`KILN_NO_CUDA_DRAFTER_BLAS` turns it off, and an all-Q8_0 drafter does not take it:
    /// `KILN_NO_CUDA_DRAFTER_Q8`; the proposals' bits matter only to the acceptance count).
    #[cfg(feature = "cuda")]
    gpu_blas: bool,
    /// A GPU drafter takes its context features from the target's tapped states on the device
    /// ([`Drafter::append_context_device`]; `KILN_NO_CUDA_DEVICE_TAPS` sends them through the host).
    #[cfg(feature = "cuda")]
    device_taps: bool,
    /// The block's QK-norm, RoPE, K/V store and attention as one backend op ([`Backend::attention_block`]), and
    /// the context rows' k_norm, RoPE and store too ([`Backend::kv_store_block`]): fused on a GPU;
    /// `KILN_NO_CUDA_DRAFTER_FUSED_ATTN` takes them one by one.
    fused_attn: bool,
}

impl std::fmt::Debug for Drafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Drafter({:?})", self.cfg)
    }
}

/// Activation buffers of one drafter forward, sized for a block of `rows` rows.
struct Scratch<B: Backend> {
    x: B::Buf,
    xn: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    /// K and V of the pruned last layer's query rows (`Drafter::block_rows`).
    k_rows: B::Buf,
    v_rows: B::Buf,
    attn: B::Buf,
    tmp: B::Buf,
    gate: B::Buf,
    up: B::Buf,
    act: B::Buf,
    feat: B::Buf,
    hidden: B::Buf,
    logits: B::Buf,
    /// The block's rows after its first, `rows − 1` mask embeddings (scaled), the same every round: written once,
    /// copied into `x` by each block pass.
    masks: B::Buf,
}

impl<B: Backend> Scratch<B> {
    fn new(be: &B, c: &DraftConfig, rows: usize) -> Result<Scratch<B>> {
        let (h, qd, kvd) = (c.hidden, c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let fw = c.target_layer_ids.len() * h;
        Ok(Scratch {
            x: be.alloc(rows * h)?,
            xn: be.alloc(rows * h)?,
            q: be.alloc(rows * qd)?,
            k: be.alloc(rows * kvd)?,
            v: be.alloc(rows * kvd)?,
            k_rows: be.alloc(rows * kvd)?,
            v_rows: be.alloc(rows * kvd)?,
            attn: be.alloc(rows * qd)?,
            tmp: be.alloc(rows * h)?,
            gate: be.alloc(rows * c.n_ff)?,
            up: be.alloc(rows * c.n_ff)?,
            act: be.alloc(rows * c.n_ff)?,
            feat: be.alloc(rows * fw)?,
            hidden: be.alloc(rows * h)?,
            logits: be.alloc(rows * c.vocab)?,
            masks: be.alloc(rows.saturating_sub(1).max(1) * h)?,
        })
    }
}

/// Where a sequence's drafter state lives.
enum Exec {
    Cpu {
        kv: crate::cpu::CpuKv,
        sc: Box<Scratch<CpuBackend>>,
    },
    #[cfg(feature = "cuda")]
    Cuda {
        kv: kiln_cuda::DKv,
        sc: Box<Scratch<crate::cuda::CudaBackend>>,
    },
}

/// One sequence's drafter state: the context K/V of every layer (positions `0..len`) and the buffers of a round.
pub struct DraftState {
    len: usize,
    capacity: usize,
    exec: Exec,
    /// The last proposal's draft margins (top-1 minus second head logit) when it was scored
    /// ([`Drafter::scores_drafts`]), else empty.
    margins: Vec<f32>,
}

impl std::fmt::Debug for DraftState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DraftState({} of {} positions)", self.len, self.capacity)
    }
}

impl DraftState {
    /// Context positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no context is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The last proposal's draft margins, in order, when it was scored ([`Drafter::scores_drafts`]); else empty.
    pub fn margins(&self) -> &[f32] {
        &self.margins
    }
}

/// Tensors by name: shape and values widened to f32.
pub(crate) type TensorMap = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads the tensors of a safetensors file as f32, by name.
pub(crate) fn read_safetensors(path: &Path) -> Result<TensorMap> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::Config(format!("{}: not a safetensors file: {e}", path.display())))?;
    let mut out = HashMap::new();
    for (name, t) in st.tensors() {
        let d = t.data();
        let vals: Vec<f32> = match t.dtype() {
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => {
                return Err(Error::Config(format!(
                    "{}: tensor '{name}' has dtype {other:?} (bf16, f16 or f32 expected)",
                    path.display()
                )))
            }
        };
        out.insert(name, (t.shape().to_vec(), vals));
    }
    Ok(out)
}

/// A drafter's tensors as a GGUF in memory, from a z-lab directory's map: norms in f32, matrices in `matrix_ty`
/// (f32 on the CPU, exact for a bf16 checkpoint; bf16 for a GPU, also exact and half the bytes to read).
fn map_to_gguf(config_json: &str, map: &TensorMap, matrix_ty: GgmlType) -> Result<GgufFile> {
    let mut names: Vec<&String> = map.keys().collect();
    names.sort();
    let ty = |name: &str| {
        if map[name].0.len() == 2 {
            matrix_ty
        } else {
            GgmlType::F32
        }
    };
    let mut w = kiln_gguf::GgufWriter::new();
    w.add("general.architecture", DRAFT_ARCH)?;
    w.add(CONFIG_KEY, config_json)?;
    for name in &names {
        let shape: Vec<u64> = map[*name].0.iter().rev().map(|&d| d as u64).collect();
        w.add_tensor(name, ty(name), &shape)?;
    }
    let mut dw = w.begin(Vec::new())?;
    for name in names {
        let (shape, vals) = &map[name];
        let t = ty(name);
        let rows: usize = shape.iter().rev().skip(1).product();
        let row_bytes = t
            .row_bytes(*shape.last().unwrap_or(&0) as u64)
            .ok_or_else(|| Error::Config(format!("draft tensor '{name}': row length for {t}")))?;
        let mut bytes = vec![0u8; rows * row_bytes as usize];
        kiln_quant::quantize(t, vals, &mut bytes).map_err(|e| Error::Quant {
            name: name.clone(),
            error: e.to_string(),
        })?;
        dw.write_tensor_data(name, &bytes)?;
    }
    Ok(GgufFile::from_bytes(dw.finish()?)?)
}

/// Tokens of a draft row scored again with the exact head after the compact head's pass ([`Drafter::rescore`]).
const RESCORE: usize = 8;

/// The indices of the `k` largest values of `row` (NaNs never taken), in no particular order. A chunk of 64
/// values is looked into only when its largest beats the `k`-th largest so far (one vector pass over the rest).
fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut top: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    let mut floor = f32::NEG_INFINITY;
    for (ci, chunk) in row.chunks(64).enumerate() {
        let mut lanes = [f32::NEG_INFINITY; 8];
        let mut groups = chunk.chunks_exact(8);
        for g in &mut groups {
            for (m, &x) in lanes.iter_mut().zip(g) {
                *m = if x > *m { x } else { *m };
            }
        }
        let most = groups
            .remainder()
            .iter()
            .chain(&lanes)
            .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
        // `most` and `floor` are never NaN (NaNs lose every comparison above).
        if top.len() == k && most <= floor {
            continue;
        }
        for (j, &x) in chunk.iter().enumerate() {
            if x.is_nan() || top.len() == k && x <= floor {
                continue;
            }
            let at = top.partition_point(|&(y, _)| y >= x);
            top.insert(at, (x, (ci * 64 + j) as u32));
            top.truncate(k);
            if top.len() == k {
                floor = top[k - 1].0;
            }
        }
    }
    top.into_iter().map(|(_, i)| i).collect()
}

/// Binds a drafter tensor, naming it as a draft tensor in errors.
fn bind(b: &mut Binder, name: &str, shape: &[u64]) -> Result<Weight> {
    b.req(name, shape).map_err(|e| match e {
        Error::MissingTensor { name, expected } => Error::MissingTensor {
            name: format!("draft {name}"),
            expected,
        },
        Error::TensorShape {
            name,
            actual,
            expected,
        } => Error::TensorShape {
            name: format!("draft {name}"),
            actual,
            expected,
        },
        other => other,
    })
}

/// Whether the drafter runs on its target's GPU: when the target runs on one, unless `KILN_NO_CUDA_DRAFTER` or a
/// layer is causal or has a sliding window, which the GPU's block attention does not take (that drafter runs on
/// the CPU, its target on the GPU).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn gpu_drafter(cfg: &DraftConfig, target: &Model) -> bool {
    #[cfg(feature = "cuda")]
    return target.cuda().is_some_and(|cuda| {
        target.backend().flags().cuda_drafter
            && (cuda.block_masks() || cfg.layer_attn.iter().all(|&a| a == crate::BlockAttn::FULL))
    });
    #[cfg(not(feature = "cuda"))]
    false
}

impl Drafter {
    /// Loads the drafter at `path` — a z-lab directory, or a GGUF written by [`super::convert_to_gguf`] — and
    /// binds it to `target` (validated against it). When `target` runs on a GPU, the drafter's tensors and the
    /// target's output head are uploaded to the same GPU and the drafter runs there.
    pub fn load(path: impl AsRef<Path>, target: &Model) -> Result<Drafter> {
        let path = path.as_ref();
        let file = if path.is_file() {
            let file = GgufFile::open(path)?;
            let arch = file.metadata().get_str("general.architecture")?;
            if arch != DRAFT_ARCH {
                return Err(Error::Config(format!(
                    "{}: general.architecture is '{arch}', not a converted DFlash drafter ('{DRAFT_ARCH}')",
                    path.display()
                )));
            }
            file
        } else {
            let cfg_path = path.join("config.json");
            let text = std::fs::read_to_string(&cfg_path)
                .map_err(|e| Error::Config(format!("{}: {e}", cfg_path.display())))?;
            let matrix_ty = if gpu_drafter(&DraftConfig::parse(&text)?, target) {
                GgmlType::BF16
            } else {
                GgmlType::F32
            };
            map_to_gguf(
                &text,
                &read_safetensors(&path.join("model.safetensors"))?,
                matrix_ty,
            )?
        };
        let cfg = DraftConfig::parse(file.metadata().get_str(CONFIG_KEY)?)?;
        cfg.validate_target(target.hparams())?;
        Drafter::bind(cfg, Arc::new(file), target)
    }

    fn bind(cfg: DraftConfig, file: Arc<GgufFile>, target: &Model) -> Result<Drafter> {
        let mut b = Binder::new(file.clone());
        let (h, ff, hd) = (cfg.hidden as u64, cfg.n_ff as u64, cfg.head_dim as u64);
        let (qd, kvd) = (cfg.n_head as u64 * hd, cfg.n_head_kv as u64 * hd);
        let layers = (0..cfg.n_layer)
            .map(|i| {
                let n = |s: &str| format!("layers.{i}.{s}.weight");
                Ok(Layer {
                    input_norm: bind(&mut b, &n("input_layernorm"), &[h])?,
                    post_norm: bind(&mut b, &n("post_attention_layernorm"), &[h])?,
                    q: bind(&mut b, &n("self_attn.q_proj"), &[h, qd])?,
                    k: bind(&mut b, &n("self_attn.k_proj"), &[h, kvd])?,
                    v: bind(&mut b, &n("self_attn.v_proj"), &[h, kvd])?,
                    o: bind(&mut b, &n("self_attn.o_proj"), &[qd, h])?,
                    q_norm: bind(&mut b, &n("self_attn.q_norm"), &[hd])?,
                    k_norm: bind(&mut b, &n("self_attn.k_norm"), &[hd])?,
                    gate: bind(&mut b, &n("mlp.gate_proj"), &[h, ff])?,
                    up: bind(&mut b, &n("mlp.up_proj"), &[h, ff])?,
                    down: bind(&mut b, &n("mlp.down_proj"), &[ff, h])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let fw = cfg.target_layer_ids.len() as u64 * h;
        let fc = bind(&mut b, "fc.weight", &[fw, h])?;
        let hidden_norm = bind(&mut b, "hidden_norm.weight", &[h])?;
        let norm = bind(&mut b, "norm.weight", &[h])?;
        let unused = b.finish();
        if let Some(first) = file
            .tensors()
            .iter()
            .map(|t| &t.name)
            .find(|n| unused.iter().any(|u| u.contains(&format!("'{n}'"))))
        {
            return Err(Error::Unsupported(format!(
                "draft tensor '{first}' is not part of a DFlash drafter ({} unexpected tensors)",
                unused.len()
            )));
        }
        for (name, w) in layers
            .iter()
            .flat_map(|l| [&l.input_norm, &l.post_norm, &l.q_norm, &l.k_norm])
            .chain([&hidden_norm, &norm])
            .map(|w| (&w.name, w))
        {
            if w.ty != GgmlType::F32 {
                return Err(Error::TensorType {
                    name: format!("draft {name}"),
                    ty: w.ty,
                    usage: "a norm weight (f32)",
                });
            }
        }
        let hp = target.hparams();
        let mut tb = Binder::new(target.gguf_arc());
        let (d, nv) = (hp.n_embd as u64, hp.n_vocab as u64);
        let embd = tb.req("token_embd.weight", &[d, nv])?;
        let head = tb
            .opt("output.weight", &[d, nv])?
            .unwrap_or_else(|| embd.clone());
        let compact = target.backend().flags().draft_head_q4
            && target.backend().flags().quant_act
            && !gpu_drafter(&cfg, target)
            && matches!(
                head.ty,
                GgmlType::Q8_0 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F32
            );
        let draft_head = if compact {
            // A round reads the whole head for its few rows, about half of the round's draft time with a Q8_0
            // head; the copy reads half those bytes, and `rescore` keeps the head's own proposals.
            Some(target.backend().requantized(&head, GgmlType::Q4_0)?)
        } else {
            None
        };
        #[cfg(feature = "cuda")]
        let gpu = match target.cuda() {
            Some(t) if gpu_drafter(&cfg, target) => {
                let mut tensors: Vec<(&GgufFile, &kiln_gguf::TensorInfo)> =
                    file.tensors().iter().map(|t| (&*file, t)).collect();
                let tf = target.gguf();
                let head_info = tf.tensor(&head.name).ok_or_else(|| {
                    Error::Device(format!("target head '{}' not found", head.name))
                })?;
                tensors.push((tf, head_info));
                // The bf16 copies only where the drafter's cuBLAS path will read them. A drafter of Q8_0
                // matrices reads its own bytes on the Q8_0 block kernel instead: half a copy's.
                let mut flags = target.backend().flags();
                let q8_blocks = flags.cuda_drafter_q8
                    && file
                        .tensors()
                        .iter()
                        .filter(|t| t.shape.len() >= 2)
                        .all(|t| t.ty == GgmlType::Q8_0 && t.shape[0].is_multiple_of(256));
                flags.cuda_prefill_blas &= flags.cuda_drafter_blas && !q8_blocks;
                let mut g =
                    crate::cuda::CudaBackend::from_tensors(t.ordinal(), &tensors, flags, None)?;
                g.device().set_q8_blocks(q8_blocks);
                // A K-quant head is read quantized by the block kernel (its bytes, under half the bf16
                // copy's), not on cuBLAS with the drafter's layers.
                if flags.cuda_draft_head_k8 {
                    g.keep_quantized(&head.name);
                }
                Some(g)
            }
            _ => None,
        };
        // Where bf16 copies were made (cuBLAS on, not the reference mode, memory to spare) every matmul takes them.
        #[cfg(feature = "cuda")]
        let gpu_blas = gpu.as_ref().is_some_and(|g| {
            let on = g.device().dense_bytes() > 0;
            if on {
                g.device().set_blas_min_rows(1);
            }
            on
        });
        Ok(Drafter {
            max_drafts: cfg.block_size - 1,
            auto: None,
            margin_cuts: target.backend().flags().draft_margins,
            cfg,
            fc,
            hidden_norm,
            norm,
            layers,
            embd,
            head,
            draft_head,
            prune: target.backend().flags().draft_prune,
            #[cfg(feature = "cuda")]
            gpu,
            #[cfg(feature = "cuda")]
            gpu_blas,
            #[cfg(feature = "cuda")]
            device_taps: target.backend().flags().cuda_device_taps,
            fused_attn: target.backend().flags().cuda_drafter_fused_attn,
        })
    }

    /// Whether a host drafter proposes from a Q4_0 copy of its head, the copy's likeliest tokens scored again with
    /// the head (`KILN_NO_DRAFT_HEAD_Q4` turns it off; only for heads of 8 bits or more).
    pub fn has_compact_head(&self) -> bool {
        self.draft_head.is_some()
    }

    /// The GPU backend of a state that lives on the GPU.
    #[cfg(feature = "cuda")]
    fn gpu(&self) -> Result<&crate::cuda::CudaBackend> {
        self.gpu
            .as_ref()
            .ok_or_else(|| Error::Device("a GPU drafter state without the drafter's GPU".into()))
    }

    /// Proposes at most `k` drafts a round (1 ≤ k < block size). The drafter still runs its whole block (the
    /// proposals are the ones it makes with every mask row present, as it was trained), but only rows 1..=k go
    /// through the LM head and the verify forward: where verifying a row costs about what it is likely to gain
    /// (a compute-bound CPU at a modest τ), a shorter verify block is faster. Output is unchanged.
    pub fn set_max_drafts(&mut self, k: usize) -> Result<()> {
        let b = self.cfg.block_size;
        if k == 0 || k >= b {
            return Err(Error::Config(format!(
                "at most {k} drafts a round: the drafter's block of {b} proposes 1 to {}",
                b - 1
            )));
        }
        self.max_drafts = k;
        if self.auto.is_some() {
            self.set_auto_drafts(true);
        }
        Ok(())
    }

    /// With `on`, each round verifies the number of drafts (1 to [`Drafter::max_drafts`]) that measured fastest so
    /// far: running estimates of each block position's acceptance and of a round's wall time for each count
    /// (dflash/adaptive.rs). Forced runs ([`crate::dflash::Forced`]) keep every draft. Output is unchanged.
    pub fn set_auto_drafts(&mut self, on: bool) {
        self.auto =
            on.then(|| std::sync::Mutex::new(super::adaptive::DraftLength::new(self.max_drafts)));
    }

    /// The drafts-a-round chooser, when [`Drafter::set_auto_drafts`] is on.
    pub(crate) fn auto_drafts(
        &self,
    ) -> Option<std::sync::MutexGuard<'_, super::adaptive::DraftLength>> {
        // A chooser left by a panicking holder is still a set of counts and means: take it.
        self.auto
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether proposals for `st` come with their margins ([`DraftState::margins`]): with the auto chooser on, where
    /// the head's logits are on the host (a drafter on the CPU), so its cuts cost no transfer.
    pub fn scores_drafts(&self, st: &DraftState) -> bool {
        self.margin_cuts && self.auto.is_some() && matches!(st.exec, Exec::Cpu { .. })
    }

    /// Times the GPU work of the drafter's passes from now on (`on`), or none; nothing for a drafter on the CPU.
    pub fn set_gpu_timing(&self, on: bool) {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            g.device().set_pass_timing(on);
        }
        #[cfg(not(feature = "cuda"))]
        let _ = on;
    }

    /// GPU time of the drafter's passes since the last call, with [`Drafter::set_gpu_timing`] on; `None` for a
    /// drafter on the CPU or with timing off.
    pub fn take_gpu_time(&self) -> Result<Option<std::time::Duration>> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            return g
                .device()
                .take_pass_time()
                .map_err(|e| Error::Device(e.to_string()));
        }
        Ok(None)
    }

    /// Drafts proposed per round at most.
    pub fn max_drafts(&self) -> usize {
        self.max_drafts
    }

    /// The configuration.
    pub fn config(&self) -> &DraftConfig {
        &self.cfg
    }

    /// A fresh per-sequence state for up to `positions` context positions (the target slot's size); the
    /// cache also holds a block after them.
    pub fn new_state(&self, be: &CpuBackend, positions: usize) -> Result<DraftState> {
        let c = &self.cfg;
        let capacity = positions + c.block_size;
        let layout = |ty| KvLayout {
            n_layer: c.n_layer,
            n_slots: 1,
            slot_ctx: capacity,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            ty,
        };
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            // Attention scratch sized now: the drafter's passes are captured as graphs, which may not allocate.
            g.device()
                .reserve_attention(c.block_size, c.n_head, c.head_dim, capacity)
                .map_err(|e| Error::Device(e.to_string()))?;
            g.device()
                .reserve_dense(c.block_size)
                .map_err(|e| Error::Device(e.to_string()))?;
            // f16: the GPU's split-KV attention reads f16 caches.
            let mut sc = Box::new(Scratch::new(g, c, c.block_size)?);
            g.write(&mut sc.masks, &self.mask_rows(be)?)?;
            return Ok(DraftState {
                len: 0,
                capacity,
                margins: Vec::new(),
                exec: Exec::Cuda {
                    kv: g.alloc_kv(&layout(KvType::F16))?,
                    sc,
                },
            });
        }
        let mut sc = Box::new(Scratch::new(be, c, c.block_size)?);
        be.write(&mut sc.masks, &self.mask_rows(be)?)?;
        Ok(DraftState {
            len: 0,
            capacity,
            margins: Vec::new(),
            exec: Exec::Cpu {
                kv: be.alloc_kv(&layout(KvType::F32))?,
                sc,
            },
        })
    }

    /// Embeddings (times `input_embedding_scale`) of `tokens` from the target's table, on the host.
    fn embed_rows(&self, be: &CpuBackend, tokens: &[u32]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let mut x = vec![0f32; tokens.len() * c.hidden];
        be.embed(&mut x, &self.embd, tokens)?;
        if c.input_embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.input_embedding_scale);
        }
        Ok(x)
    }

    /// A block's rows after its first: `block_size − 1` mask embeddings.
    fn mask_rows(&self, be: &CpuBackend) -> Result<Vec<f32>> {
        let c = &self.cfg;
        Ok(self
            .embed_rows(be, &[c.mask_token_id])?
            .repeat(c.block_size.saturating_sub(1)))
    }

    /// Width of one token's context features (`taps × hidden`).
    pub fn feature_width(&self) -> usize {
        self.cfg.target_layer_ids.len() * self.cfg.hidden
    }

    fn attn(&self) -> (AttnParams, RopeParams) {
        let c = &self.cfg;
        (
            AttnParams {
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim: c.head_dim,
                scale: 1.0 / (c.head_dim as f32).sqrt(),
            },
            RopeParams {
                mode: RopeMode::Neox,
                theta: c.rope_theta,
                freq_scale: 1.0,
            },
        )
    }

    /// Context rows `start..start + n` from features already in `sc.feat`: fc, hidden_norm, then every layer's
    /// k_proj/k_norm/RoPE and v_proj into the cache.
    fn context_rows<B: Backend>(
        &self,
        be: &B,
        kv: &mut B::Kv,
        sc: &mut Scratch<B>,
        start: usize,
        n: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        let (p, rope) = self.attn();
        let (rows, positions) = rows_at(start, n);
        be.matmul(&mut sc.xn, &self.fc, &sc.feat, n)?;
        be.rms_norm_inplace(&mut sc.xn, &self.hidden_norm, n, c.hidden, c.rms_eps)?;
        for (il, l) in self.layers.iter().enumerate() {
            be.matmul_many(&mut [&mut sc.k, &mut sc.v], &[&l.k, &l.v], &sc.xn, n)?;
            // k_norm, RoPE and the store as one op (one launch on a GPU).
            let (k, v, k_norm) = (&mut sc.k, &sc.v, (&l.k_norm, c.rms_eps));
            if self.fused_attn {
                be.kv_store_block(kv, il, k, v, &rows, &positions, &p, &rope, k_norm)?;
            } else {
                crate::backend::unfused_kv_store_block(
                    be, kv, il, k, v, &rows, &positions, &p, &rope, k_norm,
                )?;
            }
        }
        Ok(())
    }

    /// The block of `n` rows whose embeddings are in `sc.x`, at positions `start..start + n` after the context:
    /// leaves the normed hidden states in `sc.hidden`, of every row, or with `only` > 0 of rows `1..=only` alone
    /// (in `sc.hidden`'s first `only` rows). Pruned (`Drafter::prune`), the last layer takes the other rows only as
    /// far as their K and V, which the kept rows' attention reads (its queries: the kept rows and the last); each
    /// kept row's numbers are those of the whole block, as a row's attention reads only its own query and the
    /// cache, and every op after it works row by row (the host's kernels give a row the same bits in any batch).
    #[allow(clippy::too_many_arguments)]
    fn block_rows<B: Backend>(
        &self,
        be: &B,
        kv: &mut B::Kv,
        sc: &mut Scratch<B>,
        start: usize,
        n: usize,
        only: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        let (p, rope) = self.attn();
        let (rows, positions) = rows_at(start, n);
        let last = self.layers.len() - 1;
        let kept: Vec<usize> = (1..=only).collect();
        let mut n = n;
        for (il, l) in self.layers.iter().enumerate() {
            be.rms_norm(&mut sc.xn, &sc.x, &l.input_norm, n, c.hidden, c.rms_eps)?;
            be.matmul_many(
                &mut [&mut sc.q, &mut sc.k, &mut sc.v],
                &[&l.q, &l.k, &l.v],
                &sc.xn,
                n,
            )?;
            let pruned = il == last && only > 0 && self.prune;
            if pruned {
                // Every row's K and V into the cache, then attention for the kept rows and the block's last
                // (whose position ends the visible window) alone, into `sc.q`: the kept rows' outputs first.
                // (The host's attention places each row by its position; a GPU drafter passes `only` = 0.)
                be.rms_norm_inplace(&mut sc.q, &l.q_norm, n * c.n_head, c.head_dim, c.rms_eps)?;
                be.rms_norm_inplace(&mut sc.k, &l.k_norm, n * c.n_head_kv, c.head_dim, c.rms_eps)?;
                be.rope(&mut sc.q, &positions, c.n_head, c.head_dim, &rope)?;
                be.rope(&mut sc.k, &positions, c.n_head_kv, c.head_dim, &rope)?;
                be.kv_store(kv, il, &sc.k, &sc.v, &rows)?;
                let mut sel = kept.clone();
                if n - 1 > only {
                    sel.push(n - 1);
                }
                let sel_rows: Vec<AttnRow> = sel.iter().map(|&i| rows[i]).collect();
                let (qd, kvd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
                be.gather_rows(&mut sc.attn, &sc.q, &sel, qd)?;
                be.gather_rows(&mut sc.k_rows, &sc.k, &sel, kvd)?;
                be.gather_rows(&mut sc.v_rows, &sc.v, &sel, kvd)?;
                be.attention_visible(
                    &mut sc.q,
                    &sc.attn,
                    &sc.k_rows,
                    &sc.v_rows,
                    kv,
                    il,
                    &sel_rows,
                    start + n,
                    c.layer_attn[il],
                    &p,
                )?;
                keep_rows(be, sc, &kept, c.hidden)?;
                n = only;
            } else {
                // QK-norm, RoPE, the K/V store and the attention as one op (two launches on a GPU).
                let (qk_norm, visible) = (
                    Some((&l.q_norm, &l.k_norm, c.rms_eps)),
                    Some((start + n, c.layer_attn[il])),
                );
                let (sa, q, k) = (&mut sc.attn, &mut sc.q, &mut sc.k);
                if self.fused_attn {
                    be.attention_block(
                        sa, q, k, &sc.v, kv, il, &rows, &positions, &p, &rope, qk_norm, visible,
                    )?;
                } else {
                    crate::backend::unfused_attention_block(
                        be, sa, q, k, &sc.v, kv, il, &rows, &positions, &p, &rope, qk_norm, visible,
                    )?;
                }
            }
            let attn = if pruned { &sc.q } else { &sc.attn };
            be.matmul_add(&mut sc.x, &l.o, attn, &mut sc.tmp, n)?;
            be.rms_norm(&mut sc.xn, &sc.x, &l.post_norm, n, c.hidden, c.rms_eps)?;
            be.matmul_many(
                &mut [&mut sc.gate, &mut sc.up],
                &[&l.gate, &l.up],
                &sc.xn,
                n,
            )?;
            be.swiglu(&mut sc.act, &sc.gate, &sc.up, n * c.n_ff)?;
            be.matmul_add(&mut sc.x, &l.down, &sc.act, &mut sc.tmp, n)?;
        }
        if n > only && only > 0 {
            keep_rows(be, sc, &kept, c.hidden)?;
            n = only;
        }
        be.rms_norm(&mut sc.hidden, &sc.x, &self.norm, n, c.hidden, c.rms_eps)
    }

    /// Appends context features (`rows × feature_width`, tokens at positions `st.len()..`) to `st`.
    pub fn append_context(
        &self,
        be: &CpuBackend,
        st: &mut DraftState,
        features: &[f32],
    ) -> Result<()> {
        let fw = self.feature_width();
        if !features.len().is_multiple_of(fw) {
            return Err(Error::Batch(format!(
                "draft context features: {} values are not whole rows of {fw}",
                features.len()
            )));
        }
        let n = features.len() / fw;
        self.check_room(st, n)?;
        // In chunks of the block size, the rows the scratch holds.
        for (ci, chunk) in features.chunks(self.cfg.block_size * fw).enumerate() {
            let m = chunk.len() / fw;
            let start = st.len + ci * self.cfg.block_size;
            match &mut st.exec {
                Exec::Cpu { kv, sc } => {
                    be.write(&mut sc.feat, chunk)?;
                    self.context_rows(be, kv, sc, start, m)?;
                }
                #[cfg(feature = "cuda")]
                Exec::Cuda { kv, sc } => {
                    let g = self.gpu()?;
                    g.write(&mut sc.feat, chunk)?;
                    self.context_pass(g, kv, sc, start, m)?;
                }
            }
        }
        st.len += n;
        Ok(())
    }

    fn check_room(&self, st: &DraftState, n: usize) -> Result<()> {
        if st.len + n + self.cfg.block_size > st.capacity {
            return Err(Error::Batch(format!(
                "draft context of {} positions plus a block exceeds the state's {}",
                st.len + n,
                st.capacity
            )));
        }
        Ok(())
    }

    /// The context rows whose features are in `sc.feat`, as one GPU pass (a graph after its first time).
    #[cfg(feature = "cuda")]
    fn context_pass(
        &self,
        g: &crate::cuda::CudaBackend,
        kv: &mut kiln_cuda::DKv,
        sc: &mut Scratch<crate::cuda::CudaBackend>,
        start: usize,
        m: usize,
    ) -> Result<()> {
        let (rows, _) = rows_at(start, m);
        let toks = vec![0u32; m];
        let key = [sc.feat.id(), kv.id(), 0];
        g.pass(key, &toks, &rows, &[], true, self.gpu_blas, &mut || {
            self.context_rows(g, kv, sc, start, m)
        })
    }

    /// Whether [`Drafter::append_context_device`] takes this drafter's context: it runs on its target's GPU (its
    /// states live there), unless `KILN_NO_CUDA_DEVICE_TAPS`.
    pub(crate) fn takes_device_taps(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.device_taps && self.gpu.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// [`Drafter::append_context`] from the target's tapped hidden states on the same GPU
    /// ([`crate::Session::device_taps`]): the features of the pass's rows `start..start + n` are gathered on the
    /// device into the drafter's layout (rows × taps), so they never cross to the host. The two streams are
    /// ordered on the GPU: the copies wait for the target's pass, and the target's next pass (which rewrites the
    /// taps) for the copies.
    #[cfg(feature = "cuda")]
    pub(crate) fn append_context_device(
        &self,
        st: &mut DraftState,
        taps: &crate::session::DeviceTaps,
        start: usize,
        n: usize,
    ) -> Result<()> {
        let (layers, pass_rows) = (taps.layers, taps.rows);
        if start + n > pass_rows {
            return Err(Error::Batch(format!(
                "draft context: rows {start}..{} asked of a pass of {pass_rows}",
                start + n
            )));
        }
        self.check_room(st, n)?;
        let g = self.gpu()?;
        let Exec::Cuda { kv, sc } = &mut st.exec else {
            return Err(Error::Device(
                "device taps for a drafter state on the host".into(),
            ));
        };
        let (h, fw, b) = (self.cfg.hidden, self.feature_width(), self.cfg.block_size);
        let slots = self
            .cfg
            .target_layer_ids
            .iter()
            .map(|l| {
                layers
                    .iter()
                    .position(|x| x == l)
                    .ok_or_else(|| Error::Batch(format!("target layer {l} was not tapped")))
            })
            .collect::<Result<Vec<_>>>()?;
        let dev_err = |e: kiln_cuda::Error| Error::Device(e.to_string());
        g.device().wait_for(taps.dev).map_err(dev_err)?;
        for c0 in (0..n).step_by(b) {
            let m = (n - c0).min(b);
            for (t, &s) in slots.iter().enumerate() {
                let at = (s * pass_rows + start + c0) * h;
                g.device()
                    .copy_rows(&mut sc.feat, t * h, fw, taps.buf, at, h, m, h)
                    .map_err(dev_err)?;
            }
            if c0 + m == n {
                taps.dev.wait_for(g.device()).map_err(dev_err)?;
            }
            self.context_pass(g, kv, sc, st.len + c0, m)?;
        }
        st.len += n;
        Ok(())
    }

    /// Rolls the context back to `len` positions.
    pub fn truncate(&self, st: &mut DraftState, len: usize) {
        st.len = st.len.min(len);
    }

    /// Runs the block `[block]` at positions `st.len()..` and returns its normed hidden states
    /// (`block.len() × hidden`, on the host).
    pub fn block_hidden(
        &self,
        be: &CpuBackend,
        st: &mut DraftState,
        block: &[u32],
    ) -> Result<Vec<f32>> {
        let n = block.len();
        self.run_block(be, st, block, 0)?;
        let mut out = vec![0f32; n * self.cfg.hidden];
        match &st.exec {
            Exec::Cpu { sc, .. } => be.read(&sc.hidden, &mut out)?,
            #[cfg(feature = "cuda")]
            Exec::Cuda { sc, .. } => {
                let g = self.gpu()?;
                g.read(&sc.hidden, &mut out)?
            }
        }
        Ok(out)
    }

    /// The block forward; with `drafts` > 0, also the head over rows 1..=drafts and their argmax (in `sc.logits`,
    /// the ids returned). The block's embeddings are computed on the host (the target's table).
    fn run_block(
        &self,
        be: &CpuBackend,
        st: &mut DraftState,
        block: &[u32],
        drafts: usize,
    ) -> Result<Vec<u32>> {
        let c = &self.cfg;
        let n = block.len();
        if n == 0 || n > c.block_size || st.len + n > st.capacity {
            return Err(Error::Batch(format!(
                "draft block of {n} rows at position {} (block size {}, state of {} positions)",
                st.len, c.block_size, st.capacity
            )));
        }
        // The first row's embedding; a block of [anchor, MASK × (n − 1)] takes the rest from `sc.masks`.
        let masked = n > 1 && block[1..].iter().all(|&t| t == c.mask_token_id);
        let x = self.embed_rows(be, if masked { &block[..1] } else { block })?;
        let start = st.len;
        // Without a multiplier or soft-cap the draft is the argmax of the raw head logits, taken where they are
        // (either could round distinct logits into ties, so with them the host applies both first).
        let propose = drafts > 0;
        let on_device = propose && c.output_multiplier == 1.0 && c.softcap.is_none();
        let scored = propose && self.scores_drafts(st);
        st.margins.clear();
        match &mut st.exec {
            Exec::Cpu { kv, sc } => {
                be.write(&mut sc.x, &x)?;
                if masked {
                    be.copy_into(&mut sc.x, c.hidden, &sc.masks, (n - 1) * c.hidden)?;
                }
                be.run_pass(&mut || {
                    // Only the drafted rows' hidden states, in `sc.hidden`'s first rows.
                    self.block_rows(be, kv, sc, start, n, drafts)?;
                    if propose {
                        let head = self.draft_head.as_ref().unwrap_or(&self.head);
                        be.matmul(&mut sc.logits, head, &sc.hidden, drafts)?;
                    }
                    Ok(())
                })?;
                if !propose {
                    return Ok(Vec::new());
                }
                if self.draft_head.is_some() {
                    let mut hidden = vec![0f32; drafts * c.hidden];
                    be.read(&sc.hidden, &mut hidden)?;
                    let (ids, m) = self.rescore(be, &hidden, &sc.logits[..drafts * c.vocab])?;
                    if scored {
                        st.margins = m;
                    }
                    return Ok(ids);
                }
                if on_device {
                    let ids = be.argmax_rows(&sc.logits, drafts, c.vocab)?;
                    if scored {
                        st.margins = margins(&sc.logits[..drafts * c.vocab], &ids, c.vocab);
                    }
                    return Ok(ids);
                }
                let mut l = vec![0f32; drafts * c.vocab];
                be.read(&sc.logits, &mut l)?;
                let l = self.finish_logits(l);
                let ids: Vec<u32> = l.chunks_exact(c.vocab).map(argmax).collect();
                if scored {
                    st.margins = margins(&l, &ids, c.vocab);
                }
                Ok(ids)
            }
            #[cfg(feature = "cuda")]
            Exec::Cuda { kv, sc } => {
                let g = self.gpu()?;
                let (rows, _) = rows_at(start, n);
                let logit_rows: Vec<usize> = (1..=drafts).collect();
                g.write(&mut sc.x, &x)?;
                // (A block of other tokens, `block_hidden`'s, is a pass without the mask rows' copy.)
                let key = [sc.x.id(), kv.id(), !masked as u64];
                g.pass(
                    key,
                    block,
                    &rows,
                    &logit_rows,
                    true,
                    self.gpu_blas,
                    &mut || {
                        if masked {
                            g.copy_into(&mut sc.x, c.hidden, &sc.masks, (n - 1) * c.hidden)?;
                        }
                        self.block_rows(g, kv, sc, start, n, 0)?;
                        if propose {
                            g.gather_rows(&mut sc.tmp, &sc.hidden, &logit_rows, c.hidden)?;
                            g.matmul(&mut sc.logits, &self.head, &sc.tmp, drafts)?;
                        }
                        Ok(())
                    },
                )?;
                if !propose {
                    return Ok(Vec::new());
                }
                if on_device {
                    return g.argmax_rows(&sc.logits, drafts, c.vocab);
                }
                let mut l = vec![0f32; drafts * c.vocab];
                g.read(&sc.logits, &mut l)?;
                Ok(self
                    .finish_logits(l)
                    .chunks_exact(c.vocab)
                    .map(argmax)
                    .collect())
            }
        }
    }

    /// Proposals and their margins from the compact head's logits `approx` of the rows `hidden` (on the host):
    /// each row's [`RESCORE`] likeliest tokens by `approx` are scored again with the head itself (the bits its
    /// matmul gives), and the draft is their argmax: the head's own proposal unless that was not among them.
    fn rescore(
        &self,
        be: &CpuBackend,
        hidden: &[f32],
        approx: &[f32],
    ) -> Result<(Vec<u32>, Vec<f32>)> {
        let c = &self.cfg;
        let (mut ids, mut margins) = (Vec::new(), Vec::new());
        for (h, row) in hidden
            .chunks_exact(c.hidden)
            .zip(approx.chunks_exact(c.vocab))
        {
            let mut cand = top_k(row, RESCORE);
            cand.sort_unstable();
            let rows: Vec<usize> = cand.iter().map(|&t| t as usize).collect();
            let vals = self.finish_logits(be.matmul_rows_of(&self.head, &rows, h)?);
            let best = argmax(&vals);
            ids.push(cand[best as usize]);
            margins.extend(self::margins(&vals, &[best], vals.len()));
        }
        Ok((ids, margins))
    }

    /// `output_multiplier` and the soft-cap applied to raw head logits.
    fn finish_logits(&self, mut l: Vec<f32>) -> Vec<f32> {
        let c = &self.cfg;
        if c.output_multiplier != 1.0 {
            l.iter_mut().for_each(|v| *v *= c.output_multiplier);
        }
        if let Some(cap) = c.softcap {
            l.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
        l
    }

    /// Draft logits (`rows × vocab`) of hidden states from [`Drafter::block_hidden`]: the target's head,
    /// × `output_multiplier`, soft-capped when configured (on the host backend).
    pub fn logits(&self, be: &CpuBackend, hidden: &[f32]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let n = hidden.len() / c.hidden;
        let mut out = vec![0f32; n * c.vocab];
        be.matmul(&mut out, &self.head, &hidden.to_vec(), n)?;
        Ok(self.finish_logits(out))
    }

    /// Greedy proposals for the block `[anchor, MASK × (n − 1)]` at positions `st.len()..`: the argmax of the
    /// draft logits of rows 1..=k, k = min(n − 1, `want`, [`Drafter::max_drafts`]). `be` is the target's CPU
    /// backend (the block's embedding, and the whole forward when the drafter is not on a GPU).
    pub fn propose(
        &self,
        be: &CpuBackend,
        st: &mut DraftState,
        anchor: u32,
        n: usize,
        want: usize,
    ) -> Result<Vec<u32>> {
        let k = want.min(self.max_drafts).min(n.saturating_sub(1));
        if k == 0 {
            return Ok(Vec::new());
        }
        let mut block = vec![self.cfg.mask_token_id; n];
        block[0] = anchor;
        self.run_block(be, st, &block, k)
    }
}

/// Moves the rows `kept` of `sc.x` (`width` each) to its first rows, through `sc.xn`.
fn keep_rows<B: Backend>(be: &B, sc: &mut Scratch<B>, kept: &[usize], width: usize) -> Result<()> {
    be.gather_rows(&mut sc.xn, &sc.x, kept, width)?;
    be.copy_into(&mut sc.x, 0, &sc.xn, kept.len() * width)
}

/// The attention rows (slot 0) and positions of `n` rows from position `start`.
fn rows_at(start: usize, n: usize) -> (Vec<AttnRow>, Vec<usize>) {
    let positions: Vec<usize> = (start..start + n).collect();
    (
        positions
            .iter()
            .map(|&pos| AttnRow { slot: 0, pos })
            .collect(),
        positions,
    )
}

/// Each row's margin: its value at `ids[i]` (the row's top) minus the largest of the others (0 on a tie, NaN
/// values ignored).
fn margins(logits: &[f32], ids: &[u32], width: usize) -> Vec<f32> {
    logits
        .chunks_exact(width)
        .zip(ids)
        .map(|(row, &id)| {
            let (before, rest) = row.split_at(id as usize);
            let second = before
                .iter()
                .chain(&rest[1..])
                .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            rest[0] - second
        })
        .collect()
}

/// Index of the largest value (the first on ties, like torch.argmax on CPU).
pub(crate) fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::top_k;

    /// `top_k` against a full sort: rows of lengths around its 64-value chunks, ties, NaNs, ±inf.
    #[test]
    fn top_k_takes_the_largest_values() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for len in [1, 7, 8, 63, 64, 65, 200, 1000] {
            for k in [1, 3, 8] {
                let row: Vec<f32> = (0..len)
                    .map(|i| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        match s % 50 {
                            0 => f32::NAN,
                            1 => f32::INFINITY,
                            2 => f32::NEG_INFINITY,
                            3 => 0.5, // ties
                            _ => (s >> 40) as f32 / (1u64 << 24) as f32 - (i % 5) as f32,
                        }
                    })
                    .collect();
                let mut got: Vec<f32> = top_k(&row, k).iter().map(|&i| row[i as usize]).collect();
                let mut want: Vec<f32> = row.iter().copied().filter(|x| !x.is_nan()).collect();
                want.sort_by(|a, b| b.total_cmp(a));
                want.truncate(k);
                got.sort_by(|a, b| b.total_cmp(a));
                assert_eq!(got, want, "len {len}, k {k}");
                let mut ids = top_k(&row, k);
                ids.sort_unstable();
                ids.dedup();
                assert_eq!(
                    ids.len(),
                    want.len(),
                    "len {len}, k {k}: an index taken twice"
                );
            }
        }
    }
}
