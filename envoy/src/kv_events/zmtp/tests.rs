//! The codec against hand-built byte streams, and property tests: any chunking of a valid
//! stream yields the same messages; arbitrary bytes never panic and never make the session
//! hold more than its bounds.

use super::*;
use proptest::prelude::*;

/// The publisher's side of a handshake: greeting of version 3.`minor`, READY `socket_type`.
fn peer_hello(minor: u8, socket_type: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_greeting(minor, &mut out);
    encode_ready(socket_type, &mut out);
    out
}

/// A session that completed its handshake with a 3.`minor` PUB, its output drained.
fn ready_session(minor: u8, limits: Limits) -> Session {
    let mut s = Session::new(&[b""], limits);
    s.feed(&peer_hello(minor, b"PUB"));
    assert_eq!(s.poll(), Ok(Some(Event::Ready)));
    let n = s.pending_output().len();
    s.consume_output(n);
    s
}

/// Every message the session yields now, as owned frames.
fn drain(s: &mut Session) -> Result<Vec<Vec<Vec<u8>>>, ZmtpError> {
    let mut out = Vec::new();
    while let Some(event) = s.poll()? {
        if let Event::Message(m) = event {
            out.push(m.frames().map(<[u8]>::to_vec).collect());
        }
    }
    Ok(out)
}

#[test]
fn greeting_is_zmtp_3_1_null_client() {
    let s = Session::new(&[b""], Limits::default());
    let g = s.pending_output();
    assert_eq!(g.len(), 64);
    assert_eq!(g[0], 0xFF);
    assert_eq!(&g[1..9], &[0; 8]);
    assert_eq!(g[9], 0x7F);
    assert_eq!(&g[10..12], &[3, 1]);
    assert_eq!(&g[12..16], b"NULL");
    assert!(
        g[16..].iter().all(|&b| b == 0),
        "mechanism padding, as-server 0, filler"
    );
}

#[test]
fn handshake_sends_ready_sub_then_subscribe_command_to_a_3_1_peer() {
    let mut s = Session::new(&[b"kv@"], Limits::default());
    s.consume_output(64);
    let mut greeting = Vec::new();
    encode_greeting(1, &mut greeting);
    s.feed(&greeting[..40]);
    assert_eq!(s.poll(), Ok(None));
    assert!(
        s.pending_output().is_empty(),
        "READY only after the peer's greeting"
    );
    s.feed(&greeting[40..]);
    assert_eq!(s.poll(), Ok(None));
    assert_eq!(s.phase(), Phase::Handshake);
    // READY: flags 04, size 25, name "READY", property Socket-Type = SUB.
    let mut want = vec![0x04, 25, 5];
    want.extend_from_slice(b"READY");
    want.push(11);
    want.extend_from_slice(b"Socket-Type");
    want.extend_from_slice(&[0, 0, 0, 3]);
    want.extend_from_slice(b"SUB");
    assert_eq!(s.pending_output(), &want[..]);
    s.consume_output(want.len());
    let mut ready = Vec::new();
    encode_ready(b"PUB", &mut ready);
    s.feed(&ready);
    assert_eq!(s.poll(), Ok(Some(Event::Ready)));
    assert_eq!(s.phase(), Phase::Traffic);
    let mut sub = vec![0x04, 13, 9];
    sub.extend_from_slice(b"SUBSCRIBE");
    sub.extend_from_slice(b"kv@");
    assert_eq!(s.pending_output(), &sub[..]);
}

#[test]
fn a_3_0_peer_gets_the_legacy_subscription_message() {
    let mut s = Session::new(&[b"", b"ab"], Limits::default());
    s.consume_output(64);
    s.feed(&peer_hello(0, b"XPUB"));
    assert_eq!(s.poll(), Ok(Some(Event::Ready)));
    let out = s.pending_output();
    let ready_len = 2 + 1 + 5 + 1 + 11 + 4 + 3;
    assert_eq!(&out[ready_len..], &[0x00, 1, 1, 0x00, 3, 1, b'a', b'b']);
}

