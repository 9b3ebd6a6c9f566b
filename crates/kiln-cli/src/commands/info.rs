//! `kiln info FILE`.

use std::path::PathBuf;

/// Arguments of `kiln info`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file.
    pub file: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::bail!("kiln info is not built yet ({})", args.file.display())
}
