//! The subscriber thread: one per process, following every [`KvTarget`] the sink lists.
//!
//! Each target has one connection, moving through
//! `Idle` (waiting for its retry time) → `Connecting` (non-blocking TCP connect) →
//! `Open` (a [`Session`] on a non-blocking stream). One `poll(2)` call waits on all sockets
//! with a timeout of at most [`Config::poll_interval`] (10 ms), so the thread notices
//! [`Handle::stop`], retry times and the target refresh without busy waiting.
//!
//! - Reconnect: a failed attempt or a lost connection retries after a backoff starting at
//!   100 ms and doubling up to 5 s; a completed handshake resets it.
//! - Sequence: the first message of a connection sets the expected number; after that a
//!   message whose number is not the expected one counts a gap and calls
//!   [`KvSink::stale`] before it is delivered.
//! - Bounds: a message is at most [`Limits::max_message_bytes`] (the session refuses a larger
//!   announcement before reading it), each connection reads at most
//!   [`Config::read_budget`] bytes per loop turn (fairness), and a connection that stays
//!   behind (every turn used its whole budget with data still unread) for longer than
//!   [`Config::max_lag`] (the sink is slower than the publisher) is dropped and marked stale;
//!   it reconnects and starts afresh. The user-space buffer of a connection thus holds at
//!   most one message plus one read; the kernel's receive queue is bounded by the socket
//!   buffer, and what the publisher cannot send it drops at its high-water mark (a gap).
//! - Liveness: TCP keepalive on every socket; a handshake not done within
//!   [`Config::handshake_timeout`] fails the attempt. A ZMTP 3.1 peer (libzmq, hence vLLM)
//!   silent for [`Config::heartbeat_interval`] gets a PING (it answers PONG); one silent for
//!   [`Config::heartbeat_timeout`] is closed (stale, reconnect). A 3.0 peer has no heartbeat
//!   commands and relies on keepalive.

use super::zmtp::{Event, Limits, Phase, Session};
use super::{KvSink, KvTarget};
use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};
use std::collections::HashSet;
use std::io::{self, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The subscriber's tunables; [`Config::default`] is what [`spawn`] uses.
#[derive(Clone, Debug)]
pub struct Config {
    /// Per-message and per-command bounds of the protocol.
    pub limits: Limits,
    /// Topic prefixes subscribed on every connection (default: one empty prefix, everything).
    pub subscriptions: Vec<Vec<u8>>,
    /// How often [`KvSink::targets`] is asked.
    pub targets_interval: Duration,
    /// First retry delay after a failure.
    pub backoff_min: Duration,
    /// Largest retry delay.
    pub backoff_max: Duration,
    /// Longest wait of one `poll(2)` call (the idle latency of stop and retries).
    pub poll_interval: Duration,
    /// Longest time from starting a TCP connect to a completed ZMTP handshake.
    pub handshake_timeout: Duration,
    /// Bytes one connection reads per loop turn at most.
    pub read_budget: usize,
    /// Size of one read.
    pub read_chunk: usize,
    /// How long a connection may stay behind (each turn ends with its read budget spent and
    /// data still unread) before it is dropped and marked stale.
    pub max_lag: Duration,
    /// Pending output (PONGs the peer does not read) above which a connection is dropped.
    pub max_output_bytes: usize,
    /// TCP keepalive idle time.
    pub keepalive: Duration,
    /// Silence after which a ZMTP 3.1 peer is sent a PING.
    pub heartbeat_interval: Duration,
    /// Silence after which a ZMTP 3.1 peer is considered dead.
    pub heartbeat_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            subscriptions: vec![Vec::new()],
            targets_interval: Duration::from_secs(1),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            poll_interval: Duration::from_millis(10),
            handshake_timeout: Duration::from_secs(5),
            read_budget: 1 << 20,
            read_chunk: 64 << 10,
            max_lag: Duration::from_secs(2),
            max_output_bytes: 64 << 10,
            keepalive: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            heartbeat_timeout: Duration::from_secs(15),
        }
    }
}