#[test]
fn short_long_and_multipart_frames() {
    let mut s = ready_session(1, Limits::default());
    let big = vec![7u8; 300];
    let mut wire = Vec::new();
    // topic (short, MORE), seq (short, MORE), payload (long).
    wire.extend_from_slice(&[0x01, 3, b'k', b'v', b'@']);
    wire.extend_from_slice(&[0x01, 8, 0, 0, 0, 0, 0, 0, 0, 42]);
    wire.push(0x02);
    wire.extend_from_slice(&300u64.to_be_bytes());
    wire.extend_from_slice(&big);
    // A one-frame message with a long header for a short body, and an empty frame.
    wire.push(0x02);
    wire.extend_from_slice(&1u64.to_be_bytes());
    wire.push(b'x');
    wire.extend_from_slice(&[0x00, 0]);
    s.feed(&wire);
    let got = drain(&mut s);
    assert_eq!(
        got,
        Ok(vec![
            vec![b"kv@".to_vec(), vec![0, 0, 0, 0, 0, 0, 0, 42], big],
            vec![b"x".to_vec()],
            vec![vec![]],
        ])
    );
    assert_eq!(s.buffered_input(), 0);
}

#[test]
fn message_waits_for_its_last_frame() {
    let mut s = ready_session(1, Limits::default());
    let mut wire = Vec::new();
    encode_message(&[b"t", b"12345678", b"payload"], &mut wire);
    for (i, byte) in wire.iter().enumerate() {
        s.feed(&[*byte]);
        let got = drain(&mut s);
        if i + 1 < wire.len() {
            assert_eq!(got, Ok(vec![]), "complete only at the last byte ({i})");
        } else {
            assert_eq!(got.map(|m| m.len()), Ok(1));
        }
    }
}

#[test]
fn ping_is_answered_with_pong_echoing_the_context() {
    let mut s = ready_session(1, Limits::default());
    let mut wire = Vec::new();
    encode_command(b"PING", &[0, 10, b'c', b't', b'x'], &mut wire);
    encode_command(b"SOMETHING", b"ignored", &mut wire);
    encode_message(&[b"m"], &mut wire);
    s.feed(&wire);
    assert_eq!(drain(&mut s), Ok(vec![vec![b"m".to_vec()]]));
    let mut pong = Vec::new();
    encode_command(b"PONG", b"ctx", &mut pong);
    assert_eq!(s.pending_output(), &pong[..]);
}

#[test]
fn refused_greetings() {
    let mut bad_sig = Vec::new();
    encode_greeting(1, &mut bad_sig);
    bad_sig[0] = b'G';
    let mut v2 = Vec::new();
    encode_greeting(1, &mut v2);
    v2[10] = 2;
    let mut plain = Vec::new();
    encode_greeting(1, &mut plain);
    plain[12..17].copy_from_slice(b"PLAIN");
    for (wire, want) in [
        (bad_sig, ZmtpError::BadSignature),
        (v2, ZmtpError::UnsupportedVersion { major: 2 }),
        (plain, ZmtpError::Mechanism),
    ] {
        let mut s = Session::new(&[b""], Limits::default());
        s.feed(&wire);
        assert_eq!(s.poll(), Err(want));
        assert_eq!(s.phase(), Phase::Failed);
        assert_eq!(s.poll(), Err(ZmtpError::Failed));
    }
    // An HTTP server is refused at its first octet.
    let mut s = Session::new(&[b""], Limits::default());
    s.feed(b"H");
    assert_eq!(s.poll(), Err(ZmtpError::BadSignature));
}

#[test]
fn refused_handshakes() {
    let mut s = Session::new(&[b""], Limits::default());
    s.feed(&peer_hello(1, b"REP"));
    assert_eq!(s.poll(), Err(ZmtpError::PeerSocketType(b"REP".to_vec())));

    let mut wire = Vec::new();
    encode_greeting(1, &mut wire);
    encode_command(b"ERROR", b"\x06denied", &mut wire);
    let mut s = Session::new(&[b""], Limits::default());
    s.feed(&wire);
    assert_eq!(s.poll(), Err(ZmtpError::PeerError("denied".into())));

    let mut wire = Vec::new();
    encode_greeting(1, &mut wire);
    encode_message(&[b"early"], &mut wire);
    let mut s = Session::new(&[b""], Limits::default());
    s.feed(&wire);
    assert_eq!(s.poll(), Err(ZmtpError::UnexpectedDuringHandshake));

    // A READY whose property runs past the command's end.
    let mut wire = Vec::new();
    encode_greeting(1, &mut wire);
    encode_command(b"READY", &[11, b'S', b'o'], &mut wire);
    let mut s = Session::new(&[b""], Limits::default());
    s.feed(&wire);
    assert_eq!(s.poll(), Err(ZmtpError::MalformedCommand));
}

