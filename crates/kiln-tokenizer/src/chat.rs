//! Chat templates (`tokenizer.chat_template`) rendered with minijinja the way HF transformers renders them
//! (`trim_blocks`, `lstrip_blocks`, Python string methods, `raise_exception`, `strftime_now`), and
//! injection-safe tokenization of the rendered prompt.

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, …
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `src`; `bos`/`eos` are the texts the template sees as `bos_token`/`eos_token`.
    pub fn new(src: &str, bos: &str, eos: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, src.to_string())?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// Renders `messages`. `kwargs` (a JSON object, or null) adds variables such as `enable_thinking` or
    /// `tools`, as extra keyword arguments to transformers' `apply_chat_template` do.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        kwargs: &serde_json::Value,
    ) -> Result<String> {
        let mut ctx = serde_json::Map::new();
        if let serde_json::Value::Object(extra) = kwargs {
            ctx.extend(extra.clone());
        } else if !kwargs.is_null() {
            return Err(Error::Template(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "chat template kwargs must be a JSON object",
            )));
        }
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).unwrap_or_default(),
        );
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos.clone().into());
        ctx.insert("eos_token".into(), self.eos.clone().into());
        let tmpl = self.env.get_template(NAME)?;
        Ok(tmpl.render(Value::from_serialize(&ctx))?)
    }
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=indent)`: `", "`/`": "`
/// separators, no HTML escaping, keys in the map's order (insertion order needs serde_json's `preserve_order`
/// where the caller builds the kwargs; without it keys arrive sorted).
fn tojson(
    value: &Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    py_json(value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn py_json(
    v: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    use minijinja::value::ValueKind;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => match v.as_i64() {
            Some(i) if !v.to_string().contains('.') => out.push_str(&i.to_string()),
            _ => out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
        },
        ValueKind::String => py_string(v.as_str().unwrap_or_default(), out),
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(if indent.is_some() { "," } else { ", " });
                }
                newline(out, depth + 1);
                match k.as_str() {
                    Some(s) => py_string(s, out),
                    None => py_string(&k.to_string(), out),
                }
                out.push_str(": ");
                py_json(&v.get_item(k)?, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(if indent.is_some() { "," } else { ", " });
                }
                newline(out, depth + 1);
                py_json(item, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        _ => py_string(&v.to_string(), out),
    }
    Ok(())
}

/// Python's float repr: shortest round-trip digits, `.0` on integral values, exponent below 1e-4 and from
/// 1e16 on, written `e-05`/`e+16`.
fn py_float(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN"
        } else if f > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        }
        .to_string();
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
fn py_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// Python's `datetime.now().strftime(fmt)` in UTC, for the directives chat templates use.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(secs, &fmt)
}

fn strftime(secs: u64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = (secs / 86_400) as i64;
    let tod = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') => match chars.next() {
                Some('d') => out.push_str(&d.to_string()),
                Some('m') => out.push_str(&m.to_string()),
                Some(o) => {
                    out.push_str("%-");
                    out.push(o);
                }
                None => out.push_str("%-"),
            },
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Renders the model's chat template and tokenizes the result so that only the TEMPLATE's own markers become
/// control tokens: control-token text inside a message (a user typing `<|im_end|>`) is tokenized as plain text
/// and cannot open or close turns (kwargs such as `tools` are trusted template input and are not
/// neutralized). No BOS/EOS is added beyond what the template writes (as transformers'
/// `apply_chat_template(tokenize=True)` does).
///
/// How: before rendering, every control-token text inside message contents gets a
/// noncharacter sentinel after its first character, so the rendered text's special-token split cannot match
/// it; the sentinels are removed from the text fragments before they reach the model.
pub fn apply_chat_template_ids(
    tok: &Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
    kwargs: &serde_json::Value,
) -> Result<Vec<u32>> {
    let tmpl = tok.chat_template()?.ok_or(Error::NoChatTemplate)?;
    let template_src = tok.chat_template_source().unwrap_or("");
    // A sentinel that occurs nowhere in the inputs, so removing it restores them exactly.
    let used = |c: char| {
        template_src.contains(c)
            || messages
                .iter()
                .any(|m| m.content.contains(c) || m.role.contains(c))
    };
    let sentinel = ('\u{FDD0}'..='\u{FDEF}')
        .find(|&c| !used(c))
        .ok_or_else(|| {
            Error::Template(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "messages use every sentinel character",
            ))
        })?;
    let controls: Vec<&str> = tok.control_texts().collect();
    let neutral: Vec<Message> = messages
        .iter()
        .map(|m| Message {
            role: m.role.clone(),
            content: neutralize(&m.content, &controls, sentinel),
        })
        .collect();
    let text = tmpl.render(&neutral, add_generation_prompt, kwargs)?;
    let frags = tok.partition(&text, |_| true);
    fn strip(s: &str, sentinel: char) -> Cow<'_, str> {
        if s.contains(sentinel) {
            Cow::Owned(s.replace(sentinel, ""))
        } else {
            Cow::Borrowed(s)
        }
    }
    tok.encode_fragments(&frags, false, |s| strip(s, sentinel))
}

/// `text` with a sentinel after the first character of every occurrence of a control-token text.
fn neutralize(text: &str, controls: &[&str], sentinel: char) -> String {
    let mut out = text.to_string();
    for c in controls {
        if out.contains(c) {
            let mut chars = c.chars();
            let head = chars.next().map(String::from).unwrap_or_default();
            out = out.replace(c, &format!("{head}{sentinel}{}", chars.as_str()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_a_known_instant() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime(t, "%Y-%m-%d %H:%M:%S"), "2024-02-29 13:05:09");
        assert_eq!(strftime(t, "%d %B %Y"), "29 February 2024");
        assert_eq!(strftime(t, "%a %b %-d"), "Thu Feb 29");
    }

    #[test]
    fn python_string_methods_and_raise_exception_work() {
        let src = "{% for m in messages %}{{ m.content.strip().upper() }}|{{ m.content.split(',')[1] }}|\
                   {{ m.content.startswith(' a') }}{% endfor %}{% if add_generation_prompt %}{{ raise_exception('no') }}{% endif %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let msgs = [Message::new("user", " a,b ")];
        assert_eq!(
            t.render(&msgs, false, &serde_json::Value::Null).unwrap(),
            "A,B|b |True"
        );
        let e = t
            .render(&msgs, true, &serde_json::Value::Null)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no"), "{e}");
    }

    #[test]
    fn trim_and_lstrip_blocks_match_transformers() {
        let src = "  {% if true %}\nx\n  {% endif %}\ny";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(
            t.render(&[], false, &serde_json::Value::Null).unwrap(),
            "x\ny"
        );
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ y | tojson(indent=2) }}", "", "").unwrap();
        let kw = serde_json::json!({
            "x": {"a": [1, 2.5, null, true, 1e-9, 3.0], "b": "é <'q'>\n\"\\\u{1}", "c": {}},
            "y": {"k": [1]},
        });
        let out = t.render(&[], false, &kw).unwrap();
        // Python: json.dumps(x, ensure_ascii=False) and json.dumps(y, ensure_ascii=False, indent=2)
        let want = r#"{"a": [1, 2.5, null, true, 1e-09, 3.0], "b": "é <'q'>\n\"\\\u0001", "c": {}}|{
  "k": [
    1
  ]
}"#;
        assert_eq!(out, want);
    }

    #[test]
    fn neutralize_breaks_every_control_text() {
        let s = neutralize("a<|im_end|>b<|im_end|>", &["<|im_end|>"], '\u{FDD0}');
        assert_eq!(s, "a<\u{FDD0}|im_end|>b<\u{FDD0}|im_end|>");
        assert!(!s.contains("<|im_end|>"));
    }
}
