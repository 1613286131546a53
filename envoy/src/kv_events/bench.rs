//! Measurements of the KV-event subscriber (a Cargo example, not part of the library):
//! `cargo run --release -p infergate-envoy --example kv_events_bench`.
//!
//! 1. The codec alone: vLLM-shaped messages (topic, 8-octet sequence, 400-byte payload)
//!    decoded from 64 KiB chunks, in messages/s.
//! 2. The subscriber thread: a raw ZMTP 3.1 publisher on loopback writes the same messages
//!    as fast as the socket takes them; messages/s until a counting sink has them all.
//! 3. Idle cost: CPU of the process with 100 connected, silent publishers.

use infergate_envoy::kv_events::zmtp::{
    encode_greeting, encode_message, encode_ready, Event, Limits, Session,
};
use infergate_envoy::kv_events::{spawn, KvSink, KvTarget};
use std::error::Error;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn Error>>;

const TOPIC: &[u8] = b"kv@sim-0@meta-llama/Llama-3.1-8B-Instruct";

/// `count` encoded messages with 400-byte payloads.
fn wire(count: u64) -> Vec<u8> {
    let payload = vec![0x93u8; 400];
    let mut wire = Vec::with_capacity(count as usize * 470);
    for seq in 0..count {
        encode_message(&[TOPIC, &seq.to_be_bytes(), &payload], &mut wire);
    }
    wire
}

/// A 3.1 PUB's greeting and READY.
fn hello() -> Vec<u8> {
    let mut hello = Vec::new();
    encode_greeting(1, &mut hello);
    encode_ready(b"PUB", &mut hello);
    hello
}

fn codec(count: u64) -> Res<()> {
    let wire = wire(count);
    let mut session = Session::new(&[b""], Limits::default());
    session.feed(&hello());
    if session.poll()? != Some(Event::Ready) {
        return Err("no handshake".into());
    }
    let start = Instant::now();
    let mut seen = 0u64;
    for chunk in wire.chunks(64 << 10) {
        session.feed(chunk);
        while let Some(Event::Message(_)) = session.poll()? {
            seen += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if seen != count {
        return Err(format!("decoded {seen} of {count}").into());
    }
    println!(
        "codec: {count} messages ({} MiB) in {secs:.3} s = {:.2} M messages/s, {:.0} MiB/s",
        wire.len() >> 20,
        count as f64 / secs / 1e6,
        wire.len() as f64 / secs / f64::from(1 << 20)
    );
    Ok(())
}

/// Counts deliveries.
struct Counter {
    targets: Vec<KvTarget>,
    delivered: AtomicU64,
}

impl KvSink for Counter {
    fn targets(&self) -> Vec<KvTarget> {
        self.targets.clone()
    }
    fn deliver(&self, _: &KvTarget, _: &[u8], _: u64, _: &[u8]) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }
    fn stale(&self, _: &KvTarget) {}
}

/// `n` listeners, each with a target for it.
fn listeners(n: usize) -> Res<(Vec<TcpListener>, Vec<KvTarget>)> {
    let mut listeners = Vec::new();
    let mut targets = Vec::new();
    for i in 0..n {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        targets.push(KvTarget {
            pool: "pool".into(),
            endpoint: format!("endpoint-{i}"),
            events: listener.local_addr()?,
        });
        listeners.push(listener);
    }
    Ok((listeners, targets))
}

/// Accepts the subscriber on `listener` and completes the publisher's side of the handshake.
fn accept(listener: &TcpListener) -> Res<std::net::TcpStream> {
    let (mut stream, _) = listener.accept()?;
    stream.write_all(&hello())?;
    // Greeting, READY(SUB), SUBSCRIBE("").
    let mut theirs = [0u8; 64 + 27 + 12];
    stream.read_exact(&mut theirs)?;
    Ok(stream)
}

fn subscriber(count: u64) -> Res<()> {
    let wire = wire(count);
    let (listeners, targets) = listeners(1)?;
    let sink = Arc::new(Counter {
        targets,
        delivered: AtomicU64::new(0),
    });
    let handle = spawn(sink.clone())?;
    let mut stream = accept(&listeners[0])?;
    let start = Instant::now();
    let writer = std::thread::spawn(move || stream.write_all(&wire).map(|()| stream));
    while sink.delivered.load(Ordering::Relaxed) < count {
        if start.elapsed() > Duration::from_secs(60) {
            let stats = handle.stats().snapshot();
            // A debug build falls behind the raw writer and is dropped (`dropped_behind`).
            return Err(format!("not all delivered in 60 s: {stats:?}").into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let secs = start.elapsed().as_secs_f64();
    let stats = handle.stats().snapshot();
    println!(
        "subscriber: {count} messages ({} MiB) over loopback in {secs:.3} s = {:.2} M messages/s, {:.0} MiB/s; {stats:?}",
        stats.bytes >> 20,
        count as f64 / secs / 1e6,
        stats.bytes as f64 / secs / f64::from(1 << 20)
    );
    handle.stop();
    drop(writer.join());
    Ok(())
}

/// User + system CPU seconds of this process.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the rusage struct the pointer points to.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let secs = usage.ru_utime.tv_sec + usage.ru_stime.tv_sec;
    let micros = usage.ru_utime.tv_usec + usage.ru_stime.tv_usec;
    secs as f64 + micros as f64 / 1e6
}

fn idle(n: usize) -> Res<()> {
    let (listeners, targets) = listeners(n)?;
    let sink = Arc::new(Counter {
        targets,
        delivered: AtomicU64::new(0),
    });
    let handle = spawn(sink)?;
    let streams = listeners.iter().map(accept).collect::<Res<Vec<_>>>()?;
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_seconds();
    std::thread::sleep(Duration::from_secs(4));
    let used = cpu_seconds() - before;
    println!(
        "idle: {} connected of {n} silent publishers, CPU {:.2}% of one core",
        handle.stats().snapshot().connected,
        used / 4.0 * 100.0
    );
    handle.stop();
    drop(streams);
    Ok(())
}

fn main() -> Res<()> {
    codec(2_000_000)?;
    subscriber(2_000_000)?;
    idle(100)
}