#[test]
fn bounds_are_enforced_before_the_body_arrives() {
    let limits = Limits {
        max_message_bytes: 1000,
        max_frames: 3,
        max_command_bytes: 100,
    };
    // A long frame announcing 2^40 bytes: refused from its 9-octet header alone.
    let mut s = ready_session(1, limits);
    let mut wire = vec![0x02];
    wire.extend_from_slice(&(1u64 << 40).to_be_bytes());
    s.feed(&wire);
    assert_eq!(s.poll(), Err(ZmtpError::MessageTooLarge(1 << 40)));
    // Frames adding up past the bound.
    let mut s = ready_session(1, limits);
    let mut wire = Vec::new();
    encode_frame(FLAG_MORE, &[0; 600], &mut wire);
    wire.push(0x02);
    wire.extend_from_slice(&500u64.to_be_bytes());
    s.feed(&wire);
    assert_eq!(s.poll(), Err(ZmtpError::MessageTooLarge(1100)));
    // Too many frames.
    let mut s = ready_session(1, limits);
    let mut wire = Vec::new();
    for _ in 0..4 {
        encode_frame(FLAG_MORE, b"x", &mut wire);
    }
    s.feed(&wire);
    assert_eq!(s.poll(), Err(ZmtpError::TooManyFrames));
    // A command past its bound.
    let mut s = ready_session(1, limits);
    let mut wire = vec![0x06];
    wire.extend_from_slice(&101u64.to_be_bytes());
    s.feed(&wire);
    assert_eq!(s.poll(), Err(ZmtpError::CommandTooLarge(101)));
    // Reserved flags, a command with MORE, a command inside a message.
    for wire in [
        vec![0x08, 0],
        vec![0x05, 5, 4, b'P', b'I', b'N', b'G'],
        vec![0x01, 1, b'a', 0x04, 5, 4, b'P', b'I', b'N', b'G'],
    ] {
        let mut s = ready_session(1, limits);
        s.feed(&wire);
        assert!(s.poll().is_err(), "{wire:?}");
    }
}

/// One item of a generated publisher stream.
#[derive(Clone, Debug)]
enum Item {
    Message(Vec<Vec<u8>>),
    Ping(Vec<u8>),
}

fn item() -> impl Strategy<Value = Item> {
    let frame = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40),
        proptest::collection::vec(any::<u8>(), 250..700),
    ];
    prop_oneof![
        4 => proptest::collection::vec(frame, 1..5).prop_map(Item::Message),
        1 => proptest::collection::vec(any::<u8>(), 0..16).prop_map(Item::Ping),
    ]
}

