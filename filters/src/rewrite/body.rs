//! Rewriting a request body's `model`: the top-level `"model"` string value is replaced by
//! the target's JSON string and every other byte is kept, so the engine reads the body the
//! client wrote with only the model changed. A body the scanner cannot follow is
//! re-serialised instead (same members, the gateway's formatting).

use serde_json::Value;

/// `body` with its top-level `model` set to `target`, or `None` if the body is not a JSON
/// object with a string `model`.
pub fn rewrite_model(body: &[u8], target: &str) -> Option<Vec<u8>> {
    let replacement = serde_json::to_string(target).ok()?;
    if let Some(spans) = model_value_spans(body) {
        if !spans.is_empty() {
            let mut out = Vec::with_capacity(body.len() + replacement.len());
            let mut from = 0;
            for (start, end) in spans {
                out.extend_from_slice(body.get(from..start)?);
                out.extend_from_slice(replacement.as_bytes());
                from = end;
            }
            out.extend_from_slice(body.get(from..)?);
            return Some(out);
        }
    }
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let model = value.as_object_mut()?.get_mut("model")?;
    if !model.is_string() {
        return None;
    }
    *model = Value::String(target.to_owned());
    serde_json::to_vec(&value).ok()
}

/// The byte spans of every top-level `"model"` member's string value (a repeated member
/// is replaced everywhere, whichever one a parser keeps); `None` if the scanner cannot
/// follow the text.
fn model_value_spans(body: &[u8]) -> Option<Vec<(usize, usize)>> {
    let mut s = Scanner { body, at: 0 };
    s.ws();
    s.expect(b'{')?;
    let mut spans = Vec::new();
    s.ws();
    if s.peek() == Some(b'}') {
        return Some(spans);
    }
    loop {
        s.ws();
        let (key_start, key_end) = s.string()?;
        let key = body.get(key_start..key_end)?;
        let is_model = key == b"\"model\""
            || (key.contains(&b'\\')
                && serde_json::from_slice::<String>(key).ok().as_deref() == Some("model"));
        s.ws();
        s.expect(b':')?;
        s.ws();
        let value_start = s.at;
        let is_string = s.peek() == Some(b'"');
        s.value()?;
        if is_model {
            if !is_string {
                return None;
            }
            spans.push((value_start, s.at));
        }
        s.ws();
        match s.next()? {
            b',' => continue,
            b'}' => break,
            _ => return None,
        }
    }
    Some(spans)
}

/// A forward-only cursor over JSON text that skips values without building them.
struct Scanner<'a> {
    body: &'a [u8],
    at: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.body.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A string, quotes included: its span.
    fn string(&mut self) -> Option<(usize, usize)> {
        let start = self.at;
        self.expect(b'"')?;
        loop {
            match self.next()? {
                b'"' => return Some((start, self.at)),
                b'\\' => {
                    self.next()?;
                }
                _ => {}
            }
        }
    }

    /// Any value: strings skipped as strings, containers by depth, scalars to the next
    /// delimiter.
    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth = depth.checked_sub(1)?;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                let start = self.at;
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.at += 1;
                }
                (self.at > start).then_some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_the_model_value_changes() {
        let body = br#"{ "messages": [{"role":"user","content":"say \"model\": x"}],
  "model" : "support-assistant",  "stream":true, "n": 1.5e3}"#;
        let out = rewrite_model(body, "support-assistant-v2").unwrap();
        let expected = String::from_utf8_lossy(body)
            .replace("\"support-assistant\"", "\"support-assistant-v2\"");
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    #[test]
    fn nested_models_and_escapes_are_left_alone() {
        let body = br#"{"metadata":{"model":"inner"},"model":"a\"b","tools":[{"model":"t"}]}"#;
        let out = rewrite_model(body, "new\"name").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"metadata":{"model":"inner"},"model":"new\"name","tools":[{"model":"t"}]}"#
        );
        // An escaped key spelling `model` is the member too.
        let out = rewrite_model(br#"{"mod\u0065l":"x"}"#, "y").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "y");
    }

    #[test]
    fn not_an_object_or_no_string_model_is_none() {
        assert!(rewrite_model(b"[1]", "x").is_none());
        assert!(rewrite_model(br#"{"model": 5}"#, "x").is_none());
        assert!(rewrite_model(br#"{"prompt": "x"}"#, "x").is_none());
        assert!(rewrite_model(b"{", "x").is_none());
    }

    /// Whatever the body, the result parses and differs from the input in `model` only.
    #[test]
    fn rewritten_bodies_parse_with_only_the_model_changed() {
        let bodies = [
            r#"{"model":"m","prompt":"p"}"#,
            "{\n\t\"prompt\": [1, 2, {\"a\": \"]\"}],\r\n\"model\":\"m\"\n}",
            r#"{"model":"m","x":null,"y":true,"z":-0.5,"w":"\\"}"#,
        ];
        for body in bodies {
            let out = rewrite_model(body.as_bytes(), "t").unwrap();
            let mut before: Value = serde_json::from_str(body).unwrap();
            let after: Value = serde_json::from_slice(&out).unwrap();
            before["model"] = Value::from("t");
            assert_eq!(before, after, "{body}");
        }
    }
}
