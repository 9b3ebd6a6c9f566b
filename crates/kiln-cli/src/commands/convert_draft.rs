//! `kiln convert-draft DIR -o draft.gguf [--type bf16|f16|f32|q8_0 …]`: a z-lab DFlash drafter directory
//! (config.json + model.safetensors) as one GGUF, matrices optionally quantized; `kiln run --draft` loads either.

use anyhow::{anyhow, Context, Result};
use kiln_quant::GgmlType;
use std::path::PathBuf;

/// Arguments of `kiln convert-draft`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The drafter directory (config.json + model.safetensors).
    pub dir: PathBuf,
    /// Output GGUF file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Type of the matrices (norms stay f32): bf16 (lossless for a bf16 checkpoint), f16, f32, q8_0, …
    #[arg(long = "type", default_value = "bf16")]
    pub ty: String,
}

/// `kiln convert-draft`.
pub fn run(args: Args) -> Result<()> {
    let ty = GgmlType::from_name(&args.ty)
        .ok_or_else(|| anyhow!("unknown tensor type '{}'", args.ty))?;
    let kept = kiln_engine::dflash::convert_to_gguf(&args.dir, &args.output, ty)
        .with_context(|| format!("converting {}", args.dir.display()))?;
    if kept > 0 {
        eprintln!(
            "kiln: {kept} matrices kept in f32 ({} blocks do not divide their rows)",
            ty.name()
        );
    }
    eprintln!("kiln: wrote {}", args.output.display());
    Ok(())
}
