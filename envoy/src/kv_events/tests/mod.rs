//! The subscriber thread against real publishers over loopback TCP: the `zeromq` crate's PUB
//! (ZMTP 3.0: the legacy subscription message) and, when `python3 -c 'import zmq'` works,
//! libzmq through pyzmq (ZMTP 3.1: the SUBSCRIBE command, heartbeats). They check delivery in
//! order, a skipped sequence number (stale), a publisher restart (reconnect + stale), a
//! removed target, and a slow sink (the connection is dropped and marked stale; the buffer
//! stays bounded).

use super::zmtp::{encode_greeting, encode_message, encode_ready};
use super::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zeromq::{Endpoint, PubSocket, Socket, SocketSend, ZmqMessage};

/// What the sink saw.
#[derive(Default)]
struct Seen {
    /// (endpoint, topic, seq, payload length) per delivery.
    delivered: Vec<(String, Vec<u8>, u64, usize)>,
    /// Endpoint per stale call.
    stale: Vec<String>,
}

struct TestSink {
    targets: Mutex<Vec<KvTarget>>,
    seen: Mutex<Seen>,
    /// Time each deliver takes (a slow sink).
    delay: Duration,
}

impl TestSink {
    fn new(targets: Vec<KvTarget>, delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            targets: Mutex::new(targets),
            seen: Mutex::new(Seen::default()),
            delay,
        })
    }

    fn delivered(&self) -> usize {
        self.seen.lock().unwrap().delivered.len()
    }

    fn seqs(&self) -> Vec<u64> {
        let seen = self.seen.lock().unwrap();
        seen.delivered.iter().map(|d| d.2).collect()
    }

    fn stale(&self) -> usize {
        self.seen.lock().unwrap().stale.len()
    }
}

impl KvSink for TestSink {
    fn targets(&self) -> Vec<KvTarget> {
        self.targets.lock().unwrap().clone()
    }

    fn deliver(&self, target: &KvTarget, topic: &[u8], seq: u64, payload: &[u8]) {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let mut seen = self.seen.lock().unwrap();
        seen.delivered
            .push((target.endpoint.clone(), topic.to_vec(), seq, payload.len()));
    }

    fn stale(&self, target: &KvTarget) {
        self.seen
            .lock()
            .unwrap()
            .stale
            .push(target.endpoint.clone());
    }
}

/// Short intervals so the tests run in seconds.
fn fast_config() -> Config {
    Config {
        targets_interval: Duration::from_millis(50),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        // Quiet peers are pinged quickly: a 3.0 peer (the `zeromq` crate) must never get one.
        heartbeat_interval: Duration::from_millis(100),
        ..Config::default()
    }
}

/// Waits up to `secs` seconds for `done`.
fn wait_until(secs: u64, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    done()
}