proptest! {
    #[test]
    fn any_chunking_yields_the_same_messages(
        minor in 0u8..3,
        items in proptest::collection::vec(item(), 0..20),
        cuts in proptest::collection::vec(1usize..300, 1..40),
    ) {
        let mut wire = peer_hello(minor, b"PUB");
        let mut want = Vec::new();
        let mut pongs = Vec::new();
        for item in &items {
            match item {
                Item::Message(frames) => {
                    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
                    encode_message(&refs, &mut wire);
                    want.push(frames.clone());
                }
                Item::Ping(ctx) => {
                    let mut data = vec![0, 0];
                    data.extend_from_slice(ctx);
                    encode_command(b"PING", &data, &mut wire);
                    encode_command(b"PONG", ctx, &mut pongs);
                }
            }
        }
        let mut s = Session::new(&[b""], Limits::default());
        let mut got = Vec::new();
        let mut readies = 0;
        let mut at = 0;
        let mut cut = cuts.iter().cycle();
        while at < wire.len() {
            let end = (at + cut.next().copied().unwrap_or(1)).min(wire.len());
            s.feed(&wire[at..end]);
            at = end;
            while let Some(event) = s.poll().map_err(|e| TestCaseError::fail(e.to_string()))? {
                match event {
                    Event::Ready => readies += 1,
                    Event::Message(m) => got.push(m.frames().map(<[u8]>::to_vec).collect::<Vec<_>>()),
                }
            }
        }
        prop_assert_eq!(readies, 1);
        prop_assert_eq!(got, want);
        prop_assert_eq!(s.buffered_input(), 0);
        // Output: greeting, READY, the subscription, then one PONG per PING in order.
        let out = s.pending_output();
        prop_assert!(out.ends_with(&pongs));
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_stay_bounded(
        handshake in any::<bool>(),
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..30),
    ) {
        let limits = Limits { max_message_bytes: 512, max_frames: 8, max_command_bytes: 128 };
        let mut s = if handshake { ready_session(1, limits) } else { Session::new(&[b""], limits) };
        for chunk in &chunks {
            s.feed(chunk);
            while let Ok(Some(_)) = s.poll() {}
            if s.phase() == Phase::Failed {
                break;
            }
            // Never more than one bounded message (bodies + 9-octet headers) plus one chunk.
            prop_assert!(s.buffered_input() <= 512 + 8 * 9 + 200 + GREETING_LEN);
        }
    }
}

/// Messages per second through the codec, vLLM-shaped (topic, 8-octet sequence, ~400-byte
/// msgpack payload), fed in 64 KiB reads. Printed, not asserted (debug builds are slow).
#[test]
fn codec_throughput() {
    let topic = b"kv@sim-0@meta-llama/Llama-3.1-8B-Instruct";
    let payload = vec![0x93u8; 400];
    let count: u64 = 100_000;
    let mut wire = Vec::with_capacity(count as usize * 470);
    for seq in 0..count {
        encode_message(&[topic, &seq.to_be_bytes(), &payload], &mut wire);
    }
    let mut s = ready_session(1, Limits::default());
    let start = std::time::Instant::now();
    let mut seen = 0u64;
    let mut bytes = 0usize;
    for chunk in wire.chunks(64 << 10) {
        s.feed(chunk);
        while let Ok(Some(Event::Message(m))) = s.poll() {
            seen += 1;
            bytes += m.frame(2).map_or(0, <[u8]>::len);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(seen, count);
    assert_eq!(bytes, count as usize * payload.len());
    println!(
        "zmtp codec: {count} messages ({} MiB) in {:.3} s = {:.0} messages/s, {:.0} MiB/s",
        wire.len() >> 20,
        secs,
        count as f64 / secs,
        wire.len() as f64 / secs / f64::from(1 << 20)
    );
}

#[test]
fn pings_go_only_to_3_1_peers_after_the_handshake() {
    let mut s = Session::new(&[b""], Limits::default());
    assert!(!s.ping(), "not before the handshake");
    let mut old = ready_session(0, Limits::default());
    assert!(!old.ping(), "a 3.0 peer has no PING");
    assert!(old.pending_output().is_empty());
    let mut new = ready_session(1, Limits::default());
    assert!(new.ping());
    assert_eq!(new.pending_output(), b"\x04\x07\x04PING\x00\x00");
    s.consume_output(64);
}

#[test]
fn a_large_message_does_not_pin_its_buffer() {
    let mut s = ready_session(1, Limits::default());
    let big = vec![1u8; 8 << 20];
    let mut wire = Vec::new();
    encode_message(&[b"t", &big], &mut wire);
    s.feed(&wire);
    assert_eq!(drain(&mut s).map(|m| m.len()), Ok(1));
    assert!(s.input.capacity() >= 8 << 20);
    s.feed(b"\x00\x01x");
    assert_eq!(drain(&mut s), Ok(vec![vec![b"x".to_vec()]]));
    assert!(
        s.input.capacity() <= RETAINED_INPUT,
        "{}",
        s.input.capacity()
    );
}
