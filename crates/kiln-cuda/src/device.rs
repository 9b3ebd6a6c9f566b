//! The device: context, stream, the compiled kernel module, and one method per kernel.
//!
//! Buffers are plain device allocations ([`DBuf`] of f32, [`DWeight`] holding a weight's GGUF bytes as they are
//! in the file, uploaded once). Everything runs on one stream, so kernels see each other's writes in launch
//! order; only [`Device::read`] synchronizes.

use crate::compile::{arch_name, cubin_cached};
use crate::error::{drv, Error, Result};
use cudarc::driver::{
    sys as cu, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use kiln_quant::GgmlType;
use std::collections::HashMap;
use std::sync::Arc;

/// Threads per block of the matmul kernels (also fixes their reduction order).
const MM_THREADS: u32 = 128;
/// Activation rows per matmul block (`MM_ROWS` in quant.cu).
const MM_ROWS: usize = 8;
/// Threads per block of the row kernels (norms, attention).
const ROW_THREADS: u32 = 256;

/// An open GPU with the kernels loaded.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// Marketing name of the GPU.
    pub name: String,
    /// The architecture the kernels were compiled for (`sm_90a`).
    pub arch: String,
    /// Whether the cubin came from the on-disk cache.
    pub cache_hit: bool,
    /// A non-fatal note from start-up (a kernel cache that could not be written).
    pub warning: Option<String>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({} {})", self.name, self.arch)
    }
}

/// A weight on the device: its GGUF bytes, row-major, `rows × row_bytes`.
pub struct DWeight {
    /// Tensor name (for errors).
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Elements per row.
    pub cols: usize,
    /// Rows (output features).
    pub rows: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    data: CudaSlice<u8>,
}

/// An f32 activation buffer.
pub struct DBuf {
    data: CudaSlice<f32>,
}

impl DBuf {
    /// Elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.data.len() == 0
    }
}

/// KV cache storage: keys and values, `[layer][slot][pos][kv_dim]`, f16 bits or f32.
pub struct DKv {
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    /// Layers, slots, positions per slot, `n_head_kv × head_dim`.
    pub dims: (usize, usize, usize, usize),
    /// Whether elements are f16.
    pub f16: bool,
}

/// Whether the CUDA driver library can be loaded.
pub fn driver_available() -> bool {
    // SAFETY: probes dlopen with cudarc's candidate names only.
    unsafe { cu::is_culib_present() }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Whether the matmul/embed kernels handle `ty`.
pub fn supports(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K
    )
}

