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
