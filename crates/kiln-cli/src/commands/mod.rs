//! One module per subcommand: `Args` (clap) and `run(args)`.

pub mod bench;
pub mod chat;
pub mod convert_draft;
pub mod info;
pub mod run;
pub mod score;
pub mod selftest;
pub mod serve;
pub mod synth;
pub mod tokenize;

/// `--draft-max`: at most N drafts a round, or `auto`: the count that measures fastest, chosen as the run goes
/// (from each block position's acceptance and a round's wall time; output unchanged either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftMax {
    Auto,
    At(usize),
}

impl std::str::FromStr for DraftMax {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(DraftMax::Auto),
            t => t
                .parse()
                .map(DraftMax::At)
                .map_err(|_| format!("'{s}' is not a draft count (N ≥ 1) or 'auto'")),
        }
    }
}

impl DraftMax {
    /// Sets `drafter` to propose this many drafts a round (`auto`: up to its whole block).
    pub fn apply(self, drafter: &mut kiln_engine::dflash::Drafter) -> anyhow::Result<()> {
        use anyhow::Context;
        match self {
            DraftMax::Auto => {
                let all = drafter.config().block_size - 1;
                drafter.set_max_drafts(all).context("--draft-max")?;
                drafter.set_auto_drafts(true);
            }
            DraftMax::At(k) => {
                drafter.set_auto_drafts(false);
                drafter.set_max_drafts(k).context("--draft-max")?;
            }
        }
        Ok(())
    }

    /// The bench table's name of the setting: `maxN` or `auto`.
    pub fn label(self) -> String {
        match self {
            DraftMax::Auto => "auto".into(),
            DraftMax::At(k) => format!("max{k}"),
        }
    }
}
