//! Header maps as the host keeps them, and their proxy-wasm wire serialization.
//!
//! Like Envoy, keys are stored lower-cased, order is kept, a key may repeat, and a lookup
//! returns the first value. Values are bytes (a module may write any); the test-facing
//! accessors return them as (lossy) UTF-8 strings.
//!
//! Wire format (ABI 0.2.1 "Serialization"): `u32` pair count, then per pair `u32` key length
//! and `u32` value length, then every key and value each followed by a NUL byte; integers are
//! little-endian. An empty input (size 0) is an empty map.

/// An ordered multi-map of HTTP header fields with lower-case keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderMap {
    pairs: Vec<(String, Vec<u8>)>,
}

impl HeaderMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a map from string pairs (keys are lower-cased).
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Self {
        let mut map = Self::new();
        for (k, v) in pairs {
            map.add(k.as_ref(), v.as_ref().as_bytes());
        }
        map
    }

    /// Builds a map from byte-valued pairs (keys are lower-cased; values kept as given).
    pub fn from_byte_pairs<K: AsRef<str>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Self {
        let mut map = Self::new();
        for (k, v) in pairs {
            map.add(k.as_ref(), v.as_ref());
        }
        map
    }

    /// The first value of `key` (case-insensitive), as a lossy UTF-8 string.
    pub fn get(&self, key: &str) -> Option<String> {
        self.get_bytes(key)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// The first value of `key` (case-insensitive), as bytes.
    pub fn get_bytes(&self, key: &str) -> Option<&[u8]> {
        let key = key.to_ascii_lowercase();
        self.pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_slice())
    }

    /// Every value of `key`, in order.
    pub fn get_all(&self, key: &str) -> Vec<String> {
        let key = key.to_ascii_lowercase();
        self.pairs
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.get_bytes(key).is_some()
    }

    /// Appends a value (keeps existing values of the same key).
    pub fn add(&mut self, key: &str, value: &[u8]) {
        self.pairs.push((key.to_ascii_lowercase(), value.to_vec()));
    }

    /// Sets `key` to exactly one value, in place of the first occurrence.
    pub fn replace(&mut self, key: &str, value: &[u8]) {
        let key = key.to_ascii_lowercase();
        match self.pairs.iter().position(|(k, _)| *k == key) {
            Some(first) => {
                if let Some(slot) = self.pairs.get_mut(first) {
                    slot.1 = value.to_vec();
                }
                let mut index = 0;
                self.pairs.retain(|(k, _)| {
                    let keep = *k != key || index == first;
                    index += 1;
                    keep
                });
            }
            None => self.pairs.push((key, value.to_vec())),
        }
    }

    /// Removes every value of `key`.
    pub fn remove(&mut self, key: &str) {
        let key = key.to_ascii_lowercase();
        self.pairs.retain(|(k, _)| *k != key);
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether the map has no field.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// All fields as (key, lossy UTF-8 value) pairs, in order.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        self.pairs
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect()
    }

    /// All fields as raw pairs.
    pub fn raw_pairs(&self) -> &[(String, Vec<u8>)] {
        &self.pairs
    }

    /// Serializes the map in the proxy-wasm wire format.
    pub fn serialize(&self) -> Vec<u8> {
        let body: usize = self.pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        let mut out = Vec::with_capacity(4 + self.pairs.len() * 8 + body);
        out.extend_from_slice(&wire_len(self.pairs.len()).to_le_bytes());
        for (k, v) in &self.pairs {
            out.extend_from_slice(&wire_len(k.len()).to_le_bytes());
            out.extend_from_slice(&wire_len(v.len()).to_le_bytes());
        }
        for (k, v) in &self.pairs {
            out.extend_from_slice(k.as_bytes());
            out.push(0);
            out.extend_from_slice(v);
            out.push(0);
        }
        out
    }

    /// Parses the proxy-wasm wire format; `None` when the bytes are malformed.
    pub fn deserialize(bytes: &[u8]) -> Option<Self> {
        if bytes.is_empty() || bytes == [0] {
            return Some(Self::new());
        }
        let count = read_u32(bytes, 0)? as usize;
        let mut data = 4usize.checked_add(count.checked_mul(8)?)?;
        if data > bytes.len() {
            return None;
        }
        let mut map = Self::new();
        for i in 0..count {
            let key_len = read_u32(bytes, 4 + i * 8)? as usize;
            let value_len = read_u32(bytes, 8 + i * 8)? as usize;
            let key = bytes.get(data..data.checked_add(key_len)?)?;
            data = data.checked_add(key_len + 1)?;
            let value = bytes.get(data..data.checked_add(value_len)?)?;
            data = data.checked_add(value_len + 1)?;
            map.add(&String::from_utf8_lossy(key), value);
        }
        Some(map)
    }
}

/// Lengths on the wire are `u32`; the host never builds a map near 4 GiB.
fn wire_len(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let raw: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_like_the_spec_example() {
        let map = HeaderMap::from_pairs(&[("a", "1"), ("b", "22")]);
        let expected: Vec<u8> = vec![
            2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, b'a', 0, b'1', 0, b'b', 0,
            b'2', b'2', 0,
        ];
        assert_eq!(map.serialize(), expected);
        assert_eq!(HeaderMap::deserialize(&expected), Some(map));
    }

    #[test]
    fn empty_and_malformed_inputs() {
        assert_eq!(HeaderMap::deserialize(&[]), Some(HeaderMap::new()));
        assert_eq!(HeaderMap::deserialize(&[0]), Some(HeaderMap::new()));
        assert_eq!(
            HeaderMap::deserialize(&[0, 0, 0, 0]),
            Some(HeaderMap::new())
        );
        assert_eq!(HeaderMap::deserialize(&[1, 0, 0, 0]), None);
        assert_eq!(HeaderMap::deserialize(&[255, 255, 255, 255]), None);
        assert_eq!(
            HeaderMap::deserialize(&[1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, b'a', 0]),
            None
        );
    }

    #[test]
    fn keys_are_case_insensitive_and_replace_collapses_duplicates() {
        let mut map = HeaderMap::from_pairs(&[("X-A", "1"), ("x-b", "2"), ("x-a", "3")]);
        assert_eq!(map.get("x-a").as_deref(), Some("1"));
        assert_eq!(map.get_all("X-A"), vec!["1", "3"]);
        map.replace("x-A", b"9");
        assert_eq!(map.get_all("x-a"), vec!["9"]);
        assert_eq!(map.to_pairs()[0], ("x-a".to_string(), "9".to_string()));
        map.remove("X-B");
        assert!(!map.contains("x-b"));
        map.replace("new", b"v");
        assert_eq!(map.len(), 2);
    }
}