/// Counters the thread keeps (relaxed atomics; read them with [`Stats::snapshot`]).
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections with a completed handshake now (a gauge).
    pub connected: AtomicU64,
    /// Messages delivered.
    pub messages: AtomicU64,
    /// Bytes read from the sockets.
    pub bytes: AtomicU64,
    /// Sequence numbers skipped.
    pub gaps: AtomicU64,
    /// Handshakes completed on a target that had been connected before.
    pub reconnects: AtomicU64,
    /// [`KvSink::stale`] calls.
    pub stale: AtomicU64,
    /// Connections dropped for staying behind longer than `max_lag`, or for unsent output
    /// past `max_output_bytes`.
    pub dropped_behind: AtomicU64,
    /// Connections failed by a protocol error.
    pub protocol_errors: AtomicU64,
    /// Messages skipped because they were not topic + 8-octet sequence + payload.
    pub malformed: AtomicU64,
    /// Most bytes one connection's session held unparsed after a read (a high-water mark).
    pub peak_buffered: AtomicU64,
    /// Sink calls that panicked (caught; a panicking `deliver` is followed by `stale`).
    pub sink_panics: AtomicU64,
}

/// A copy of [`Stats`] at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// See [`Stats::connected`].
    pub connected: u64,
    /// See [`Stats::messages`].
    pub messages: u64,
    /// See [`Stats::bytes`].
    pub bytes: u64,
    /// See [`Stats::gaps`].
    pub gaps: u64,
    /// See [`Stats::reconnects`].
    pub reconnects: u64,
    /// See [`Stats::stale`].
    pub stale: u64,
    /// See [`Stats::dropped_behind`].
    pub dropped_behind: u64,
    /// See [`Stats::protocol_errors`].
    pub protocol_errors: u64,
    /// See [`Stats::malformed`].
    pub malformed: u64,
    /// See [`Stats::peak_buffered`].
    pub peak_buffered: u64,
    /// See [`Stats::sink_panics`].
    pub sink_panics: u64,
}

impl Stats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            connected: get(&self.connected),
            messages: get(&self.messages),
            bytes: get(&self.bytes),
            gaps: get(&self.gaps),
            reconnects: get(&self.reconnects),
            stale: get(&self.stale),
            dropped_behind: get(&self.dropped_behind),
            protocol_errors: get(&self.protocol_errors),
            malformed: get(&self.malformed),
            peak_buffered: get(&self.peak_buffered),
            sink_panics: get(&self.sink_panics),
        }
    }
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// The running subscriber thread. [`Handle::stop`] (or dropping the handle) stops and joins it.
#[derive(Debug)]
pub struct Handle {
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    thread: Option<JoinHandle<()>>,
}

impl Handle {
    /// The thread's counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Asks the thread to stop and waits for it (at most about one poll interval plus the
    /// sink call in progress). Connections are closed without `stale` calls.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            // A panic in the sink ended the thread; there is nothing left to stop.
            let _ = thread.join();
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the subscriber thread with [`Config::default`].
pub fn spawn(sink: Arc<dyn KvSink>) -> io::Result<Handle> {
    spawn_with(sink, Config::default())
}

/// Starts the subscriber thread with `config`.
pub fn spawn_with(sink: Arc<dyn KvSink>, config: Config) -> io::Result<Handle> {
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Stats::default());
    let thread = std::thread::Builder::new()
        .name("infergate-kv-events".into())
        .spawn({
            let stop = Arc::clone(&stop);
            let stats = Arc::clone(&stats);
            move || Subscriber::new(sink, config, stats).run(&stop)
        })?;
    Ok(Handle {
        stop,
        stats,
        thread: Some(thread),
    })
}

/// A connection's transport state.
enum Link {
    /// Not connected; try again at the given time.
    Idle { retry_at: Instant },
    /// TCP connect in progress.
    Connecting { socket: Socket, deadline: Instant },
    /// Connected; `deadline` bounds the handshake until it completes.
    Open {
        stream: TcpStream,
        session: Session,
        deadline: Option<Instant>,
        /// Last time bytes arrived (or the connection opened).
        last_rx: Instant,
        /// Last PING we queued.
        last_ping: Instant,
    },
}

