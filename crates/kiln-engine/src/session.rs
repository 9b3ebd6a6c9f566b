//! Sessions: the KV cache, split into sequence slots, plus the scratch buffers of one forward pass.
//!
//! Context and slots: a session is created with `n_ctx` positions in total and `n_slots` sequence slots; each
//! slot gets `n_ctx / n_slots` positions (`kiln run`/`chat` use one slot, so `-c` is that sequence's context;
//! a server with `--parallel P` gives each request `-c / P`). A slot's length is the number of positions holding
//! valid K/V; rows must extend a slot contiguously, and [`Session::truncate`] rolls a slot back (speculative
//! rejection, prompt reuse) — later positions are simply overwritten.
//!
//! The unit of work is a [`Batch`] of rows `(slot, pos, token, wants_logits)`, possibly from several slots.
//! Every op computes each row with a fixed per-row reduction order, so a row's logits are the same bits whether it
//! runs alone, in a batched decode, in a speculative verify block or in a prefill chunk. Prefill of one sequence
//! is done by [`Session::prefill`] in fixed `batch`-sized chunks of that sequence only.

use crate::backend::{AttnRow, Backend, KvLayout, KvType};
use crate::cpu::{CpuBackend, CpuKv};
use crate::error::{Error, Result};
use crate::models::blocks::{Pass, Scratch};
use crate::models::Model;

/// Session geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// Total KV positions over all slots (`-c`).
    pub n_ctx: usize,
    /// Sequence slots; each gets `n_ctx / n_slots` positions.
    pub n_slots: usize,
    /// Most rows in one [`Session::forward`] call, and the prefill chunk size (`--batch`).
    pub batch: usize,
    /// KV cache element type (`--kv-type`).
    pub kv_type: KvType,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            n_ctx: 4096,
            n_slots: 1,
            batch: 64,
            kv_type: KvType::F16,
        }
    }
}

/// One row of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRow {
    /// Sequence slot.
    pub slot: usize,
    /// Position in the slot; must be the slot's current length (counting earlier rows of the same batch).
    pub pos: usize,
    /// Input token.
    pub token: u32,
    /// Whether logits are computed for this row.
    pub logits: bool,
}

/// A unit of work: rows from one or more slots, plus the layers whose hidden states to read back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The rows.
    pub rows: Vec<BatchRow>,
    /// Layers (0-based) whose output hidden states are returned for every row (speculative drafters tap them).
    pub taps: Vec<usize>,
    /// The rows that ask for logits get only their greedy token ([`Output::argmax`], computed where the logits
    /// are), no logits.
    pub argmax_only: bool,
    /// Every row is a prompt token (no decode or verify rows): a backend may compute the pass with its prefill
    /// kernels, whose bits can differ from the decode path's (never from one another's rows).
    pub prefill: bool,
    /// A GPU session keeps the tapped hidden states on the device ([`Session::device_taps`]) instead of returning
    /// them in [`Output::hidden`] (a GPU drafter copies them from there); a host session returns them as usual.
    pub keep_taps: bool,
}

/// The result of a forward pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    /// Batch row indices that have logits, in batch order.
    pub rows: Vec<usize>,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// `rows.len() × n_vocab` logits (empty for an `argmax_only` batch).
    pub logits: Vec<f32>,
    /// The greedy token ([`crate::sampler::greedy_argmax`]) of each row in `rows`, for an `argmax_only` batch.
    pub argmax: Vec<u32>,
    /// `(layer, batch rows × n_embd)` hidden states for each tapped layer (none for a GPU session's
    /// [`Batch::keep_taps`] pass).
    pub hidden: Vec<(usize, Vec<f32>)>,
}

impl Output {
    /// The logits of the `i`-th row that asked for them.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.n_vocab..(i + 1) * self.n_vocab]
    }

    /// The logits of batch row `batch_row`, if it asked for them.
    pub fn for_batch_row(&self, batch_row: usize) -> Option<&[f32]> {
        self.rows
            .iter()
            .position(|&r| r == batch_row)
            .map(|i| self.row(i))
    }
}

