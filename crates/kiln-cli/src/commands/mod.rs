//! One module per subcommand: `Args` (clap) and `run(args)`.

pub mod bench;
pub mod info;
pub mod score;
pub mod tokenize;
pub mod synth;
pub mod serve;
