//! Rendering measurement records as llama-bench does: a Markdown table, CSV with a header row, or a JSON array
//! of flat objects (one per test), so scripts written for llama-bench's output need few changes.
//!
//! Numbers that could not be measured (NaN) are empty CSV fields and JSON `null`.

use crate::bench::frontier::FrontierRecord;
use crate::bench::runs::{ModelInfo, TestSpec};
use crate::bench::stats::Stats;

/// One test's measurements on one model.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRecord {
    /// The model.
    pub model: ModelInfo,
    /// Backend name as printed (`CPU`, `CUDA`).
    pub backend: String,
    /// Worker threads.
    pub threads: usize,
    /// Prefill chunk (rows per forward pass).
    pub batch: usize,
    /// The test.
    pub test: TestSpec,
    /// Seconds of each timed run.
    pub seconds: Vec<f64>,
}

impl BenchRecord {
    /// Tokens per second of each run.
    pub fn tps(&self) -> Vec<f64> {
        let n = self.test.tokens() as f64;
        self.seconds.iter().map(|s| n / s).collect()
    }
    /// Statistics of the runs' tokens per second.
    pub fn tps_stats(&self) -> Stats {
        Stats::of(&self.tps())
    }
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Markdown table.
    Md,
    /// Comma-separated values with a header.
    Csv,
    /// A JSON array of objects.
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "md" => Ok(Format::Md),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            o => Err(format!("unknown output format '{o}' (md, csv or json)")),
        }
    }
}

/// `93.81 MiB`, `4.68 GiB`.
pub fn human_size(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    }
}

/// `134.52 M`, `8.19 B`.
pub fn human_params(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else {
        format!("{:.2} M", n / 1e6)
    }
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A JSON number, `null` for NaN and infinities (which JSON cannot hold).
pub fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

/// A CSV field, quoted when it holds a comma, quote or line break.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        String::new()
    }
}

/// A Markdown table with right-aligned numeric columns, widths fitted to the content.
fn md_table(header: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let w: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let mut s = String::from("|");
        for (c, cell) in cells.iter().enumerate() {
            let pad = w[c] - cell.chars().count();
            if right[c] {
                s += &format!(" {}{} |", " ".repeat(pad), cell);
            } else {
                s += &format!(" {}{} |", cell, " ".repeat(pad));
            }
        }
        s + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out += "|";
    for (c, &wc) in w.iter().enumerate() {
        out += &if right[c] {
            format!(" {}: |", "-".repeat(wc - 1))
        } else {
            format!(" {} |", "-".repeat(wc))
        };
    }
    out += "\n";
    for r in rows {
        out += &line(r.clone());
    }
    out
}

/// The CSV/JSON field names of [`render_bench`], in order.
pub const BENCH_FIELDS: &[&str] = &[
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "backend",
    "n_threads",
    "n_batch",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test",
    "avg_ts",
    "stddev_ts",
    "median_ts",
    "samples_ts",
];

/// Renders llama-bench-style records.
pub fn render_bench(records: &[BenchRecord], format: Format) -> String {
    match format {
        Format::Md => {
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|r| {
                    let s = r.tps_stats();
                    vec![
                        r.model.desc.clone(),
                        human_size(r.model.size_bytes),
                        human_params(r.model.n_params),
                        r.backend.clone(),
                        r.threads.to_string(),
                        r.test.name(),
                        format!("{:.2} ± {:.2}", s.mean, s.sd),
                    ]
                })
                .collect();
            md_table(
                &[
                    "model", "size", "params", "backend", "threads", "test", "t/s",
                ],
                &[false, true, true, false, true, true, true],
                &rows,
            )
        }
        Format::Csv => {
            let mut o = BENCH_FIELDS.join(",") + "\n";
            for r in records {
                let s = r.tps_stats();
                let samples: Vec<String> = r.tps().iter().map(|x| csv_num(*x)).collect();
                let f = [
                    csv_field(&r.model.filename),
                    csv_field(&r.model.desc),
                    r.model.size_bytes.to_string(),
                    r.model.n_params.to_string(),
                    csv_field(&r.backend),
                    r.threads.to_string(),
                    r.batch.to_string(),
                    r.test.n_prompt.to_string(),
                    r.test.n_gen.to_string(),
                    r.test.depth.to_string(),
                    csv_field(&r.test.name()),
                    csv_num(s.mean),
                    csv_num(s.sd),
                    csv_num(s.median),
                    csv_field(&samples.join(" ")),
                ];
                o += &(f.join(",") + "\n");
            }
            o
        }
        Format::Json => {
            let objs: Vec<String> = records
                .iter()
                .map(|r| {
                    let s = r.tps_stats();
                    let samples: Vec<String> = r.tps().iter().map(|x| json_num(*x)).collect();
                    let v = [
                        json_str(&r.model.filename),
                        json_str(&r.model.desc),
                        r.model.size_bytes.to_string(),
                        r.model.n_params.to_string(),
                        json_str(&r.backend),
                        r.threads.to_string(),
                        r.batch.to_string(),
                        r.test.n_prompt.to_string(),
                        r.test.n_gen.to_string(),
                        r.test.depth.to_string(),
                        json_str(&r.test.name()),
                        json_num(s.mean),
                        json_num(s.sd),
                        json_num(s.median),
                        format!("[{}]", samples.join(", ")),
                    ];
                    json_object(BENCH_FIELDS, &v)
                })
                .collect();
            json_array(&objs)
        }
    }
}