/// The KV cache and scratch buffers of the backend the session runs on.
// One per session: the variants' size difference costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
enum State {
    Cpu {
        kv: CpuKv,
        scratch: Scratch<CpuBackend>,
    },
    #[cfg(feature = "cuda")]
    Cuda {
        kv: kiln_cuda::DKv,
        scratch: Scratch<crate::cuda::CudaBackend>,
    },
}

/// Where a pass's logits go: to the host in full, or only each row's greedy token.
enum LogitsOut<'a> {
    Full(&'a mut Vec<f32>),
    Argmax(&'a mut Vec<u32>),
}

/// One forward pass on backend `be`; the logits of the rows that ask go to `out`. `run` executes the pass given as
/// a closure: the CPU calls it, the CUDA backend uploads the rows' metadata and may replay it as a graph.
#[allow(clippy::too_many_arguments)]
fn forward_on<B: Backend>(
    model: &Model,
    be: &B,
    kv: &mut B::Kv,
    scratch: &mut Scratch<B>,
    rows: &[AttnRow],
    positions: &[usize],
    tokens: &[u32],
    logit_rows: &[usize],
    layers: &[usize],
    read_taps: bool,
    out: LogitsOut,
    run: impl FnOnce(&mut (dyn FnMut() -> Result<()> + Send)) -> Result<()>,
) -> Result<Vec<(usize, Vec<f32>)>> {
    let hp = model.hparams();
    // `layers` (ascending, distinct) stay on the backend until the pass ends; the buffer is grown outside it.
    scratch.reserve_taps(be, hp, layers.len(), rows.len())?;
    run(&mut || {
        let mut pass = Pass {
            be,
            hp,
            st: &mut *scratch,
            kv: &mut *kv,
            rows,
            positions,
            taps: layers,
        };
        model.forward(&mut pass, tokens, logit_rows)
    })?;
    let mut hidden = Vec::with_capacity(layers.len());
    if let (true, false, Some((buf, _))) = (read_taps, layers.is_empty(), &scratch.taps) {
        let n = rows.len() * hp.n_embd;
        let mut all = vec![0f32; layers.len() * n];
        be.read(buf, &mut all)?;
        for (&l, h) in layers.iter().zip(all.chunks_exact(n.max(1))) {
            hidden.push((l, h.to_vec()));
        }
    }
    match out {
        LogitsOut::Full(logits) => {
            logits.resize(logit_rows.len() * hp.n_vocab, 0.0);
            be.read(&scratch.logits, logits)?;
        }
        LogitsOut::Argmax(ids) if model.backend().flags().device_argmax => {
            *ids = be.argmax_rows(&scratch.logits, logit_rows.len(), hp.n_vocab)?
        }
        LogitsOut::Argmax(ids) => {
            // KILN_NO_DEVICE_ARGMAX: the logits come back and the host takes the same argmax.
            let mut logits = vec![0f32; logit_rows.len() * hp.n_vocab];
            be.read(&scratch.logits, &mut logits)?;
            *ids = logits
                .chunks_exact(hp.n_vocab)
                .map(crate::sampler::greedy_argmax)
                .collect();
        }
    }
    Ok(hidden)
}

/// A GPU pass's tapped hidden states, left on the device ([`Session::device_taps`]).
#[cfg(feature = "cuda")]
pub(crate) struct DeviceTaps<'a> {
    /// The device whose stream wrote them (the next pass's writes are queued there too).
    pub dev: &'a kiln_cuda::Device,
    /// `layers.len() × rows × n_embd`, layer `layers[s]` at slot `s`.
    pub buf: &'a kiln_cuda::DBuf,
    /// The tapped layers, ascending.
    pub layers: &'a [usize],
    /// The pass's rows.
    pub rows: usize,
}