fn target(port: u16) -> KvTarget {
    KvTarget {
        pool: "pool".into(),
        endpoint: format!("127.0.0.1:{}", 8000 + port % 1000),
        events: ([127, 0, 0, 1], port).into(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A `zeromq` PUB bound on `port` (0: any); returns it and its port.
async fn bind_pub(port: u16) -> (PubSocket, u16) {
    let mut socket = PubSocket::new();
    let mut tries = 0;
    loop {
        match socket.bind(&format!("tcp://127.0.0.1:{port}")).await {
            Ok(Endpoint::Tcp(_, bound)) => return (socket, bound),
            Ok(other) => panic!("bound {other:?}"),
            Err(e) if tries < 50 => {
                tries += 1;
                eprintln!("bind {port}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("bind {port}: {e}"),
        }
    }
}

/// One vLLM-shaped message: topic, 8-octet big-endian sequence, payload.
fn message(seq: u64, payload: &[u8]) -> ZmqMessage {
    let mut m = ZmqMessage::from(b"kv@pod-a@model".to_vec());
    m.push_back(bytes::Bytes::copy_from_slice(&seq.to_be_bytes()));
    m.push_back(bytes::Bytes::copy_from_slice(payload));
    m
}

async fn publish(socket: &mut PubSocket, seqs: impl IntoIterator<Item = u64>) {
    for seq in seqs {
        socket.send(message(seq, b"\x93payload")).await.unwrap();
    }
}

#[test]
fn zeromq_publisher_delivery_gap_restart_and_removal() {
    let rt = runtime();
    let (mut publisher, port) = rt.block_on(bind_pub(0));
    let t = target(port);
    let sink = TestSink::new(vec![t.clone()], Duration::ZERO);
    let handle = spawn_with(sink.clone(), fast_config()).unwrap();
    let stats = |h: &Handle| h.stats().snapshot();
    assert!(
        wait_until(5, || stats(&handle).connected == 1),
        "{:?}",
        stats(&handle)
    );
    // The PUB applies the subscription message asynchronously after the handshake.
    std::thread::sleep(Duration::from_millis(300));

    rt.block_on(publish(&mut publisher, 0..1000));
    assert!(
        wait_until(5, || sink.delivered() == 1000),
        "{}",
        sink.delivered()
    );
    assert_eq!(sink.seqs(), (0..1000).collect::<Vec<_>>());
    {
        let seen = sink.seen.lock().unwrap();
        let (endpoint, topic, _, len) = &seen.delivered[0];
        assert_eq!(
            (endpoint.as_str(), topic.as_slice(), *len),
            (t.endpoint.as_str(), &b"kv@pod-a@model"[..], 8)
        );
    }
    assert_eq!(sink.stale(), 0);
    assert_eq!(stats(&handle).gaps, 0);

    // 1000 is skipped: one gap, one stale, and 1001 is still delivered.
    rt.block_on(publish(&mut publisher, [1001]));
    assert!(wait_until(5, || sink.delivered() == 1001));
    assert_eq!(sink.stale(), 1);
    assert_eq!(stats(&handle).gaps, 1);

    // The publisher restarts on the same port: the lost connection is stale, the subscriber
    // reconnects and accepts the new numbering from 0 without another gap.
    let errors = rt.block_on(publisher.close());
    assert!(errors.is_empty(), "{errors:?}");
    assert!(wait_until(5, || sink.stale() == 2), "{}", sink.stale());
    let (mut publisher, _) = rt.block_on(bind_pub(port));
    assert!(
        wait_until(5, || stats(&handle).reconnects == 1
            && stats(&handle).connected == 1),
        "{:?}",
        stats(&handle)
    );
    std::thread::sleep(Duration::from_millis(300));
    rt.block_on(publish(&mut publisher, 0..10));
    assert!(wait_until(5, || sink.delivered() == 1011));
    assert_eq!(&sink.seqs()[1001..], &(0..10).collect::<Vec<_>>()[..]);
    assert_eq!((sink.stale(), stats(&handle).gaps), (2, 1));

    // The target disappears from the sink's list: closed, without a stale call.
    sink.targets.lock().unwrap().clear();
    assert!(wait_until(5, || stats(&handle).connected == 0));
    assert_eq!(sink.stale(), 2);
    let s = stats(&handle);
    assert_eq!((s.messages, s.protocol_errors, s.malformed), (1011, 0, 0));

    let start = Instant::now();
    handle.stop();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "stop took {:?}",
        start.elapsed()
    );
    drop(rt.block_on(publisher.close()));
}

#[test]
fn unreachable_targets_back_off_and_do_not_go_stale() {
    // A port nobody listens on: refused at once, retried with growing delays.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let sink = TestSink::new(vec![target(port)], Duration::ZERO);
    let handle = spawn_with(sink.clone(), fast_config()).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let s = handle.stats().snapshot();
    assert_eq!((s.connected, s.stale, s.reconnects), (0, 0, 0));
    assert_eq!(sink.stale(), 0);
    handle.stop();
}

#[test]
fn a_slow_sink_is_dropped_and_marked_stale_with_bounded_buffers() {
    let rt = runtime();
    let (mut publisher, port) = rt.block_on(bind_pub(0));
    let sink = TestSink::new(vec![target(port)], Duration::from_millis(1));
    let config = Config {
        max_lag: Duration::from_millis(300),
        read_budget: 64 << 10,
        read_chunk: 16 << 10,
        ..fast_config()
    };
    let handle = spawn_with(sink.clone(), config).unwrap();
    assert!(wait_until(5, || handle.stats().snapshot().connected == 1));
    std::thread::sleep(Duration::from_millis(300));
    // 4 KiB payloads far faster than a 1 ms-per-message sink takes them.
    let payload = vec![0u8; 4096];
    let flood = async {
        for seq in 0..20_000u64 {
            publisher.send(message(seq, &payload)).await.unwrap();
            if handle.stats().snapshot().dropped_behind > 0 {
                break;
            }
        }
    };
    rt.block_on(flood);
    assert!(
        wait_until(10, || handle.stats().snapshot().dropped_behind >= 1),
        "{:?}",
        handle.stats().snapshot()
    );
    assert!(sink.stale() >= 1);
    let s = handle.stats().snapshot();
    // One read (16 KiB) plus at most one partial message held in user space.
    assert!(s.peak_buffered <= (16 << 10) + 4096 + 64, "{s:?}");
    eprintln!("slow sink: {s:?}, delivered {}", sink.delivered());
    handle.stop();
    drop(rt.block_on(publisher.close()));
}

/// Whether `python3` can import pyzmq.
fn pyzmq_available() -> bool {
    Command::new("python3")
        .args(["-c", "import zmq"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn libzmq_publisher_through_pyzmq() {
    if !pyzmq_available() {
        eprintln!("SKIPPED libzmq_publisher_through_pyzmq: `python3 -c 'import zmq'` fails (pip install pyzmq)");
        return;
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/kv_events/tests/pyzmq_pub.py"
    );
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port: u16 = lines.next().unwrap().unwrap().trim().parse().unwrap();
    let sink = TestSink::new(vec![target(port)], Duration::ZERO);
    let handle = spawn_with(sink.clone(), fast_config()).unwrap();
    // libzmq hands the XPUB our subscription (empty prefix) as 0x01 + prefix.
    assert_eq!(lines.next().unwrap().unwrap(), "subscribed 01");
    assert_eq!(lines.next().unwrap().unwrap(), "sent");
    assert!(
        wait_until(5, || sink.delivered() == 1099),
        "{}",
        sink.delivered()
    );
    let mut want: Vec<u64> = (0..500).collect();
    want.extend(501..1100);
    assert_eq!(sink.seqs(), want);
    let s = handle.stats().snapshot();
    // One gap (500); no reconnect: the PONGs kept libzmq's 1 s heartbeat timeout happy.
    assert_eq!(
        (s.gaps, s.stale, s.reconnects, s.connected),
        (1, 1, 0, 1),
        "{s:?}"
    );
    {
        let seen = sink.seen.lock().unwrap();
        assert_eq!(seen.delivered[0].1, b"kv@pod-a@Qwen/Qwen3-0.6B");
        assert_eq!(seen.delivered[0].3, 101);
    }
    // The publisher exits: the lost connection is stale.
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert!(wait_until(5, || sink.stale() == 2));
    handle.stop();
}

/// Our side of a handshake as a raw 3.1 PUB: sends greeting + READY(PUB), reads and checks
/// the subscriber's greeting, READY(SUB) and SUBSCRIBE("").
fn raw_pub_handshake(stream: &mut TcpStream) {
    let mut hello = Vec::new();
    encode_greeting(1, &mut hello);
    encode_ready(b"PUB", &mut hello);
    stream.write_all(&hello).unwrap();
    let mut got = vec![0u8; 64 + 27 + 12];
    stream.read_exact(&mut got).unwrap();
    assert_eq!(&got[10..12], &[3, 1]);
    assert_eq!(&got[64 + 24..64 + 27], b"SUB");
    assert_eq!(&got[64 + 27..], b"\x04\x0a\x09SUBSCRIBE");
}

/// Counts deliveries only (a sink that costs nothing).
struct CountSink {
    targets: Vec<KvTarget>,
    count: AtomicU64,
    stale: AtomicU64,
}

impl KvSink for CountSink {
    fn targets(&self) -> Vec<KvTarget> {
        self.targets.clone()
    }
    fn deliver(&self, _: &KvTarget, _: &[u8], _: u64, _: &[u8]) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }
    fn stale(&self, _: &KvTarget) {
        self.stale.fetch_add(1, Ordering::Relaxed);
    }
}

/// Messages per second from a raw publisher writing pre-encoded vLLM-shaped messages as fast
/// as loopback takes them, through the subscriber thread to a counting sink. Printed.
#[test]
fn subscriber_throughput_from_a_raw_publisher() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count: u64 = 200_000;
    let topic = b"kv@sim-0@meta-llama/Llama-3.1-8B-Instruct";
    let payload = vec![0x93u8; 200];
    let mut wire = Vec::with_capacity(count as usize * 270);
    for seq in 0..count {
        encode_message(&[topic, &seq.to_be_bytes(), &payload], &mut wire);
    }
    let sink = Arc::new(CountSink {
        targets: vec![target(port)],
        count: AtomicU64::new(0),
        stale: AtomicU64::new(0),
    });
    let handle = spawn_with(sink.clone(), fast_config()).unwrap();
    let (mut stream, _) = listener.accept().unwrap();
    raw_pub_handshake(&mut stream);
    let start = Instant::now();
    let writer = std::thread::spawn(move || {
        stream.write_all(&wire).unwrap();
        stream
    });
    assert!(wait_until(30, || sink.count.load(Ordering::Relaxed) == count));
    let secs = start.elapsed().as_secs_f64();
    let s = handle.stats().snapshot();
    assert_eq!((s.gaps, s.stale, s.messages), (0, 0, count), "{s:?}");
    println!(
        "subscriber: {count} messages ({} MiB) over loopback in {secs:.3} s = {:.0} messages/s",
        s.bytes >> 20,
        count as f64 / secs
    );
    handle.stop();
    drop(writer.join().unwrap());
}

/// A 3.1 peer that stops answering is pinged after the heartbeat interval and closed (stale)
/// after the timeout; the subscriber then connects again.
#[test]
fn a_silent_3_1_peer_is_pinged_then_dropped() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sink = Arc::new(CountSink {
        targets: vec![target(port)],
        count: AtomicU64::new(0),
        stale: AtomicU64::new(0),
    });
    let config = Config {
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(400),
        ..fast_config()
    };
    let handle = spawn_with(sink.clone(), config).unwrap();
    let (mut stream, _) = listener.accept().unwrap();
    raw_pub_handshake(&mut stream);
    let opened = Instant::now();
    let mut ping = [0u8; 9];
    stream.read_exact(&mut ping).unwrap();
    assert_eq!(&ping, b"\x04\x07\x04PING\x00\x00");
    assert!(
        opened.elapsed() >= Duration::from_millis(90),
        "{:?}",
        opened.elapsed()
    );
    // No PONG: the connection is closed after the timeout, marked stale, and reconnected.
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let closed = opened.elapsed();
    assert!(
        closed >= Duration::from_millis(390),
        "closed after {closed:?}"
    );
    assert!(wait_until(5, || sink.stale.load(Ordering::Relaxed) == 1));
    listener.set_nonblocking(false).unwrap();
    let (mut again, _) = listener.accept().unwrap();
    raw_pub_handshake(&mut again);
    assert!(wait_until(5, || handle.stats().snapshot().reconnects == 1));
    handle.stop();
}

/// Panics in `deliver` for sequence number 5.
struct PanickySink {
    targets: Vec<KvTarget>,
    seqs: Mutex<Vec<u64>>,
    stale: AtomicU64,
}

impl KvSink for PanickySink {
    fn targets(&self) -> Vec<KvTarget> {
        self.targets.clone()
    }
    fn deliver(&self, _: &KvTarget, _: &[u8], seq: u64, _: &[u8]) {
        assert_ne!(seq, 5, "the sink fails on 5");
        self.seqs.lock().unwrap().push(seq);
    }
    fn stale(&self, _: &KvTarget) {
        self.stale.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn a_panicking_sink_call_is_contained_and_marks_the_target_stale() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sink = Arc::new(PanickySink {
        targets: vec![target(port)],
        seqs: Mutex::new(Vec::new()),
        stale: AtomicU64::new(0),
    });
    let handle = spawn_with(sink.clone(), fast_config()).unwrap();
    let (mut stream, _) = listener.accept().unwrap();
    raw_pub_handshake(&mut stream);
    let mut wire = Vec::new();
    for seq in 0..10u64 {
        encode_message(&[b"t", &seq.to_be_bytes(), b"p"], &mut wire);
    }
    stream.write_all(&wire).unwrap();
    assert!(wait_until(5, || sink.seqs.lock().unwrap().len() == 9));
    assert_eq!(*sink.seqs.lock().unwrap(), vec![0, 1, 2, 3, 4, 6, 7, 8, 9]);
    let s = handle.stats().snapshot();
    assert_eq!(
        (s.sink_panics, s.stale, s.gaps, s.connected),
        (1, 1, 0, 1),
        "{s:?}"
    );
    assert_eq!(sink.stale.load(Ordering::Relaxed), 1);
    handle.stop();
}

/// A peer that accepts and hangs up at once is retried after 20, 40, 80, 160, 200, 200, ...
/// ms (the fast config's backoff), not at every poll turn.
#[test]
fn failed_handshakes_back_off_exponentially() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sink = TestSink::new(vec![target(port)], Duration::ZERO);
    let handle = spawn_with(sink.clone(), fast_config()).unwrap();
    listener.set_nonblocking(true).unwrap();
    let start = Instant::now();
    let mut accepted = Vec::new();
    while start.elapsed() < Duration::from_millis(1000) {
        match listener.accept() {
            Ok((stream, _)) => {
                accepted.push(start.elapsed());
                drop(stream);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    handle.stop();
    // 0, 20, 60, 140, 300, 500, 700, 900 ms: about 8 attempts (50 without the backoff).
    assert!((4..=12).contains(&accepted.len()), "{accepted:?}");
    let gaps: Vec<Duration> = accepted.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().max() >= Some(&Duration::from_millis(150)),
        "{gaps:?}"
    );
    assert_eq!(sink.stale(), 0, "no handshake completed, nothing to forget");
}
