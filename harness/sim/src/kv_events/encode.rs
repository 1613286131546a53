//! The msgpack payload of one KV event message, shaped as vLLM's `msgspec` encodes its
//! `KVEventBatch` (array-like structs, each event tagged with its class name in front).
//!
//! - batch: `[ts (float64, unix seconds), events (array), data_parallel_rank (int)]`
//! - `["BlockStored", block_hashes [uint…], parent_block_hash (uint or nil), token_ids [uint…],
//!   block_size (uint), lora_id (uint or nil), medium (nil), lora_name (str or nil)]`
//! - `["BlockRemoved", block_hashes [uint…], medium (nil)]`
//! - `["AllBlocksCleared"]`
//!
//! Hashes are the simulator's block hashes (u64, written as msgpack unsigned ints); token
//! ids are the simulator's token model (4-byte little-endian chunks of the prompt bytes).
//! `lora_id` is the adapter's position in the served adapter list plus one (vLLM numbers
//! adapters from 1).

use rmp::encode::{write_array_len, write_f64, write_nil, write_str, write_uint};

use crate::engine::CacheEvent;

/// What every message of one publisher shares.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchShape {
    /// Tokens per block (the engine's `block_size`).
    pub block_size: u32,
    /// The served adapter names, in order (their ids are position + 1).
    pub loras: Vec<String>,
    /// The `data_parallel_rank` field (vLLM sends its rank, 0 without data parallelism).
    pub dp_rank: Option<u32>,
}

fn len32(n: usize) -> anyhow::Result<u32> {
    Ok(u32::try_from(n)?)
}

/// Encodes one batch of events stamped `ts` (unix seconds).
pub fn encode_batch(shape: &BatchShape, ts: f64, events: &[CacheEvent]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64 + events.len() * 96);
    write_array_len(&mut out, 3)?;
    write_f64(&mut out, ts)?;
    write_array_len(&mut out, len32(events.len())?)?;
    for ev in events {
        encode_event(&mut out, shape, ev)?;
    }
    match shape.dp_rank {
        Some(r) => {
            write_uint(&mut out, u64::from(r))?;
        }
        None => write_nil(&mut out)?,
    }
    Ok(out)
}

fn encode_event(out: &mut Vec<u8>, shape: &BatchShape, ev: &CacheEvent) -> anyhow::Result<()> {
    match ev {
        CacheEvent::Stored {
            hashes,
            parent,
            token_ids,
            lora,
        } => {
            write_array_len(out, 8)?;
            write_str(out, "BlockStored")?;
            write_array_len(out, len32(hashes.len())?)?;
            for h in hashes {
                write_uint(out, h.0)?;
            }
            match parent {
                Some(p) => {
                    write_uint(out, p.0)?;
                }
                None => write_nil(out)?,
            }
            write_array_len(out, len32(token_ids.len())?)?;
            for t in token_ids {
                write_uint(out, u64::from(*t))?;
            }
            write_uint(out, u64::from(shape.block_size))?;
            let lora_id = lora
                .as_ref()
                .and_then(|l| shape.loras.iter().position(|x| x == l));
            match lora_id {
                Some(i) => {
                    write_uint(out, i as u64 + 1)?;
                }
                None => write_nil(out)?,
            }
            write_nil(out)?;
            match lora {
                Some(l) => write_str(out, l)?,
                None => write_nil(out)?,
            }
        }
        CacheEvent::Removed { hashes } => {
            write_array_len(out, 3)?;
            write_str(out, "BlockRemoved")?;
            write_array_len(out, len32(hashes.len())?)?;
            for h in hashes {
                write_uint(out, h.0)?;
            }
            write_nil(out)?;
        }
        CacheEvent::Cleared => {
            write_array_len(out, 1)?;
            write_str(out, "AllBlocksCleared")?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::engine::BlockHash;
    use scheduler_core::kv_events::{decode_batch, EngineBlockHash, KvEvent};

    fn shape() -> BatchShape {
        BatchShape {
            block_size: 2,
            loras: vec!["a".into(), "b".into()],
            dp_rank: Some(0),
        }
    }

    /// Hand-packed bytes of a small batch, so the layout is pinned independently of rmp.
    #[test]
    fn bytes_are_vllm_array_like_structs() {
        let p = encode_batch(
            &shape(),
            1.5,
            &[
                CacheEvent::Removed {
                    hashes: vec![BlockHash(7)],
                },
                CacheEvent::Cleared,
            ],
        )
        .unwrap();
        let mut want = vec![0x93, 0xcb];
        want.extend_from_slice(&1.5f64.to_be_bytes());
        want.push(0x92);
        want.extend_from_slice(&[0x93, 0xac]);
        want.extend_from_slice(b"BlockRemoved");
        want.extend_from_slice(&[0x91, 0x07, 0xc0]);
        want.extend_from_slice(&[0x91, 0xb0]);
        want.extend_from_slice(b"AllBlocksCleared");
        want.push(0x00);
        assert_eq!(p, want);
    }

    /// The gateway's decoder reads back exactly what was encoded.
    #[test]
    fn the_core_decoder_reads_it_back() {
        let events = vec![
            CacheEvent::Stored {
                hashes: vec![BlockHash(u64::MAX), BlockHash(3)],
                parent: Some(BlockHash(9)),
                token_ids: vec![1, u32::MAX, 3, 4],
                lora: Some("b".into()),
            },
            CacheEvent::Stored {
                hashes: vec![BlockHash(5)],
                parent: None,
                token_ids: vec![8, 9],
                lora: None,
            },
            CacheEvent::Removed {
                hashes: vec![BlockHash(3), BlockHash(u64::MAX)],
            },
            CacheEvent::Cleared,
        ];
        let p = encode_batch(&shape(), 1234.25, &events).unwrap();
        let b = decode_batch(&p).unwrap();
        assert_eq!(b.ts, 1234.25);
        assert_eq!(b.dp_rank, Some(0));
        assert_eq!(
            b.events,
            vec![
                KvEvent::BlockStored {
                    block_hashes: vec![EngineBlockHash(u64::MAX), EngineBlockHash(3)],
                    parent: Some(EngineBlockHash(9)),
                    token_ids: vec![1, u32::MAX, 3, 4],
                    block_size: 2,
                    lora_name: Some("b".into()),
                },
                KvEvent::BlockStored {
                    block_hashes: vec![EngineBlockHash(5)],
                    parent: None,
                    token_ids: vec![8, 9],
                    block_size: 2,
                    lora_name: None,
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![EngineBlockHash(3), EngineBlockHash(u64::MAX)],
                },
                KvEvent::AllBlocksCleared,
            ]
        );
    }
}
