//! Prometheus metrics: request counts by route and status, time to first token, and the scheduler's counters
//! (queue depth, busy slots, prompt/generated/reused tokens, tokens per second), rendered as text format 0.0.4.

use kiln_engine::scheduler::Stats;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Upper bounds (seconds) of the time-to-first-token histogram.
const TTFT_BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    ttft_counts: [u64; TTFT_BUCKETS.len()],
    ttft_sum: f64,
    ttft_n: u64,
    disconnects: u64,
}

/// The server's own counters (the scheduler keeps the engine's).
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Counters stay consistent under a poisoned lock (each update is one field).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one response.
    pub fn request(&self, route: &str, status: u16) {
        *self
            .lock()
            .requests
            .entry((route.to_string(), status))
            .or_default() += 1;
    }

    /// Records a time to first token.
    pub fn ttft(&self, secs: f64) {
        let mut m = self.lock();
        for (i, &b) in TTFT_BUCKETS.iter().enumerate() {
            if secs <= b {
                m.ttft_counts[i] += 1;
            }
        }
        m.ttft_sum += secs;
        m.ttft_n += 1;
    }

    /// Counts a generation whose client went away before it finished.
    pub fn disconnect(&self) {
        self.lock().disconnects += 1;
    }

    /// The text exposition; `stats` is `None` while the model loads.
    pub fn render(&self, stats: Option<&Stats>) -> String {
        let m = self.lock();
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(
            s,
            "# HELP kiln_requests_total HTTP responses by route and status."
        );
        let _ = writeln!(s, "# TYPE kiln_requests_total counter");
        for ((route, status), n) in &m.requests {
            let _ = writeln!(
                s,
                "kiln_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let _ = writeln!(s, "# HELP kiln_client_disconnects_total Generations cancelled because the client went away.");
        let _ = writeln!(s, "# TYPE kiln_client_disconnects_total counter");
        let _ = writeln!(s, "kiln_client_disconnects_total {}", m.disconnects);
        let _ = writeln!(s, "# HELP kiln_time_to_first_token_seconds From request arrival to the first generated token.");
        let _ = writeln!(s, "# TYPE kiln_time_to_first_token_seconds histogram");
        for (b, n) in TTFT_BUCKETS.iter().zip(m.ttft_counts) {
            let _ = writeln!(
                s,
                "kiln_time_to_first_token_seconds_bucket{{le=\"{b}\"}} {n}"
            );
        }
        let _ = writeln!(
            s,
            "kiln_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}",
            m.ttft_n
        );
        let _ = writeln!(s, "kiln_time_to_first_token_seconds_sum {}", m.ttft_sum);
        let _ = writeln!(s, "kiln_time_to_first_token_seconds_count {}", m.ttft_n);
        let _ = writeln!(s, "# HELP kiln_ready Whether the model is loaded.");
        let _ = writeln!(s, "# TYPE kiln_ready gauge");
        let _ = writeln!(s, "kiln_ready {}", u8::from(stats.is_some()));
        if let Some(st) = stats {
            let gauges: [(&str, &str, f64); 4] = [
                ("kiln_slots", "Sequence slots.", st.slots as f64),
                (
                    "kiln_slots_busy",
                    "Slots running a request.",
                    st.active as f64,
                ),
                (
                    "kiln_queue_depth",
                    "Requests waiting for a slot.",
                    st.queued as f64,
                ),
                (
                    "kiln_tokens_per_second",
                    "Generated tokens per second over the last 10 s.",
                    st.tokens_per_second,
                ),
            ];
            for (name, help, v) in gauges {
                let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
            }
            let counters: [(&str, &str, u64); 9] = [
                ("kiln_requests_submitted_total", "Generation requests accepted by the scheduler.", st.submitted),
                ("kiln_requests_finished_total", "Generation requests finished (any reason).", st.finished),
                ("kiln_prompt_tokens_total", "Prompt tokens of admitted requests.", st.prompt_tokens),
                (
                    "kiln_prompt_tokens_processed_total",
                    "Prompt tokens run through the model (the rest were reused from a slot's cache).",
                    st.prompt_tokens_processed,
                ),
                ("kiln_prompt_tokens_reused_total", "Prompt tokens served from a slot's cached prefix.", st.prompt_tokens_reused),
                ("kiln_generated_tokens_total", "Tokens generated.", st.generated_tokens),
                ("kiln_engine_steps_total", "Forward passes run by the scheduler.", st.steps),
                ("kiln_spec_rounds_total", "Speculative verify blocks run.", st.spec_rounds),
                ("kiln_spec_tokens_total", "Tokens emitted by speculative verify blocks (per round: tau).", st.spec_tokens),
            ];
            for (name, help, v) in counters {
                let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_counts_match() {
        let m = Metrics::default();
        m.ttft(0.02);
        m.ttft(3.0);
        m.request("/v1/chat/completions", 200);
        m.request("/v1/chat/completions", 200);
        let st = Stats {
            slots: 4,
            queued: 2,
            ..Stats::default()
        };
        let t = m.render(Some(&st));
        assert!(
            t.contains("kiln_time_to_first_token_seconds_bucket{le=\"0.01\"} 0"),
            "{t}"
        );
        assert!(t.contains("kiln_time_to_first_token_seconds_bucket{le=\"0.025\"} 1"));
        assert!(t.contains("kiln_time_to_first_token_seconds_bucket{le=\"5\"} 2"));
        assert!(t.contains("kiln_time_to_first_token_seconds_count 2"));
        assert!(t.contains("kiln_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2"));
        assert!(t.contains("kiln_queue_depth 2"));
        assert!(t.contains("kiln_slots 4"));
        assert!(m.render(None).contains("kiln_ready 0"));
    }
}
