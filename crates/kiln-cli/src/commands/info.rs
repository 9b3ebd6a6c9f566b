//! `kiln info FILE`: a GGUF file's identity, hyperparameters, tokenizer and quantization mix. The numbers come
//! from `kiln_gguf::Summary`; this module only lays them out.

use anyhow::Context;
use kiln_gguf::{GgufFile, Summary};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `kiln info`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (optional with --flags).
    #[arg(required_unless_present = "flags")]
    pub file: Option<PathBuf>,
    /// Also list every metadata key with its type and value (long arrays abbreviated).
    #[arg(long)]
    pub metadata: bool,
    /// Also list every tensor: name, type, shape (ggml order, row length first), bytes.
    #[arg(long)]
    pub tensors: bool,
    /// List every kill switch (`KILN_NO_*`): what it disables, its default and its value in this environment.
    #[arg(long)]
    pub flags: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Some(path) = args.file.as_ref() else {
        return print_flags();
    };
    let file = GgufFile::open(path).with_context(|| path.display().to_string())?;
    let s = Summary::of(&file);
    let mut out = std::io::stdout().lock();
    let w = &mut out;

    let label = |w: &mut dyn Write, k: &str, v: &dyn std::fmt::Display| writeln!(w, "{k:<14}{v}");
    label(w, "file", &path.display())?;
    label(
        w,
        "size",
        &format!("{} ({} bytes)", human_bytes(s.file_size), s.file_size),
    )?;
    label(
        w,
        "gguf",
        &format!(
            "version {}, alignment {}, {} metadata keys",
            s.version,
            file.alignment(),
            file.metadata().len()
        ),
    )?;
    label(w, "architecture", &or_dash(s.architecture.as_deref()))?;
    label(w, "name", &or_dash(s.name.as_deref()))?;

    if !s.hparams.is_empty() {
        writeln!(w, "hyperparameters")?;
        let width = s.hparams.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in &s.hparams {
            writeln!(w, "  {k:<width$}  {v}")?;
        }
    }

    let mut tok = or_dash(s.tokenizer_model.as_deref()).to_owned();
    if let Some(pre) = &s.tokenizer_pre {
        tok += &format!(" (pre: {pre})");
    }
    if let Some(n) = s.vocab_size {
        tok += &format!(", {n} tokens");
    }
    label(w, "tokenizer", &tok)?;
    label(
        w,
        "tensors",
        &format!(
            "{}, {} parameters ({}), {} of data",
            s.tensor_count,
            human_count(s.parameter_count),
            s.parameter_count,
            human_bytes(s.tensor_bytes)
        ),
    )?;

    if !s.quant_mix.is_empty() {
        writeln!(w, "quant mix")?;
        writeln!(
            w,
            "  {:<8} {:>7} {:>14} {:>12} {:>6}",
            "type", "tensors", "parameters", "bytes", "%"
        )?;
        for q in &s.quant_mix {
            let pct = 100.0 * q.bytes as f64 / s.tensor_bytes.max(1) as f64;
            writeln!(
                w,
                "  {:<8} {:>7} {:>14} {:>12} {:>6.2}",
                q.ty.name(),
                q.tensors,
                q.elements,
                human_bytes(q.bytes),
                pct
            )?;
        }
    }

    if args.metadata {
        writeln!(w, "metadata")?;
        let width = file
            .metadata()
            .iter()
            .map(|(k, _)| k.len())
            .max()
            .unwrap_or(0);
        for (k, v) in file.metadata().iter() {
            // One line per key, whatever the value holds (chat templates span many lines).
            let text: String = v
                .to_string()
                .chars()
                .flat_map(|c| {
                    let e: Vec<char> = if c.is_control() {
                        c.escape_default().collect()
                    } else {
                        vec![c]
                    };
                    e
                })
                .collect();
            let text = truncate(&text, 120);
            writeln!(w, "  {k:<width$}  {:<16} {text}", v.type_name())?;
        }
    }
    if args.tensors {
        writeln!(w, "tensors")?;
        let width = file
            .tensors()
            .iter()
            .map(|t| t.name.len())
            .max()
            .unwrap_or(0);
        for t in file.tensors() {
            let shape = format!("{:?}", t.shape);
            writeln!(
                w,
                "  {:<width$}  {:<8} {:<22} {:>12}",
                t.name,
                t.ty.name(),
                shape,
                t.size
            )?;
        }
    }
    w.flush()?;
    drop(out);
    if args.flags {
        print_flags()?;
    }
    Ok(())
}

/// The kill-switch registry as a table; each current value is parsed exactly as start-up parses it.
fn print_flags() -> anyhow::Result<()> {
    use kiln_engine::flags::{Flags, REGISTRY};
    let (_, warnings) = Flags::from_env();
    let mut out = std::io::stdout().lock();
    let width = REGISTRY.iter().map(|f| f.env.len()).max().unwrap_or(4);
    let state = |on: bool| if on { "on" } else { "off" };
    writeln!(
        out,
        "{:<width$}  default  current  disables (set to 1 to fall back)",
        "flag"
    )?;
    for f in REGISTRY {
        let current = match std::env::var(f.env) {
            Ok(v) => Flags::from_lookup(&[(f.env.to_string(), v)]).0 == Flags::default(),
            Err(_) => f.default_on,
        };
        let disables = f.disables.split_whitespace().collect::<Vec<_>>().join(" ");
        writeln!(
            out,
            "{:<width$}  {:<7}  {:<7}  {disables}",
            f.env,
            state(f.default_on),
            state(current)
        )?;
    }
    for w in warnings {
        eprintln!("kiln: warning: {w}");
    }
    Ok(())
}

fn or_dash(s: Option<&str>) -> &str {
    s.unwrap_or("-")
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Bytes in binary units: "93.81 MiB".
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Counts with a decimal suffix: "134.52M".
fn human_count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.2}K", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}M", n as f64 / 1e6),
        _ => format!("{:.2}B", n as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(98_362_432), "93.81 MiB");
        assert_eq!(human_count(134_515_008), "134.52M");
        assert_eq!(human_count(8_030_261_248), "8.03B");
        assert_eq!(truncate("abcdef", 3), "abc…");
        assert_eq!(truncate("ab", 3), "ab");
    }
}
