//! A small well-formedness check of the XML the report writes (tests only): every element
//! closed in order, attribute values quoted and free of `<`, and every `&` one of the five
//! entities the writer uses or a numeric one. A `<!DOCTYPE …>` line and `<!-- … -->`
//! comments are skipped. It does not validate against any schema: it catches the mistakes
//! a string-built document can make (an unclosed tag, unescaped text).

/// `Ok` when `doc` is well-formed as above, else what is wrong and where (a byte offset).
pub fn check(doc: &str) -> Result<(), String> {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = doc;
    let at = |rest: &str| doc.len() - rest.len();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("<!--") {
            let end = after
                .find("-->")
                .ok_or_else(|| format!("unclosed comment at {}", at(rest)))?;
            rest = &after[end + 3..];
        } else if rest.starts_with("<!DOCTYPE") || rest.starts_with("<!doctype") {
            let end = rest
                .find('>')
                .ok_or_else(|| format!("unclosed doctype at {}", at(rest)))?;
            rest = &rest[end + 1..];
        } else if let Some(after) = rest.strip_prefix("</") {
            let end = after
                .find('>')
                .ok_or_else(|| format!("unclosed end tag at {}", at(rest)))?;
            let name = after[..end].trim();
            match stack.pop() {
                Some(open) if open == name => {}
                other => return Err(format!("`</{name}>` at {} closes {other:?}", at(rest))),
            }
            rest = &after[end + 1..];
        } else if let Some(after) = rest.strip_prefix('<') {
            let (name, tail) = tag(after).map_err(|e| format!("{e} at {}", at(rest)))?;
            let (self_closed, tail) =
                attributes(tail).map_err(|e| format!("{e} at {}", at(rest)))?;
            if !self_closed {
                stack.push(name.to_string());
            }
            rest = tail;
        } else {
            let end = rest.find('<').unwrap_or(rest.len());
            text(&rest[..end]).map_err(|e| format!("{e} at {}", at(rest)))?;
            rest = &rest[end..];
        }
    }
    match stack.last() {
        None => Ok(()),
        Some(open) => Err(format!("`<{open}>` never closed")),
    }
}

/// The tag name at the start of `s` and what follows it.
fn tag(s: &str) -> Result<(&str, &str), String> {
    let end = s
        .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
        .ok_or("unterminated tag")?;
    let name = &s[..end];
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | ':' | '_'));
    if !valid {
        return Err(format!("bad tag name `{name}`"));
    }
    Ok((name, &s[end..]))
}

/// Reads `name="value"` pairs up to `>` or `/>`: whether the tag closed itself, and what
/// follows the tag.
fn attributes(mut s: &str) -> Result<(bool, &str), String> {
    loop {
        s = s.trim_start();
        if let Some(r) = s.strip_prefix("/>") {
            return Ok((true, r));
        }
        if let Some(r) = s.strip_prefix('>') {
            return Ok((false, r));
        }
        let eq = s.find('=').ok_or("attribute without a value")?;
        let name = s[..eq].trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | ':' | '_'))
        {
            return Err(format!("bad attribute name `{name}`"));
        }
        let after = s[eq + 1..].trim_start();
        let quote = after.chars().next().ok_or("attribute value missing")?;
        if quote != '"' && quote != '\'' {
            return Err(format!("attribute `{name}` not quoted"));
        }
        let body = &after[1..];
        let close = body
            .find(quote)
            .ok_or_else(|| format!("attribute `{name}` never closed"))?;
        let value = &body[..close];
        if value.contains('<') {
            return Err(format!("`<` in attribute `{name}`"));
        }
        text(value)?;
        s = &body[close + 1..];
    }
}

/// Checks that every `&` in `s` starts an entity.
fn text(s: &str) -> Result<(), String> {
    if s.contains('>') && s.contains("]]>") {
        return Err("`]]>` in text".into());
    }
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        let after = &rest[i + 1..];
        let end = after.find(';').ok_or("`&` without `;`")?;
        let entity = &after[..end];
        let known = matches!(entity, "amp" | "lt" | "gt" | "quot" | "apos")
            || entity
                .strip_prefix('#')
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if !known {
            return Err(format!("unknown entity `&{entity};`"));
        }
        rest = &after[end + 1..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn accepts_what_the_writer_writes() {
        for ok in [
            "<svg><g a=\"1\"/><text x='2'>a &amp; b &#39;</text></svg>",
            "<!DOCTYPE html>\n<html><!-- c --><p>x</p></html>",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn rejects_broken_documents() {
        for bad in [
            "<svg><g></svg>",
            "<svg>",
            "</svg>",
            "<svg a=1></svg>",
            "<svg a=\"<\"></svg>",
            "<p>a & b</p>",
            "<p>&nope;</p>",
            "<p a=\"x\" b></p>",
            "<1p></1p>",
            "<p",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}
