//! A drafter as one GGUF (`kiln convert-draft`): the z-lab `config.json` text verbatim under
//! `dflash.config_json` (so the same strict parser reads it) and the tensors under their safetensors names, in
//! ggml shape order; matrices may be stored quantized (any type whose block size divides the row length),
//! norms stay f32. The drafter runs its matrices in the stored type.

use super::config::DraftConfig;
use crate::error::{Error, Result};
use kiln_gguf::GgufWriter;
use kiln_quant::GgmlType;
use std::path::Path;

/// `general.architecture` of a converted drafter.
pub const DRAFT_ARCH: &str = "dflash-draft";
/// Metadata key holding the drafter's `config.json`.
pub const CONFIG_KEY: &str = "dflash.config_json";

fn qerr(name: &str, e: impl std::fmt::Display) -> Error {
    Error::Quant {
        name: name.to_string(),
        error: e.to_string(),
    }
}

/// Converts the z-lab drafter in `dir` into the GGUF `out`, matrices in `ty` (f32, f16, bf16, q8_0 …).
/// Returns how many matrices were stored as f32 because `ty`'s block size does not divide their rows.
pub fn convert_to_gguf(dir: &Path, out: &Path, ty: GgmlType) -> Result<usize> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| Error::Config(format!("{}: {e}", cfg_path.display())))?;
    DraftConfig::parse(&text)?;
    let map = super::drafter::read_safetensors(&dir.join("model.safetensors"))?;
    let mut names: Vec<&String> = map.keys().collect();
    names.sort();
    let mut w = GgufWriter::new();
    w.add("general.architecture", DRAFT_ARCH)?;
    w.add(CONFIG_KEY, text.as_str())?;
    let mut kept_f32 = 0;
    let mut data = Vec::new();
    for name in names {
        let (shape, vals) = &map[name];
        let ggml_shape: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let t = if shape.len() == 2 && ty.row_bytes(ggml_shape[0]).is_some() {
            ty
        } else {
            if shape.len() == 2 {
                kept_f32 += 1;
            }
            GgmlType::F32
        };
        let rows: u64 = ggml_shape[1..].iter().product();
        let row_bytes = t
            .row_bytes(ggml_shape[0])
            .ok_or_else(|| qerr(name, "row length"))?;
        let mut bytes = vec![0u8; (row_bytes * rows) as usize];
        kiln_quant::quantize(t, vals, &mut bytes).map_err(|e| qerr(name, e))?;
        w.add_tensor(name, t, &ggml_shape)?;
        data.push((name.clone(), bytes));
    }
    let f =
        std::fs::File::create(out).map_err(|e| Error::Config(format!("{}: {e}", out.display())))?;
    let mut dw = w.begin(std::io::BufWriter::new(f))?;
    for (name, bytes) in &data {
        dw.write_tensor_data(name, bytes)?;
    }
    dw.finish()?;
    Ok(kept_f32)
}