/// A model's KV cache and forward-pass buffers.
pub struct Session<'m> {
    model: &'m Model,
    cfg: SessionConfig,
    slot_ctx: usize,
    state: State,
    lens: Vec<usize>,
    // Reused per call, so decoding allocates only the returned logits.
    attn_rows: Vec<AttnRow>,
    positions: Vec<usize>,
    tokens: Vec<u32>,
    logit_rows: Vec<usize>,
    /// The tapped layers (ascending) and rows of the last pass whose taps stayed on the device.
    kept_taps: Option<(Vec<usize>, usize)>,
}

impl<'m> Session<'m> {
    /// A session over `model` with `cfg`'s context split into slots.
    pub fn new(model: &'m Model, cfg: SessionConfig) -> Result<Session<'m>> {
        if cfg.n_slots == 0 || cfg.batch == 0 || cfg.n_ctx < cfg.n_slots {
            return Err(Error::Config(format!(
                "context {} with {} slots and batch {} (each must be positive, context ≥ slots)",
                cfg.n_ctx, cfg.n_slots, cfg.batch
            )));
        }
        let hp = model.hparams();
        let slot_ctx = cfg.n_ctx / cfg.n_slots;
        let layout = KvLayout {
            n_layer: hp.n_layer,
            n_slots: cfg.n_slots,
            slot_ctx,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            ty: cfg.kv_type,
        };
        let state = match () {
            #[cfg(feature = "cuda")]
            () if model.cuda().is_some() => {
                let be = model
                    .cuda()
                    .ok_or_else(|| Error::Device("no GPU backend".into()))?;
                be.reserve(cfg.batch, hp, slot_ctx)?;
                State::Cuda {
                    kv: be.alloc_kv(&layout)?,
                    scratch: Scratch::new(be, hp, cfg.batch, cfg.batch)?,
                }
            }
            () => {
                let be = model.backend();
                State::Cpu {
                    kv: be.alloc_kv(&layout)?,
                    scratch: Scratch::new(be, hp, cfg.batch, cfg.batch)?,
                }
            }
        };
        Ok(Session {
            model,
            cfg,
            slot_ctx,
            state,
            lens: vec![0; cfg.n_slots],
            attn_rows: Vec::with_capacity(cfg.batch),
            positions: Vec::with_capacity(cfg.batch),
            tokens: Vec::with_capacity(cfg.batch),
            logit_rows: Vec::with_capacity(cfg.batch),
            kept_taps: None,
        })
    }

    /// The model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// The configuration.
    pub fn config(&self) -> SessionConfig {
        self.cfg
    }

    /// Positions per slot.
    pub fn slot_ctx(&self) -> usize {
        self.slot_ctx
    }

    /// Valid positions in `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    /// Whether `slot` holds no positions.
    pub fn is_empty(&self, slot: usize) -> bool {
        self.len(slot) == 0
    }

    /// Rolls `slot` back to `len` positions (no-op when already shorter).
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<()> {
        let l = self
            .lens
            .get_mut(slot)
            .ok_or_else(|| Error::Batch(format!("slot {slot} does not exist")))?;
        *l = (*l).min(len);
        Ok(())
    }

    /// The hidden states the last pass kept on the device ([`Batch::keep_taps`], a GPU session), valid until the
    /// next pass.
    #[cfg(feature = "cuda")]
    pub(crate) fn device_taps(&self) -> Option<DeviceTaps<'_>> {
        let (layers, rows) = self.kept_taps.as_ref()?;
        match &self.state {
            State::Cuda { scratch, .. } => Some(DeviceTaps {
                dev: self.model.cuda()?.device(),
                buf: &scratch.taps.as_ref()?.0,
                layers,
                rows: *rows,
            }),
            State::Cpu { .. } => None,
        }
    }

    /// Runs one batch. Rows must extend their slots contiguously (see [`BatchRow::pos`]).
    pub fn forward(&mut self, batch: &Batch) -> Result<Output> {
        let (mut logits, mut argmax) = (Vec::new(), Vec::new());
        let out = if batch.argmax_only {
            LogitsOut::Argmax(&mut argmax)
        } else {
            LogitsOut::Full(&mut logits)
        };
        let hidden = self.run(
            &batch.rows,
            &batch.taps,
            batch.prefill,
            batch.keep_taps,
            out,
        )?;
        Ok(Output {
            rows: self.logit_rows.clone(),
            n_vocab: self.model.n_vocab(),
            logits,
            argmax,
            hidden,
        })
    }