/// One target and its connection.
struct Conn {
    target: KvTarget,
    link: Link,
    backoff: Duration,
    /// The next sequence number expected on the current connection.
    expected: Option<u64>,
    /// Whether a handshake ever completed for this target (later ones are reconnects).
    was_connected: bool,
    /// Since when every turn has ended with unread data (the connection is behind).
    behind_since: Option<Instant>,
}

/// Why a connection is closed.
#[derive(Debug)]
enum Close {
    Io,
    Protocol,
    Behind,
}

/// What one poll entry belongs to.
struct Slot {
    conn: usize,
    events: i16,
}

struct Subscriber {
    sink: Arc<dyn KvSink>,
    config: Config,
    stats: Arc<Stats>,
    conns: Vec<Conn>,
    next_targets: Instant,
}

impl Subscriber {
    fn new(sink: Arc<dyn KvSink>, config: Config, stats: Arc<Stats>) -> Self {
        Self {
            sink,
            config,
            stats,
            conns: Vec::new(),
            next_targets: Instant::now(),
        }
    }

    fn run(mut self, stop: &AtomicBool) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= self.next_targets {
                self.refresh_targets(now);
                self.next_targets = now + self.config.targets_interval;
            }
            self.start_due(now);
            fds.clear();
            slots.clear();
            for (i, conn) in self.conns.iter().enumerate() {
                let (fd, events) = match &conn.link {
                    Link::Idle { .. } => continue,
                    Link::Connecting { socket, .. } => (socket.as_raw_fd(), libc::POLLOUT),
                    Link::Open {
                        stream, session, ..
                    } => {
                        let out = if session.pending_output().is_empty() {
                            0
                        } else {
                            libc::POLLOUT
                        };
                        (stream.as_raw_fd(), libc::POLLIN | out)
                    }
                };
                fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
                slots.push(Slot { conn: i, events });
            }
            wait(&mut fds, self.wait_ms(now));
            let now = Instant::now();
            for (slot, fd) in slots.iter().zip(&fds) {
                if fd.revents != 0 {
                    self.on_ready(slot.conn, fd.revents & (slot.events | ERR_EVENTS), now);
                }
            }
            self.check_deadlines(now);
        }
    }

    /// The poll timeout: the poll interval, shorter when a retry is due sooner.
    fn wait_ms(&self, now: Instant) -> i32 {
        let mut wait = self.config.poll_interval;
        for conn in &self.conns {
            if let Link::Idle { retry_at } = conn.link {
                wait = wait.min(retry_at.saturating_duration_since(now));
            }
        }
        i32::try_from(wait.as_millis()).unwrap_or(i32::MAX)
    }

    /// Adds connections for new targets, closes those of removed ones.
    fn refresh_targets(&mut self, now: Instant) {
        let Some(listed) = contained(|| self.sink.targets(), &self.stats) else {
            return;
        };
        let wanted: HashSet<KvTarget> = listed.into_iter().collect();
        self.conns.retain(|c| wanted.contains(&c.target));
        let have: HashSet<KvTarget> = self.conns.iter().map(|c| c.target.clone()).collect();
        for target in wanted {
            if !have.contains(&target) {
                self.conns.push(Conn {
                    target,
                    link: Link::Idle { retry_at: now },
                    backoff: self.config.backoff_min,
                    expected: None,
                    was_connected: false,
                    behind_since: None,
                });
            }
        }
        if let Ok(n) = u64::try_from(self.connected_now()) {
            self.stats.connected.store(n, Ordering::Relaxed);
        }
    }

    fn connected_now(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| {
                matches!(&c.link, Link::Open { session, .. } if session.phase() == Phase::Traffic)
            })
            .count()
    }

    /// Starts a connect for every idle connection whose retry time has come.
    fn start_due(&mut self, now: Instant) {
        for i in 0..self.conns.len() {
            let due = matches!(self.conns[i].link, Link::Idle { retry_at } if retry_at <= now);
            if !due {
                continue;
            }
            match start_connect(&self.conns[i].target, &self.config) {
                Ok(socket) => {
                    self.conns[i].link = Link::Connecting {
                        socket,
                        deadline: now + self.config.handshake_timeout,
                    };
                }
                Err(_) => self.close(i, Close::Io, now),
            }
        }
    }

    /// Fails connections whose connect or handshake took too long or whose 3.1 peer fell
    /// silent; pings 3.1 peers that have been quiet for a heartbeat interval.
    fn check_deadlines(&mut self, now: Instant) {
        let (interval, timeout) = (
            self.config.heartbeat_interval,
            self.config.heartbeat_timeout,
        );
        for i in 0..self.conns.len() {
            let late = match &mut self.conns[i].link {
                Link::Idle { .. } => false,
                Link::Connecting { deadline, .. } => *deadline <= now,
                Link::Open {
                    deadline: Some(deadline),
                    ..
                } => *deadline <= now,
                Link::Open {
                    stream,
                    session,
                    last_rx,
                    last_ping,
                    ..
                } => {
                    let quiet = now.saturating_duration_since(*last_rx);
                    if session.peer_minor() >= 1 && quiet > timeout {
                        true
                    } else {
                        if quiet >= interval
                            && now.saturating_duration_since(*last_ping) >= interval
                            && session.ping()
                        {
                            *last_ping = now;
                        }
                        flush(stream, session).is_err()
                    }
                }
            };
            if late {
                self.close(i, Close::Io, now);
            }
        }
    }

    /// Handles the poll result `revents` of connection `i`.
    fn on_ready(&mut self, i: usize, revents: i16, now: Instant) {
        if revents == 0 {
            return;
        }
        if matches!(self.conns[i].link, Link::Connecting { .. }) {
            self.finish_connect(i, now);
            return;
        }
        if let Err(close) = self.drive(i) {
            self.close(i, close, now);
        }
    }

    /// A connecting socket became writable (or failed): open it or close it.
    fn finish_connect(&mut self, i: usize, now: Instant) {
        let idle = Link::Idle { retry_at: now };
        let Link::Connecting { socket, deadline } =
            std::mem::replace(&mut self.conns[i].link, idle)
        else {
            return;
        };
        match socket.take_error() {
            Ok(None) if socket.peer_addr().is_ok() => {}
            _ => return self.close(i, Close::Io, now),
        }
        let subscriptions: Vec<&[u8]> = self
            .config
            .subscriptions
            .iter()
            .map(Vec::as_slice)
            .collect();
        self.conns[i].link = Link::Open {
            stream: socket.into(),
            session: Session::new(&subscriptions, self.config.limits),
            deadline: Some(deadline),
            last_rx: now,
            last_ping: now,
        };
        if let Err(close) = self.drive(i) {
            self.close(i, close, now);
        }
    }

    /// Writes pending output, reads up to the budget and handles every event.
    fn drive(&mut self, i: usize) -> Result<(), Close> {
        let conn = &mut self.conns[i];
        let Link::Open {
            stream,
            session,
            deadline,
            last_rx,
            ..
        } = &mut conn.link
        else {
            return Ok(());
        };
        flush(stream, session)?;
        let mut budget = self.config.read_budget;
        let mut drained = false;
        while budget > 0 {
            let chunk = self.config.read_chunk.min(budget);
            match session.read_from(stream, chunk) {
                Ok(0) => return Err(Close::Io),
                Ok(n) => {
                    *last_rx = Instant::now();
                    budget = budget.saturating_sub(n);
                    bump(&self.stats.bytes, n as u64);
                    let held = session.buffered_input() as u64;
                    self.stats.peak_buffered.fetch_max(held, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drained = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Err(Close::Io),
            }
            loop {
                match session.poll() {
                    Ok(None) => break,
                    Ok(Some(Event::Ready)) => {
                        *deadline = None;
                        conn.backoff = self.config.backoff_min;
                        conn.expected = None;
                        if conn.was_connected {
                            bump(&self.stats.reconnects, 1);
                        }
                        conn.was_connected = true;
                        bump(&self.stats.connected, 1);
                    }
                    Ok(Some(Event::Message(message))) => {
                        let (Some(topic), Some(seq), Some(payload), 3) = (
                            message.frame(0),
                            message.frame(1),
                            message.frame(2),
                            message.len(),
                        ) else {
                            bump(&self.stats.malformed, 1);
                            continue;
                        };
                        let Ok(seq) = <[u8; 8]>::try_from(seq).map(u64::from_be_bytes) else {
                            bump(&self.stats.malformed, 1);
                            continue;
                        };
                        if conn.expected.is_some_and(|want| want != seq) {
                            bump(&self.stats.gaps, 1);
                            bump(&self.stats.stale, 1);
                            let (sink, target) = (&self.sink, &conn.target);
                            contained(|| sink.stale(target), &self.stats);
                        }
                        conn.expected = seq.checked_add(1);
                        let (sink, target) = (&self.sink, &conn.target);
                        if contained(|| sink.deliver(target, topic, seq, payload), &self.stats)
                            .is_none()
                        {
                            // What the sink applied of this message is unknown: forget it all.
                            bump(&self.stats.stale, 1);
                            contained(|| sink.stale(target), &self.stats);
                        }
                        bump(&self.stats.messages, 1);
                    }
                    Err(_) => {
                        bump(&self.stats.protocol_errors, 1);
                        return Err(Close::Protocol);
                    }
                }
            }
        }
        // Answer what the events queued (PONGs) now rather than at the next turn.
        flush(stream, session)?;
        if session.pending_output().len() > self.config.max_output_bytes {
            return Err(Close::Behind);
        }
        if drained {
            conn.behind_since = None;
        } else {
            let now = Instant::now();
            if now.duration_since(*conn.behind_since.get_or_insert(now)) > self.config.max_lag {
                return Err(Close::Behind);
            }
        }
        Ok(())
    }

    /// Closes connection `i`: `stale` if it had completed its handshake (or fell behind), and
    /// a retry after the current backoff, which doubles.
    fn close(&mut self, i: usize, why: Close, now: Instant) {
        let conn = &mut self.conns[i];
        let retry_at = now + conn.backoff;
        let old = std::mem::replace(&mut conn.link, Link::Idle { retry_at });
        let was_open =
            matches!(&old, Link::Open { session, .. } if session.phase() == Phase::Traffic);
        drop(old);
        if matches!(why, Close::Behind) {
            bump(&self.stats.dropped_behind, 1);
        }
        if was_open {
            self.stats.connected.fetch_sub(1, Ordering::Relaxed);
            bump(&self.stats.stale, 1);
            let (sink, target) = (&self.sink, &conn.target);
            contained(|| sink.stale(target), &self.stats);
        } else {
            conn.backoff = (conn.backoff * 2).min(self.config.backoff_max);
        }
        conn.expected = None;
        conn.behind_since = None;
    }
}

/// Runs one sink call; a panic in it is caught and counted (`None`), so the thread lives on.
fn contained<T>(call: impl FnOnce() -> T, stats: &Stats) -> Option<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(call)) {
        Ok(value) => Some(value),
        Err(_) => {
            bump(&stats.sink_panics, 1);
            None
        }
    }
}

