//! Kernel sources and their compilation by NVRTC: one translation unit (all `.cu` files concatenated, the
//! shared helpers first), compiled for the device's exact architecture (`sm_90a` on an H200) to a cubin,
//! cached on disk under a key of source, options, architecture and NVRTC/driver versions.
//!
//! The kernels include no headers (f16 conversions are inline PTX on raw bits), so no CUDA include directory
//! is needed; [`compile_options`] still adds `-I` for `$CUDA_HOME/include` when it exists, so a kernel that
//! later needs one finds it on the device. The CI compile check (tools/check-kernels.sh) calls
//! [`compile_cubin`] with the same options.

use crate::error::{Error, Result};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::path::PathBuf;

/// The kernel files, in the order they are concatenated.
pub const KERNEL_FILES: [(&str, &str); 8] = [
    ("common.cu", include_str!("../kernels/common.cu")),
    ("quant.cu", include_str!("../kernels/quant.cu")),
    ("gemv.cu", include_str!("../kernels/gemv.cu")),
    ("mmq.cu", include_str!("../kernels/mmq.cu")),
    ("gemv16.cu", include_str!("../kernels/gemv16.cu")),
    ("moe.cu", include_str!("../kernels/moe.cu")),
    ("ops.cu", include_str!("../kernels/ops.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
];

/// Dynamic shared memory (bytes) of the kernels that take it, read from the `#define` that sizes each in the kernel
/// source (static_asserts there tie it to the layout): mmq.cu's pipelined prefill bodies, the K8 block kernels
/// (gemv16.cu) and the prefill flash attention. Those kernels trap when launched with less; every other kernel
/// takes none.
pub fn dynamic_smem(kernel: &str) -> u32 {
    let name = match kernel {
        "mmq_q4_k8" | "moe_mmq_q4_k8" => "MP_SMEM_Q4K",
        "mmq_q6_k8" | "moe_mmq_q6_k8" => "MP_SMEM_Q6K",
        "mmq_q8_0" | "moe_mmq_q8_0" => "MP_SMEM_Q8",
        "gemv16_k8" | "gemv16_k8_o16" => {
            let outs = if kernel == "gemv16_k8" { 32 } else { 16 };
            return source_define(&format!("B16_SMEM_K8_W{}_O{outs}", b16_warps()));
        }
        "attn_flash_h64" => "FA_SMEM_H64",
        "attn_flash_h128" => "FA_SMEM_H128",
        _ => return 0,
    };
    source_define(name)
}

/// The split-KV kernels' fewest positions a split (`AT_MIN_CHUNK` in attention.cu, or the value
/// `KILN_CUDA_DEFINES` gives it): a row whose span is no longer is one split.
pub fn attn_min_chunk() -> usize {
    tuned_define("AT_MIN_CHUNK") as usize
}

/// Warps in a block of the K8 block kernel (`B16_WARPS` in gemv16.cu, or the value `KILN_CUDA_DEFINES` gives it):
/// its launch's block size and shared memory follow it.
pub fn b16_warps() -> u32 {
    tuned_define("B16_WARPS")
}

/// A numeric kernel constant the host also needs: the last `-DNAME=value` of `KILN_CUDA_DEFINES`, else the
/// source's `#define`.
pub(crate) fn tuned_define(name: &str) -> u32 {
    let prefix = format!("-D{name}=");
    tuning_defines()
        .iter()
        .rev()
        .find_map(|d| d.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or_else(|| source_define(name))
}

/// The value of a numeric `#define NAME value` in the kernel source.
fn source_define(name: &str) -> u32 {
    static DEFINES: std::sync::OnceLock<std::collections::HashMap<String, u32>> =
        std::sync::OnceLock::new();
    let defines = DEFINES.get_or_init(|| {
        KERNEL_FILES
            .iter()
            .flat_map(|(_, text)| text.lines())
            .filter_map(|l| {
                let mut w = l.strip_prefix("#define ")?.split_whitespace();
                let (k, v) = (w.next()?, w.next()?.parse().ok()?);
                Some((k.to_string(), v))
            })
            .collect()
    });
    defines[name]
}

/// The names of every `extern "C"` kernel the backend loads (the self-test and the CI check load all of them).
pub const KERNEL_NAMES: [&str; 75] = [
    "moe_route",
    "moe_matmul",
    "moe_combine",
    "moe_gemv",
    "moe_gemv_k8",
    "moe_gate_up",
    "moe_gate_up_k8",
    "moe_count",
    "moe_place",
    "moe_gemv_tiles",
    "moe_gemv_tiles_k8",
    "moe_mmq_q4_k",
    "moe_mmq_q4_k8",
    "moe_mmq_q6_k",
    "moe_mmq_q6_k8",
    "moe_mmq_q8_0",
    "gemv_r1",
    "gemv_r8",
    "gemv3_r1",
    "gemv3_r8",
    "gemv_k8_r1",
    "gemv_k8_r8",
    "gemv3_k8_r1",
    "gemv3_k8_r8",
    "mmq_q4_k",
    "mmq_q6_k",
    "mmq_q8_0",
    "mmq_q4_k8",
    "mmq_q6_k8",
    "gemv16_q4k",
    "gemv16_q6k",
    "gemv16_q8_0",
    "gemv16_k8",
    "gemv16_k8_o16",
    "gemv16_k8d",
    "gemv16_k8d_n8",
    "gemv16_q8d",
    "gemv16_q8d_n8",
    "quantize_k8",
    "matmul_deq",
    "dequant_bf16",
    "to_bf16",
    "rms_norm_q8",
    "swiglu_q8",
    "quantize_q8_warp",
    "attn_prep",
    "attn_split_g1_h64",
    "attn_split_g2_h64",
    "attn_split_g3_h64",
    "attn_split_g4_h64",
    "attn_split_g8_h64",
    "attn_split_g1_h128",
    "attn_split_g2_h128",
    "attn_split_g3_h128",
    "attn_split_g4_h128",
    "attn_split_g8_h128",
    "attn_merge",
    "attn_flash_h64",
    "attn_flash_h128",
    "embed_rows",
    "quantize_q8",
    "matmul_q8",
    "matmul_f",
    "rms_norm",
    "rope",
    "swiglu",
    "add_inplace",
    "gather_rows",
    "gather_quant",
    "argmax_part",
    "argmax_final",
    "kv_append",
    "attn_decode",
    "copy_f32",
    "copy_rows_f32",
];

/// The whole translation unit: the lookup tables (from kiln-quant, the one copy of them), then the files.
pub fn kernel_source() -> String {
    let mut s =
        String::from("// ---- tables ----\n__constant__ unsigned long long IQ2XXS_GRID[256] = {");
    for (i, g) in kiln_quant::IQ2XXS_GRID.iter().enumerate() {
        s.push_str(if i % 8 == 0 { "\n    " } else { " " });
        s.push_str(&format!("{g:#018x}ull,"));
    }
    s.push_str("\n};\n");
    for (name, text) in KERNEL_FILES {
        s.push_str(&format!("// ---- {name} ----\n"));
        s.push_str(text);
        s.push('\n');
    }
    s
}

/// `sm_<major><minor>`, with the `a` suffix on 9.0 and later so arch-specific instructions (wgmma) are allowed.
pub fn arch_name(major: i32, minor: i32) -> String {
    if major >= 9 {
        format!("sm_{major}{minor}a")
    } else {
        format!("sm_{major}{minor}")
    }
}

/// The NVRTC options kiln uses for `arch` with the kill switches' `defines` ([`option_defines`]; the run-time
/// path and the CI check use exactly these).
pub fn compile_options(arch: &str, defines: &[String]) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        // Fixed rounding: contraction into FMA is deterministic per kernel build, so results stay bit-stable.
        "--fmad=true".to_string(),
        "-default-device".to_string(),
    ];
    if let Some(inc) = cuda_include_dir() {
        o.push(format!("--include-path={}", inc.display()));
    }
    o.extend_from_slice(defines);
    o.extend(tuning_defines());
    o
}

/// The preprocessor defines that turn off the fast paths which live inside the kernels' code rather than in the
/// host's choice of kernel: the one-row K8 GEMVs' staged activation row (`GV_STAGE_MAXW`), their weight loads
/// issued before the launch wait (`GV_EARLY_W`) and the direct K8 block kernel's weight ring (`B16D_RING`).
/// Empty with the defaults.
pub fn option_defines(opts: &crate::Options) -> Vec<String> {
    let mut d = Vec::new();
    if !opts.gemv_stage {
        d.push("-DGV_STAGE_MAXW=0".to_string());
    }
    if !opts.early_weights {
        d.push("-DGV_EARLY_W=0".to_string());
    }
    if !opts.block_ring {
        d.push("-DB16D_RING=0".to_string());
    }
    d
}

/// `KILN_CUDA_DEFINES`: extra NVRTC options separated by `;` or spaces (e.g. `-DGV_U=8;-DAT_MIN_CHUNK=64`: `;`
/// survives `kiln bench --ab`, which splits at spaces and commas), to try the kernels' device-only constants on a
/// GPU machine without rebuilding kiln; part of the cache key, so each set compiles once. Unset in normal use.
fn tuning_defines() -> Vec<String> {
    std::env::var("KILN_CUDA_DEFINES")
        .map(|v| split_defines(&v))
        .unwrap_or_default()
}

fn split_defines(v: &str) -> Vec<String> {
    v.split(|c: char| c == ';' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `$CUDA_HOME/include` or `/usr/local/cuda/include`, when present.
fn cuda_include_dir() -> Option<PathBuf> {
    let base = std::env::var_os("CUDA_HOME")
        .or_else(|| std::env::var_os("CUDA_PATH"))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/cuda"));
    let inc = base.join("include");
    inc.is_dir().then_some(inc)
}

/// Whether the NVRTC library can be loaded (checked before any call, since cudarc panics when it is missing).
pub fn nvrtc_available() -> bool {
    // SAFETY: only probes dlopen with cudarc's own candidate names.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// NVRTC's `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_available() {
        return Err(Error::NoNvrtc);
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: plain out-parameters.
    let r = unsafe { nvrtc_sys::nvrtcVersion(&mut a, &mut b) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::NoNvrtc);
    }
    Ok((a, b))
}

/// Compiles the kernel source for `arch` with `defines` to a cubin (no cache).
pub fn compile_cubin(arch: &str, defines: &[String]) -> Result<Vec<u8>> {
    compile(arch, defines, &[]).map(|(cubin, _)| cubin)
}

/// Registers, spills and stack of every kernel as ptxas reports them (`--ptxas-options=-v`), one line per
/// kernel: `name: N registers, S bytes spill stores, F bytes stack`. Occupancy of the latency-bound decode
/// kernels follows the register count, so the CI check prints this.
pub fn resource_report(arch: &str) -> Result<Vec<String>> {
    let (_, log) = compile(arch, &[], &["--ptxas-options=-v".to_string()])?;
    let mut lines = Vec::new();
    let mut kernel = String::new();
    let mut frame = String::new();
    for l in log.lines() {
        if let Some(rest) = l.split("Compiling entry function '").nth(1) {
            kernel = rest.split('\'').next().unwrap_or("").to_string();
        } else if l.contains("bytes stack frame") {
            frame = l
                .trim_start_matches("ptxas")
                .trim_start_matches([' ', '.'])
                .to_string();
        } else if let Some(rest) = l.split("Used ").nth(1) {
            let regs = rest.split(',').next().unwrap_or("");
            lines.push(format!("{kernel}: {regs}; {frame}"));
        }
    }
    lines.sort();
    Ok(lines)
}

fn program_log(prog: nvrtc_sys::nvrtcProgram) -> String {
    // SAFETY: the program is live; the log is a NUL-terminated buffer.
    unsafe { nvrtc::get_program_log(prog) }
        .map(|l| {
            let bytes: Vec<u8> = l
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .unwrap_or_default()
}

/// The cubin and NVRTC's log, compiled with kiln's options (with `defines`) plus `extra`.
fn compile(arch: &str, defines: &[String], extra: &[String]) -> Result<(Vec<u8>, String)> {
    if !nvrtc_available() {
        return Err(Error::NoNvrtc);
    }
    let src = CString::new(kernel_source()).map_err(|_| Error::Compile {
        arch: arch.into(),
        options: String::new(),
        log: "kernel source contains a NUL byte".into(),
    })?;
    let name = CString::new("kiln_kernels.cu").map_err(|_| Error::NoNvrtc)?;
    let mut options = compile_options(arch, defines);
    options.extend_from_slice(extra);
    let fail = |log: String| Error::Compile {
        arch: arch.to_string(),
        options: options.join(" "),
        log,
    };
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| fail(format!("{e:?}")))?;
    // SAFETY: `prog` is a live program; options are plain strings.
    let compiled = unsafe { nvrtc::compile_program(prog, &options) };
    let out = match compiled {
        Err(e) => Err(fail(format!("{e:?}\n{}", program_log(prog)))),
        Ok(()) => get_cubin(prog)
            .map(|c| (c, program_log(prog)))
            .map_err(fail),
    };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    out
}

fn get_cubin(prog: nvrtc_sys::nvrtcProgram) -> std::result::Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully for a real architecture, so it has a cubin of `size` bytes.
    let r = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(format!("nvrtcGetCUBINSize: {r:?} (size {size})"));
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds `size` bytes.
    let r = unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcGetCUBIN: {r:?}"));
    }
    Ok(buf)
}

/// The cache key: a hash of the source, the options, the architecture, NVRTC's version and the driver's.
pub fn cache_key(arch: &str, defines: &[String], driver_version: i32) -> Result<String> {
    let (ma, mi) = nvrtc_version()?;
    let mut h = Sha256::new();
    h.update(kernel_source().as_bytes());
    for o in compile_options(arch, defines) {
        h.update(o.as_bytes());
        h.update([0]);
    }
    h.update(format!("{arch}|nvrtc {ma}.{mi}|driver {driver_version}").as_bytes());
    let d = h.finalize();
    Ok(d.iter().take(16).map(|b| format!("{b:02x}")).collect())
}

/// `$XDG_CACHE_HOME/kiln/kernels` or `~/.cache/kiln/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("kiln").join("kernels"))
}