    /// The body of [`Session::forward`]: the logits of the rows that ask go to `out`, hidden states of tapped
    /// layers are returned. `prefill` ([`Batch::prefill`]) only matters on the GPU: the CPU's prefill kernels give
    /// the decode path's bits.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn run(
        &mut self,
        rows: &[BatchRow],
        taps: &[usize],
        prefill: bool,
        keep_taps: bool,
        out: LogitsOut,
    ) -> Result<Vec<(usize, Vec<f32>)>> {
        let n = rows.len();
        self.kept_taps = None;
        self.logit_rows.clear();
        if n == 0 {
            match out {
                LogitsOut::Full(logits) => logits.clear(),
                LogitsOut::Argmax(ids) => ids.clear(),
            }
            return Ok(Vec::new());
        }
        if n > self.cfg.batch {
            return Err(Error::Batch(format!(
                "{n} rows exceed the session's batch size {}",
                self.cfg.batch
            )));
        }
        let hp = self.model.hparams();
        if let Some(&l) = taps.iter().find(|&&l| l >= hp.n_layer) {
            return Err(Error::Batch(format!(
                "tap of layer {l}, but the model has {} layers",
                hp.n_layer
            )));
        }
        // Validate positions against a copy of the lengths, committing only on success.
        let mut lens = self.lens.clone();
        self.attn_rows.clear();
        self.positions.clear();
        self.tokens.clear();
        for (i, r) in rows.iter().enumerate() {
            let len = lens
                .get_mut(r.slot)
                .ok_or_else(|| Error::Batch(format!("slot {} does not exist", r.slot)))?;
            if r.pos >= self.slot_ctx {
                return Err(Error::ContextFull {
                    slot: r.slot,
                    pos: r.pos,
                    n_ctx: self.slot_ctx,
                });
            }
            if r.pos != *len {
                return Err(Error::Batch(format!(
                    "row {i}: slot {} has {} positions, so the next row must be at position {}, not {}",
                    r.slot, *len, *len, r.pos
                )));
            }
            if r.token as usize >= hp.n_vocab {
                return Err(Error::BadToken {
                    id: r.token,
                    n_vocab: hp.n_vocab,
                });
            }
            *len += 1;
            self.attn_rows.push(AttnRow {
                slot: r.slot,
                pos: r.pos,
            });
            self.positions.push(r.pos);
            self.tokens.push(r.token);
            if r.logits {
                self.logit_rows.push(i);
            }
        }
        let model = self.model;
        // Tapped layers in layer order, each once.
        let mut layers = taps.to_vec();
        layers.sort_unstable();
        layers.dedup();
        let layers = layers.as_slice();
        let (rows, pos, toks, lrows) = (
            &self.attn_rows,
            &self.positions,
            &self.tokens,
            &self.logit_rows,
        );
        let hidden = match &mut self.state {
            State::Cpu { kv, scratch } => {
                let be = model.backend();
                forward_on(
                    model,
                    be,
                    kv,
                    scratch,
                    rows,
                    pos,
                    toks,
                    lrows,
                    layers,
                    true,
                    out,
                    |f| be.run_pass(f),
                )?
            }
            #[cfg(feature = "cuda")]
            State::Cuda { kv, scratch } => {
                let be = model
                    .cuda()
                    .ok_or_else(|| Error::Device("no GPU backend".into()))?;
                // The tap buffer must exist before a capture (which may not allocate); the graph copies the
                // tapped layers into it, so its identity and the layer set are part of the key.
                scratch.reserve_taps(be, model.hparams(), layers.len(), rows.len())?;
                let tap_key = match &scratch.taps {
                    Some((buf, _)) if !layers.is_empty() => {
                        layers.iter().fold(buf.id(), |h, &l| {
                            h.wrapping_mul(0x100_0000_01B3).wrapping_add(l as u64 + 1)
                        })
                    }
                    _ => 0,
                };
                let key = [scratch.x.id(), kv.id(), tap_key];
                let capturable = true;
                forward_on(
                    model,
                    be,
                    kv,
                    scratch,
                    rows,
                    pos,
                    toks,
                    lrows,
                    layers,
                    !keep_taps,
                    out,
                    |f| be.pass(key, toks, rows, lrows, capturable, prefill, f),
                )?
            }
        };
        #[cfg(feature = "cuda")]
        if keep_taps && matches!(self.state, State::Cuda { .. }) && !layers.is_empty() {
            self.kept_taps = Some((layers.to_vec(), n));
        }
        self.lens = lens;
        Ok(hidden)
    }

    /// Appends `tokens` to `slot` in chunks of the session's batch size (fixed boundaries, this slot only) and
    /// returns the logits of the last token (empty when `tokens` is empty).
    pub fn prefill(&mut self, slot: usize, tokens: &[u32]) -> Result<Vec<f32>> {
        let all = self.prefill_inner(slot, tokens, false)?;
        Ok(all)
    }

    /// Like [`Session::prefill`] but returns the logits of every token (`tokens.len() × n_vocab`).
    pub fn prefill_all_logits(&mut self, slot: usize, tokens: &[u32]) -> Result<Vec<f32>> {
        self.prefill_inner(slot, tokens, true)
    }

    fn prefill_inner(&mut self, slot: usize, tokens: &[u32], all: bool) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        let chunk = self.cfg.batch;
        let n = tokens.len();
        for (c, toks) in tokens.chunks(chunk).enumerate() {
            let start = self.len(slot);
            let batch = Batch {
                rows: toks
                    .iter()
                    .enumerate()
                    .map(|(i, &token)| BatchRow {
                        slot,
                        pos: start + i,
                        token,
                        logits: all || c * chunk + i + 1 == n,
                    })
                    .collect(),
                taps: Vec::new(),
                argmax_only: false,
                prefill: true,
                keep_taps: false,
            };
            let o = self.forward(&batch)?;
            out.extend_from_slice(&o.logits);
        }
        Ok(out)
    }

    /// Appends one token to `slot` and returns its logits.
    pub fn decode(&mut self, slot: usize, token: u32) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.decode_into(slot, token, &mut logits)?;
        Ok(logits)
    }

    /// [`Session::decode`] into a caller-owned buffer: the decode loop allocates nothing per token.
    pub fn decode_into(&mut self, slot: usize, token: u32, logits: &mut Vec<f32>) -> Result<()> {
        let row = [BatchRow {
            slot,
            pos: self.len(slot),
            token,
            logits: true,
        }];
        self.run(&row, &[], false, false, LogitsOut::Full(logits))?;
        Ok(())
    }

    /// Appends one token to `slot` and returns the greedy next token ([`crate::sampler::greedy_argmax`] of its
    /// logits), chosen where the logits are.
    pub fn decode_argmax(&mut self, slot: usize, token: u32) -> Result<u32> {
        let row = [BatchRow {
            slot,
            pos: self.len(slot),
            token,
            logits: true,
        }];
        let mut ids = Vec::with_capacity(1);
        self.run(&row, &[], false, false, LogitsOut::Argmax(&mut ids))?;
        Ok(ids[0])
    }
}

impl Model {
    /// Teacher-forced logits of `tokens` from an empty context: `tokens.len() × n_vocab` values, row `i` being the
    /// prediction after `tokens[..=i]`. Uses an f32 KV cache (exact) and chunks of 64.
    pub fn teacher_forced_logits(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut s = Session::new(
            self,
            SessionConfig {
                n_ctx: tokens.len().max(1),
                n_slots: 1,
                batch: 64,
                kv_type: KvType::F32,
            },
        )?;
        s.prefill_all_logits(0, tokens)
    }
}