/// Poll events that are reported whether asked for or not.
const ERR_EVENTS: i16 = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;

/// Waits for any of `fds` (or `timeout_ms`).
fn wait(fds: &mut [libc::pollfd], timeout_ms: i32) {
    let Ok(n) = libc::nfds_t::try_from(fds.len()) else {
        return;
    };
    // SAFETY: `fds` is a valid, exclusively borrowed array of `n` pollfd structs for the
    // duration of the call; poll(2) only writes their `revents`.
    unsafe {
        libc::poll(fds.as_mut_ptr(), n, timeout_ms);
    }
}

/// Writes as much of the session's pending output as the socket takes.
fn flush(stream: &mut TcpStream, session: &mut Session) -> Result<(), Close> {
    while !session.pending_output().is_empty() {
        match stream.write(session.pending_output()) {
            Ok(0) => return Err(Close::Io),
            Ok(n) => session.consume_output(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Close::Io),
        }
    }
    Ok(())
}

/// A non-blocking socket with a TCP connect to `target.events` started (or done).
fn start_connect(target: &KvTarget, config: &Config) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(target.events),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.set_tcp_keepalive(&TcpKeepalive::new().with_time(config.keepalive))?;
    match socket.connect(&target.events.into()) {
        Ok(()) => Ok(socket),
        Err(e)
            if e.raw_os_error() == Some(libc::EINPROGRESS)
                || e.kind() == io::ErrorKind::WouldBlock =>
        {
            Ok(socket)
        }
        Err(e) => Err(e),
    }
}