/// The cubin for `arch` with `defines`: from the cache when a matching one exists, else compiled and stored.
/// Cache failures only cost a recompile (the returned warning says why).
pub fn cubin_cached(
    arch: &str,
    defines: &[String],
    driver_version: i32,
) -> Result<(Vec<u8>, bool, Option<String>)> {
    let key = cache_key(arch, defines, driver_version)?;
    let path = cache_dir().map(|d| d.join(format!("{key}.cubin")));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                return Ok((bytes, true, None));
            }
        }
    }
    let cubin = compile_cubin(arch, defines)?;
    let mut warning = None;
    if let Some(p) = &path {
        let write = || -> std::io::Result<()> {
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir)?;
            }
            // Write then rename, so a concurrent reader never sees half a file.
            let tmp = p.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &cubin)?;
            std::fs::rename(&tmp, p)
        };
        if let Err(source) = write() {
            warning = Some(
                Error::Cache {
                    path: p.display().to_string(),
                    source,
                }
                .to_string(),
            );
        }
    }
    Ok((cubin, false, warning))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_defines_split_at_semicolons_and_spaces() {
        assert_eq!(
            split_defines("-DGV_U=8;-DAT_U=2  -DAT_MIN_CHUNK=64;"),
            ["-DGV_U=8", "-DAT_U=2", "-DAT_MIN_CHUNK=64"]
        );
        assert!(split_defines(" ; ").is_empty());
    }

    #[test]
    fn host_reads_the_split_size_the_kernels_use() {
        // The host leaves out the merge launch for rows of at most this many positions: it must be the kernels'.
        assert_eq!(source_define("AT_MIN_CHUNK"), 128);
        if std::env::var_os("KILN_CUDA_DEFINES").is_none() {
            assert_eq!(attn_min_chunk(), 128);
        }
    }

    #[test]
    fn host_reads_the_prep_row_limit_the_split_kernel_takes() {
        // attn_split's warps take the pass's positions in a span four apart, PREP_MAX_ROWS / 4 each at most.
        let n = source_define("PREP_MAX_ROWS");
        assert!(n >= 4 && n.is_multiple_of(4), "PREP_MAX_ROWS {n}");
        if std::env::var_os("KILN_CUDA_DEFINES").is_none() {
            assert_eq!(tuned_define("PREP_MAX_ROWS"), n);
        }
    }

    #[test]
    fn kill_switches_inside_kernels_become_defines() {
        assert!(option_defines(&crate::Options::default()).is_empty());
        let off = crate::Options {
            gemv_stage: false,
            early_weights: false,
            block_ring: false,
            ..crate::Options::default()
        };
        assert_eq!(
            option_defines(&off),
            ["-DGV_STAGE_MAXW=0", "-DGV_EARLY_W=0", "-DB16D_RING=0"]
        );
        // Each define names a macro the kernels test with #ifndef (a typo would silently change nothing).
        let src = kernel_source();
        for d in option_defines(&off) {
            let name = d.trim_start_matches("-D").split('=').next().unwrap();
            assert!(src.contains(&format!("#ifndef {name}\n")), "{name}");
        }
    }

    #[test]
    fn arch_names() {
        assert_eq!(arch_name(9, 0), "sm_90a");
        assert_eq!(arch_name(8, 6), "sm_86");
        assert_eq!(arch_name(10, 0), "sm_100a");
    }

    #[test]
    fn dynamic_shared_memory_sizes_come_from_the_source() {
        assert_eq!(dynamic_smem("mmq_q4_k8"), 64000);
        assert_eq!(dynamic_smem("moe_mmq_q8_0"), 79872);
        assert_eq!(dynamic_smem("gemv16_k8"), 97280);
        assert_eq!(dynamic_smem("gemv16_k8_o16"), 66304);
        assert_eq!(dynamic_smem("gemv16_k8d"), 0);
        assert_eq!(dynamic_smem("gemv16_k8d_n8"), 0);
        assert_eq!(dynamic_smem("attn_flash_h128"), 69632);
        assert_eq!(dynamic_smem("gemv_r1"), 0);
        // Every sized kernel exists and stays within the 227 KB a block may have on sm_90.
        for k in KERNEL_NAMES {
            assert!(dynamic_smem(k) <= 227 * 1024, "{k}");
        }
    }

    #[test]
    fn every_kernel_name_is_defined_in_the_source() {
        let src = kernel_source();
        // A kernel is declared directly or instantiated by a `..._KERNEL(name, ...)` macro.
        for k in KERNEL_NAMES {
            let decl = format!(" {k}(");
            let inst = format!("_KERNEL({k},");
            assert!(
                src.lines()
                    .any(|l| (l.contains("__global__") && l.contains(&decl))
                        || (l.starts_with(|c: char| c.is_ascii_uppercase()) && l.contains(&inst))),
                "kernel {k} missing from the sources"
            );
        }
    }

    #[test]
    fn kernel_type_ids_are_the_gguf_ids() {
        // quant.cu switches on `#define T_<TYPE> <id>`; the host passes `GgmlType::id()`.
        let src = kernel_source();
        let mut n = 0;
        for line in src.lines() {
            let Some(rest) = line.strip_prefix("#define T_") else {
                continue;
            };
            let mut it = rest.split_whitespace();
            let (name, id) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            let ty = kiln_quant::GgmlType::from_name(name)
                .unwrap_or_else(|| panic!("T_{name} is not a GGML type name"));
            assert_eq!(id.parse::<u32>().ok(), Some(ty.id()), "T_{name}");
            n += 1;
        }
        assert_eq!(n, 13, "every supported type has a define");
    }

    #[test]
    fn k8_pseudo_ids_match_the_host() {
        let src = kernel_source();
        for ty in ["Q4_K", "Q6_K", "Q8_0"] {
            let def = format!(
                "#define K8_{ty} (T_{ty} + {})",
                crate::device::K8_TYPE_OFFSET
            );
            assert!(src.contains(&def), "{def}");
        }
    }

    #[test]
    fn every_kernel_waits_for_the_previous_one_first() {
        // Kernels are launched early (programmatic dependent launch): each must wait before any other statement.
        let src = kernel_source();
        let mut kernels = 0;
        for (at, _) in src.match_indices("__global__") {
            let body = &src[at + src[at..].find('{').unwrap() + 1..];
            let first = body
                .trim_start_matches(|c: char| c.is_whitespace() || c == '\\')
                .split(';')
                .next()
                .unwrap();
            let name = src[at..].split('(').next().unwrap();
            // The GEMV kernels' gemv_block waits first, except in the K8 bodies, which load their first weights
            // before the wait (GV_FIRST_WEIGHTS); before it, the GEMV kernels issue their L2 prefetch of later
            // weights (no memory access of this launch's); the K8 block kernels' b16_k8 waits first: checked below.
            let first = first
                .strip_prefix("l2_prefetch_share(pf0, pn0, pf1, pn1)")
                .map(|_| {
                    body.split(';')
                        .nth(1)
                        .unwrap()
                        .trim_start_matches(|c: char| c.is_whitespace() || c == '\\')
                })
                .unwrap_or(first);
            assert!(
                first == "wait_prior_kernel()"
                    || first.starts_with("gemv_block<")
                    || first.starts_with("b16_k8<")
                    || first.starts_with("b16d_k8<")
                    || first.starts_with("b16d_q8_job<"),
                "{name}: {first}"
            );
            kernels += 1;
        }
        assert!(kernels >= 40, "{kernels} kernels found");
        let gemv_block = &src[src.find("void gemv_block(").unwrap()..];
        let gemv_block = &gemv_block[..gemv_block.find("\n}").unwrap()];
        assert!(gemv_block.contains("if (!K8) wait_prior_kernel();"));
        // The prefetch reads nothing: it takes its kernel's prefetch arguments and the grid's shape alone.
        let pf = &src[src.find("void l2_prefetch_share(").unwrap()..];
        let pf = &pf[..pf.find("\n}").unwrap()];
        for name in ["out", "xq", "kq", "w0", "w["] {
            assert!(!pf.contains(name), "l2_prefetch_share reads {name}");
        }
        for body in ["gemv_q4k8_body(", "gemv_q6k8_body("] {
            let text = &src[src.find(body).unwrap()..];
            let text = &text[..text.find("\n}").unwrap()];
            // What runs before the wait: the weight loads only (no activation, scale or output access).
            let (before, _) = text.split_once("GV_FIRST_WEIGHTS(load(0),").expect(body);
            let load = &before[before.find("auto load = [&]").expect(body)..];
            for name in ["kq", "kd", "ks", "dd", "out"] {
                assert!(!load.contains(name), "{body} reads {name} before the wait");
            }
            assert_eq!(text.matches("GV_FIRST_WEIGHTS").count(), 1, "{body}");
        }
        // The K8 block kernels' bodies start with the wait too (they launch after the kernel before them).
        let b16_k8 = &src[src.find("void b16_k8(").unwrap()..];
        let b16_k8 = &b16_k8[b16_k8.find('{').unwrap() + 1..];
        assert!(b16_k8.trim_start().starts_with("wait_prior_kernel();"));
        // The direct one loads its first weights before the wait (b16d_pipeline), and nothing else: its weight
        // loaders read the weights alone.
        let pipe = &src[src.find("void b16d_pipeline(").unwrap()..];
        let (before, _) = pipe.split_once("wait_prior_kernel();").unwrap();
        let before = &before[before.find('{').unwrap()..];
        assert_eq!(before.matches("load_").count(), 1, "{before}");
        assert!(before.contains("load_w(wa, 0)"), "{before}");
        // With the ring (B16D_RING, the default) its copies go first instead (b16d_ring), and they too read the
        // weights alone.
        let ring = &src[src.find("void b16d_ring(").unwrap()..];
        let (before, _) = ring.split_once("wait_prior_kernel();").unwrap();
        let before = &before[before.find('{').unwrap()..];
        assert!(
            before.contains("issue(s)") && !before.contains("load_"),
            "{before}"
        );
        for body in ["void b16d_q4k(", "void b16d_q6k("] {
            let text = &src[src.find(body).unwrap()..];
            for (lambda, end, load) in [
                ("auto load_w = [&]", "\n    };", "__ldg"),
                ("auto issue = [&]", "};", "copies.issue("),
            ] {
                let code = &text[text.find(lambda).expect(body)..];
                let code = &code[..code.find(end).expect(body)];
                let words: Vec<&str> = code
                    .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                    .collect();
                for name in ["kq", "kd", "ks", "out", "ex"] {
                    assert!(
                        !words.contains(&name),
                        "{body}: {lambda} reads {name} before the wait"
                    );
                }
                assert!(code.contains(load), "{body}: {lambda}");
            }
        }
    }

    #[test]
    fn source_needs_no_headers() {
        assert!(!kernel_source().contains("#include"));
    }
}
