//! One module per subcommand: `Args` (clap) and `run(args)`.

pub mod info;
pub mod tokenize;
pub mod synth;
pub mod serve;