impl Device {
    /// Opens GPU `ordinal`, compiles (or loads from the cache) the kernels for its architecture.
    /// Without a driver or GPU this returns an error saying so; it never panics.
    pub fn open(ordinal: usize) -> Result<Device> {
        if !driver_available() {
            return Err(Error::NoDriver);
        }
        let count = CudaContext::device_count()
            .map_err(drv("device count"))?
            .max(0) as usize;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("context creation"))?;
        // One stream, launch order is the dependency order: no per-buffer events needed.
        // SAFETY: no other stream touches these buffers.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(drv("device name"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("compute capability"))?;
        let arch = arch_name(major, minor);
        let mut drv_ver = 0i32;
        // SAFETY: plain out-parameter; the driver library is loaded.
        unsafe { cu::cuDriverGetVersion(&mut drv_ver) };
        let (cubin, cache_hit, warning) = cubin_cached(&arch, drv_ver)?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(drv("loading the kernel module"))?;
        let mut funcs = HashMap::new();
        for k in crate::compile::KERNEL_NAMES {
            let f = module
                .load_function(k)
                .map_err(drv(format!("loading kernel {k}")))?;
            funcs.insert(k, f);
        }
        let stream = ctx.default_stream();
        Ok(Device {
            ctx,
            stream,
            _module: module,
            funcs,
            name,
            arch,
            cache_hit,
            warning,
        })
    }

    fn f(&self, name: &'static str) -> &CudaFunction {
        // Every name in KERNEL_NAMES was loaded in `open`; callers only use those names.
        &self.funcs[name]
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv("synchronize"))
    }

    /// The context (for callers that allocate their own buffers).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A zeroed buffer of `len` f32.
    pub fn alloc(&self, len: usize) -> Result<DBuf> {
        let data = self
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(drv(format!("allocating {len} floats")))?;
        Ok(DBuf { data })
    }

    /// A buffer holding `x`.
    pub fn upload(&self, x: &[f32]) -> Result<DBuf> {
        let data = self
            .stream
            .clone_htod(x)
            .map_err(drv(format!("uploading {} floats", x.len())))?;
        Ok(DBuf { data })
    }

    /// Copies the first `dst.len()` elements of `x` to the host (synchronizes).
    pub fn read(&self, x: &DBuf, dst: &mut [f32]) -> Result<()> {
        if dst.len() > x.len() {
            return Err(Error::Shape {
                op: "read",
                detail: format!("{} elements asked of a buffer of {}", dst.len(), x.len()),
            });
        }
        self.stream
            .memcpy_dtoh(&x.data.slice(..dst.len()), dst)
            .map_err(drv("reading back"))?;
        self.synchronize()
    }

    /// Uploads a weight's bytes (`rows × row_bytes`).
    pub fn upload_weight(
        &self,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
        bytes: &[u8],
    ) -> Result<DWeight> {
        if !supports(ty) {
            return Err(Error::Unsupported {
                name: name.into(),
                ty,
            });
        }
        let row_bytes = ty.row_bytes(cols as u64).ok_or_else(|| Error::Shape {
            op: "upload_weight",
            detail: format!("tensor '{name}': {cols} columns is not a whole number of {ty} blocks"),
        })? as usize;
        if bytes.len() != rows * row_bytes || (!is_float(ty) && !cols.is_multiple_of(32)) {
            return Err(Error::Shape {
                op: "upload_weight",
                detail: format!(
                    "tensor '{name}': {} bytes for {rows} rows of {cols} {ty}",
                    bytes.len()
                ),
            });
        }
        let data = self
            .stream
            .clone_htod(bytes)
            .map_err(drv(format!("uploading tensor '{name}'")))?;
        Ok(DWeight {
            name: name.into(),
            ty,
            cols,
            rows,
            row_bytes,
            data,
        })
    }

    /// KV storage of `n_layer × n_slots × slot_ctx × kv_dim` keys and values.
    pub fn alloc_kv(
        &self,
        n_layer: usize,
        n_slots: usize,
        slot_ctx: usize,
        kv_dim: usize,
        f16: bool,
    ) -> Result<DKv> {
        let bytes = n_layer * n_slots * slot_ctx * kv_dim * if f16 { 2 } else { 4 };
        let k = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(drv("allocating the KV cache"))?;
        let v = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(drv("allocating the KV cache"))?;
        Ok(DKv {
            k,
            v,
            dims: (n_layer, n_slots, slot_ctx, kv_dim),
            f16,
        })
    }

    fn check(&self, op: &'static str, ok: bool, detail: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(Error::Shape {
                op,
                detail: detail(),
            })
        }
    }

    fn launch(&self, name: &'static str, cfg: LaunchConfig, args: &[&dyn Arg]) -> Result<()> {
        let f = self.f(name);
        let mut b = self.stream.launch_builder(f);
        for a in args {
            a.push(&mut b);
        }
        // SAFETY: each kernel's argument list matches its signature in kernels/*.cu (checked by the self-test),
        // and every pointer refers to a live allocation sized by the caller's checks.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {name}")))?;
        Ok(())
    }

    /// `out[i] = table[tokens[i]]`, dequantized.
    pub fn embed(&self, out: &mut DBuf, w: &DWeight, tokens: &[u32]) -> Result<()> {
        self.check("embed", out.len() >= tokens.len() * w.cols, || {
            format!(
                "output of {} for {} rows of {}",
                out.len(),
                tokens.len(),
                w.cols
            )
        })?;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= w.rows) {
            return Err(Error::Shape {
                op: "embed",
                detail: format!(
                    "token {t} outside the table of {} rows ('{}')",
                    w.rows, w.name
                ),
            });
        }
        if tokens.is_empty() {
            return Ok(());
        }
        let toks = self
            .stream
            .clone_htod(tokens)
            .map_err(drv("uploading tokens"))?;
        let cfg = grid(tokens.len() as u32, 1, ROW_THREADS);
        let (o, wp, tp) = (self.ptr(&out.data), self.ptr(&w.data), self.ptr(&toks));
        self.launch(
            "embed_rows",
            cfg,
            &[
                &o,
                &wp,
                &(w.row_bytes as i64),
                &(w.ty.id() as i32),
                &tp,
                &(w.cols as i32),
            ],
        )
    }

    /// `out[r] = W · x[r]` for `n_rows` rows (`x` is `n_rows × w.cols`, `out` is `n_rows × w.rows`).
    pub fn matmul(&self, out: &mut DBuf, w: &DWeight, x: &DBuf, n_rows: usize) -> Result<()> {
        self.check(
            "matmul",
            x.len() >= n_rows * w.cols && out.len() >= n_rows * w.rows,
            || {
                format!(
                    "'{}' [{} x {}] on {} rows: input {} / output {} elements",
                    w.name,
                    w.rows,
                    w.cols,
                    n_rows,
                    x.len(),
                    out.len()
                )
            },
        )?;
        if n_rows == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (w.rows as u32, n_rows.div_ceil(MM_ROWS) as u32, 1),
            block_dim: (MM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (o, wp, xp) = (self.ptr(&out.data), self.ptr(&w.data), self.ptr(&x.data));
        let (rb, ty, width, n_out, nr) = (
            w.row_bytes as i64,
            w.ty.id() as i32,
            w.cols as i32,
            w.rows as i32,
            n_rows as i32,
        );
        if is_float(w.ty) {
            return self.launch(
                "matmul_f",
                cfg,
                &[&o, &wp, &rb, &ty, &xp, &width, &n_out, &nr],
            );
        }
        // Activations quantized to Q8 blocks once per call.
        let nb = n_rows * w.cols / 32;
        let xq = self
            .stream
            .alloc_zeros::<i8>(n_rows * w.cols)
            .map_err(drv("allocating Q8 activations"))?;
        let xd = self
            .stream
            .alloc_zeros::<f32>(nb)
            .map_err(drv("allocating Q8 scales"))?;
        let xs = self
            .stream
            .alloc_zeros::<f32>(nb)
            .map_err(drv("allocating Q8 sums"))?;
        let (qp, dp, sp) = (self.ptr(&xq), self.ptr(&xd), self.ptr(&xs));
        self.launch(
            "quantize_q8",
            grid(n_rows as u32, 1, MM_THREADS),
            &[&qp, &dp, &sp, &xp, &width],
        )?;
        self.launch(
            "matmul_q8",
            cfg,
            &[&o, &wp, &rb, &ty, &qp, &dp, &sp, &width, &n_out, &nr],
        )
    }

    /// Row-wise RMSNorm of `n_rows × width` rows of `x` into `out`, times `w` (`width` values).
    pub fn rms_norm(
        &self,
        out: &mut DBuf,
        x: &DBuf,
        w: &DBuf,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        self.check("rms_norm", out.len() >= n_rows * width, || {
            format!("output {} for {n_rows} rows of {width}", out.len())
        })?;
        let o = self.ptr(&out.data);
        self.rms_norm_ptr(o, x, w, n_rows, width, eps)
    }

    /// [`Device::rms_norm`] in place (QK-norm: rows are tokens × heads, `width` the head dimension).
    pub fn rms_norm_inplace(
        &self,
        x: &mut DBuf,
        w: &DBuf,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        let o = self.ptr(&x.data);
        self.rms_norm_ptr(o, x, w, n_rows, width, eps)
    }

    fn rms_norm_ptr(
        &self,
        o: u64,
        x: &DBuf,
        w: &DBuf,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        self.check(
            "rms_norm",
            x.len() >= n_rows * width && w.len() >= width,
            || {
                format!(
                    "{n_rows} rows of {width}: input {} / weight {}",
                    x.len(),
                    w.len()
                )
            },
        )?;
        if n_rows == 0 {
            return Ok(());
        }
        let (xp, wp) = (self.ptr(&x.data), self.ptr(&w.data));
        self.launch(
            "rms_norm",
            grid(n_rows as u32, 1, ROW_THREADS),
            &[&o, &xp, &wp, &(width as i32), &eps],
        )
    }

    /// Rotates `n_heads` heads in each of `positions.len()` rows in place.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut DBuf,
        positions: &[usize],
        n_heads: usize,
        head_dim: usize,
        theta: f32,
        freq_scale: f32,
        neox: bool,
    ) -> Result<()> {
        self.check(
            "rope",
            x.len() >= positions.len() * n_heads * head_dim && head_dim.is_multiple_of(2),
            || {
                format!(
                    "{} rows of {n_heads}x{head_dim} in {}",
                    positions.len(),
                    x.len()
                )
            },
        )?;
        if positions.is_empty() {
            return Ok(());
        }
        let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        let pd = self
            .stream
            .clone_htod(&pos)
            .map_err(drv("uploading positions"))?;
        let (xp, pp) = (self.ptr(&x.data), self.ptr(&pd));
        self.launch(
            "rope",
            grid(positions.len() as u32, 1, ROW_THREADS),
            &[
                &xp,
                &pp,
                &(n_heads as i32),
                &(head_dim as i32),
                &theta,
                &freq_scale,
                &(neox as i32),
            ],
        )
    }

    /// `out = silu(gate) * up` over `n` elements.
    pub fn swiglu(&self, out: &mut DBuf, gate: &DBuf, up: &DBuf, n: usize) -> Result<()> {
        self.check(
            "swiglu",
            out.len() >= n && gate.len() >= n && up.len() >= n,
            || format!("{n} elements"),
        )?;
        if n == 0 {
            return Ok(());
        }
        let (o, g, u) = (
            self.ptr(&out.data),
            self.ptr(&gate.data),
            self.ptr(&up.data),
        );
        self.launch(
            "swiglu",
            grid(n.div_ceil(256) as u32, 1, 256),
            &[&o, &g, &u, &(n as i64)],
        )
    }

    /// `x += y` over `n` elements.
    pub fn add(&self, x: &mut DBuf, y: &DBuf, n: usize) -> Result<()> {
        self.check("add", x.len() >= n && y.len() >= n, || {
            format!("{n} elements")
        })?;
        if n == 0 {
            return Ok(());
        }
        let (xp, yp) = (self.ptr(&x.data), self.ptr(&y.data));
        self.launch(
            "add_inplace",
            grid(n.div_ceil(256) as u32, 1, 256),
            &[&xp, &yp, &(n as i64)],
        )
    }

    /// `dst[..n] = src[..n]`.
    pub fn copy(&self, dst: &mut DBuf, src: &DBuf, n: usize) -> Result<()> {
        self.check("copy", dst.len() >= n && src.len() >= n, || {
            format!("{n} elements")
        })?;
        if n == 0 {
            return Ok(());
        }
        let (d, s) = (self.ptr(&dst.data), self.ptr(&src.data));
        self.launch(
            "copy_f32",
            grid(n.div_ceil(256) as u32, 1, 256),
            &[&d, &s, &(n as i64)],
        )
    }

    /// `out[i] = x[rows[i]]` for rows of `width`.
    pub fn gather_rows(
        &self,
        out: &mut DBuf,
        x: &DBuf,
        rows: &[usize],
        width: usize,
    ) -> Result<()> {
        let max = rows.iter().copied().max().unwrap_or(0);
        self.check(
            "gather_rows",
            out.len() >= rows.len() * width && (rows.is_empty() || x.len() >= (max + 1) * width),
            || format!("{} rows (max {max}) of {width}", rows.len()),
        )?;
        if rows.is_empty() {
            return Ok(());
        }
        let r: Vec<i32> = rows.iter().map(|&v| v as i32).collect();
        let rd = self
            .stream
            .clone_htod(&r)
            .map_err(drv("uploading row indices"))?;
        let (o, xp, rp) = (self.ptr(&out.data), self.ptr(&x.data), self.ptr(&rd));
        self.launch(
            "gather_rows",
            grid(rows.len() as u32, 1, ROW_THREADS),
            &[&o, &xp, &rp, &(width as i32)],
        )
    }

    /// Index of the maximum of each of `n_rows` rows of `width` (first on ties).
    pub fn argmax(&self, x: &DBuf, n_rows: usize, width: usize) -> Result<Vec<u32>> {
        self.check("argmax", x.len() >= n_rows * width, || {
            format!("{n_rows} rows of {width}")
        })?;
        if n_rows == 0 {
            return Ok(Vec::new());
        }
        let out = self
            .stream
            .alloc_zeros::<i32>(n_rows)
            .map_err(drv("allocating argmax output"))?;
        let (o, xp) = (self.ptr(&out), self.ptr(&x.data));
        self.launch(
            "argmax_rows",
            grid(n_rows as u32, 1, 1024),
            &[&o, &xp, &(width as i32)],
        )?;
        let mut h = vec![0i32; n_rows];
        self.stream
            .memcpy_dtoh(&out, &mut h)
            .map_err(drv("reading argmax"))?;
        self.synchronize()?;
        Ok(h.into_iter().map(|v| v as u32).collect())
    }

    /// Stores each row's k/v at `(slot, pos)` of `layer`, then attention of each row's query over positions
    /// `0..=pos` of its slot. `rows` are `(slot, pos)`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        out: &mut DBuf,
        q: &DBuf,
        k: &DBuf,
        v: &DBuf,
        kv: &mut DKv,
        layer: usize,
        rows: &[(usize, usize)],
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        scale: f32,
    ) -> Result<()> {
        let (n_layer, n_slots, slot_ctx, kv_dim) = kv.dims;
        let n = rows.len();
        let bad_row = rows.iter().find(|&&(s, p)| s >= n_slots || p >= slot_ctx);
        self.check(
            "attention",
            layer < n_layer
                && kv_dim == n_head_kv * head_dim
                && n_head_kv > 0
                && n_head.is_multiple_of(n_head_kv)
                && head_dim <= 512
                && bad_row.is_none()
                && q.len() >= n * n_head * head_dim
                && out.len() >= n * n_head * head_dim
                && k.len() >= n * kv_dim
                && v.len() >= n * kv_dim,
            || format!("layer {layer}, {n} rows (bad row {bad_row:?}), heads {n_head}/{n_head_kv}x{head_dim}, cache {:?}", kv.dims),
        )?;
        if n == 0 {
            return Ok(());
        }
        let slots: Vec<i32> = rows.iter().map(|r| r.0 as i32).collect();
        let pos: Vec<i32> = rows.iter().map(|r| r.1 as i32).collect();
        let sd = self
            .stream
            .clone_htod(&slots)
            .map_err(drv("uploading slots"))?;
        let pd = self
            .stream
            .clone_htod(&pos)
            .map_err(drv("uploading positions"))?;
        let scores = self
            .stream
            .alloc_zeros::<f32>(n * n_head * slot_ctx)
            .map_err(drv("allocating scores"))?;
        let (kc, vc) = (self.ptr(&kv.k), self.ptr(&kv.v));
        let (kp, vp, sp, pp) = (
            self.ptr(&k.data),
            self.ptr(&v.data),
            self.ptr(&sd),
            self.ptr(&pd),
        );
        let f16 = kv.f16 as i32;
        let (li, ns, sc, kd) = (layer as i32, n_slots as i32, slot_ctx as i32, kv_dim as i32);
        self.launch(
            "kv_append",
            grid(n as u32, 1, ROW_THREADS),
            &[&kc, &vc, &kp, &vp, &sp, &pp, &li, &ns, &sc, &kd, &f16],
        )?;
        let (o, qp, scp) = (self.ptr(&out.data), self.ptr(&q.data), self.ptr(&scores));
        self.launch(
            "attn_decode",
            grid(n_head as u32, n as u32, 128),
            &[
                &o,
                &qp,
                &kc,
                &vc,
                &scp,
                &sp,
                &pp,
                &li,
                &ns,
                &sc,
                &(n_head as i32),
                &(n_head_kv as i32),
                &(head_dim as i32),
                &scale,
                &f16,
            ],
        )?;
        // The scores scratch is freed when this returns; the stream orders the free after the kernel.
        Ok(())
    }
}

fn grid(x: u32, y: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A kernel argument (scalars by value; device pointers as `u64`).
trait Arg {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>);
}

macro_rules! arg_impl {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
                b.arg(self);
            }
        }
    )*};
}
arg_impl!(u64, i64, i32, f32);