fn json_object(keys: &[&str], values: &[String]) -> String {
    let fields: Vec<String> = keys
        .iter()
        .zip(values)
        .map(|(k, v)| format!("{}: {v}", json_str(k)))
        .collect();
    format!("{{{}}}", fields.join(", "))
}

fn json_array(objs: &[String]) -> String {
    if objs.is_empty() {
        return "[]\n".into();
    }
    format!("[\n  {}\n]\n", objs.join(",\n  "))
}

/// The CSV/JSON field names of [`render_frontiers`], in order (ds4-bench's columns).
pub const FRONTIER_FIELDS: &[&str] = &[
    "ctx_tokens",
    "prefill_tokens",
    "prefill_tps",
    "gen_tokens",
    "gen_tps",
    "gen_first_ms",
    "gen_steady_tokens",
    "gen_steady_tps",
    "kvcache_bytes",
];

/// Renders frontier records.
pub fn render_frontiers(records: &[FrontierRecord], format: Format) -> String {
    let cells = |r: &FrontierRecord, num: &dyn Fn(f64) -> String| {
        vec![
            r.ctx_tokens.to_string(),
            r.prefill_tokens.to_string(),
            num(r.prefill_tps()),
            r.gen_tokens.to_string(),
            num(r.gen_tps()),
            num(r.gen_first_ms()),
            r.gen_steady_tokens().to_string(),
            num(r.gen_steady_tps()),
            r.kvcache_bytes.to_string(),
        ]
    };
    match format {
        Format::Md => {
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|r| {
                    cells(r, &|x| {
                        if x.is_finite() {
                            format!("{x:.2}")
                        } else {
                            "-".into()
                        }
                    })
                })
                .collect();
            md_table(FRONTIER_FIELDS, &[true; 9], &rows)
        }
        Format::Csv => {
            let mut o = FRONTIER_FIELDS.join(",") + "\n";
            for r in records {
                o += &(cells(r, &csv_num).join(",") + "\n");
            }
            o
        }
        Format::Json => {
            let objs: Vec<String> = records
                .iter()
                .map(|r| json_object(FRONTIER_FIELDS, &cells(r, &json_num)))
                .collect();
            json_array(&objs)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> BenchRecord {
        BenchRecord {
            model: ModelInfo {
                filename: "a,b.gguf".into(),
                desc: "llama 135M Q4_1".into(),
                size_bytes: 98_362_432,
                n_params: 134_515_008,
            },
            backend: "CPU".into(),
            threads: 2,
            batch: 64,
            test: TestSpec {
                n_prompt: 0,
                n_gen: 10,
                depth: 16,
            },
            seconds: vec![0.5, 1.0],
        }
    }

    #[test]
    fn bench_md_csv_json_shape() {
        let r = record();
        assert_eq!(r.tps(), [20.0, 10.0]);
        let md = render_bench(std::slice::from_ref(&r), Format::Md);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("| model "));
        assert!(lines[1].starts_with("| ---"));
        assert!(lines[2].contains("| 93.81 MiB |"), "{md}");
        assert!(lines[2].contains("134.52 M"));
        assert!(lines[2].contains("tg10 @ d16"));
        assert!(lines[2].contains("15.00 ± 7.07"), "{md}");
        // Every row has as many cells as the header.
        let bars = |l: &str| l.matches('|').count();
        assert!(lines.iter().all(|l| bars(l) == bars(lines[0])));

        let csv = render_bench(std::slice::from_ref(&r), Format::Csv);
        let rows: Vec<&str> = csv.lines().collect();
        assert_eq!(rows[0].split(',').count(), BENCH_FIELDS.len());
        assert!(rows[1].starts_with(
            "\"a,b.gguf\",llama 135M Q4_1,98362432,134515008,CPU,2,64,0,10,16,tg10 @ d16,15,"
        ));
        assert!(rows[1].ends_with(",15,20 10"), "{}", rows[1]);

        let json = render_bench(&[r], Format::Json);
        assert!(json.starts_with("[\n  {\"model_filename\": \"a,b.gguf\""));
        assert!(json.contains("\"avg_ts\": 15, "));
        assert!(json.contains("\"samples_ts\": [20, 10]}"));
        assert_eq!(render_bench(&[], Format::Json), "[]\n");
    }

    #[test]
    fn frontier_shapes_and_nan() {
        let r = FrontierRecord {
            ctx_tokens: 64,
            prefill_tokens: 48,
            prefill_s: 0.5,
            gen_tokens: 1,
            gen_s: 0.25,
            gen_first_s: 0.25,
            kvcache_bytes: 4096,
        };
        let csv = render_frontiers(&[r], Format::Csv);
        assert_eq!(
            csv,
            "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,gen_first_ms,gen_steady_tokens,\
             gen_steady_tps,kvcache_bytes\n64,48,96,1,4,250,0,,4096\n"
        );
        let json = render_frontiers(&[r], Format::Json);
        assert!(json.contains("\"gen_steady_tps\": null"));
        let md = render_frontiers(&[r], Format::Md);
        assert!(md.lines().nth(2).unwrap().contains(" - |"));
    }

    #[test]
    fn escaping() {
        assert_eq!(json_str("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
        assert_eq!(json_num(f64::NAN), "null");
        assert_eq!(json_num(1.5), "1.5");
        assert_eq!(csv_field("x\"y"), "\"x\"\"y\"");
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(human_size(5 << 30), "5.00 GiB");
        assert_eq!(human_params(8_190_000_000), "8.19 B");
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert!("xml".parse::<Format>().is_err());
    }
}
