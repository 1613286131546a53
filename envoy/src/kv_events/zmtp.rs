//! The subscriber's side of ZMTP 3.1 with the NULL mechanism, as a sans-IO state machine over
//! byte buffers: [`Session`] takes the bytes read from the peer ([`Session::feed`] or
//! [`Session::read_from`]), hands back what to write ([`Session::pending_output`]) and yields
//! [`Event`]s from [`Session::poll`]. It never touches a socket, so it is tested (and can be
//! fuzzed) on plain byte slices.
//!
//! The conversation, for one connection:
//! 1. Both peers send a 64-octet greeting: signature (`FF`, 8 padding octets, `7F`), version
//!    3.1, mechanism `NULL` (zero-padded to 20 octets), as-server 0, 31 zero octets. The
//!    greeting is queued by [`Session::new`]. A peer whose greeting is not ZMTP ≥ 3.0 with
//!    the NULL mechanism is refused.
//! 2. After the peer's greeting we send a READY command with the property
//!    `Socket-Type = SUB` and wait for the peer's READY, whose `Socket-Type` must be `PUB` or
//!    `XPUB`. An ERROR command ends the connection.
//! 3. Then we subscribe: to a 3.1 (or newer) peer with SUBSCRIBE commands, to a 3.0 peer
//!    (as the `zeromq` crate announces itself) with the older form, a one-frame message of
//!    `01` followed by the prefix. libzmq's XPUB/PUB accepts both from any 3.x peer.
//! 4. Traffic: multipart messages (frames with the MORE flag, short or long size) become
//!    [`Event::Message`], borrowing the session's input buffer (no copy); a PING command is
//!    answered with a PONG echoing its context; other commands (PONG among them) are
//!    ignored. [`Session::ping`] queues our own PING to a 3.1 peer.
//!
//! Bounds ([`Limits`]): a message's total body size and frame count, a command's size; a
//! frame header that announces more than the bound is an error before its body arrives, so
//! the input buffer never holds more than one bounded message plus one read. Any error is
//! fatal for the connection (the caller drops it and reconnects).

use std::fmt;
use std::io::{self, Read};

/// Length of the greeting each peer sends first.
pub const GREETING_LEN: usize = 64;
/// The MORE flag: more frames of this message follow.
const FLAG_MORE: u8 = 0x01;
/// The LONG flag: the size is 8 octets (network order) instead of 1.
const FLAG_LONG: u8 = 0x02;
/// The COMMAND flag: the frame is a command, not a message frame.
const FLAG_COMMAND: u8 = 0x04;
/// The mechanism field of our greeting and the only one we accept.
const MECHANISM_NULL: &[u8] = b"NULL";
/// Input buffer capacity kept between messages; more is released after a large message.
const RETAINED_INPUT: usize = 1 << 20;
/// The longest ping context a PONG echoes.
const MAX_PING_CONTEXT: usize = 16;

/// Bounds on what a peer may make us hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest total body size of one multipart message.
    pub max_message_bytes: usize,
    /// Most frames in one message.
    pub max_frames: usize,
    /// Largest body of one command frame.
    pub max_command_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 16 << 20,
            max_frames: 64,
            max_command_bytes: 64 << 10,
        }
    }
}

/// Why a session failed; every error ends the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ZmtpError {
    /// The peer's first 10 octets are not the ZMTP signature.
    BadSignature,
    /// The peer speaks a major version below 3.
    UnsupportedVersion {
        /// The peer's major version octet.
        major: u8,
    },
    /// The peer's mechanism is not NULL.
    Mechanism,
    /// A frame's reserved flag bits are set.
    ReservedFlags(u8),
    /// A command frame carries the MORE flag, or a command frame arrived inside a message.
    MisplacedCommand,
    /// A command's body exceeds [`Limits::max_command_bytes`].
    CommandTooLarge(u64),
    /// A message's bodies exceed [`Limits::max_message_bytes`].
    MessageTooLarge(u64),
    /// A message has more than [`Limits::max_frames`] frames.
    TooManyFrames,
    /// A command frame whose name or properties do not parse.
    MalformedCommand,
    /// The peer's READY is missing `Socket-Type` or names a type other than PUB/XPUB.
    PeerSocketType(Vec<u8>),
    /// The peer sent something other than READY/ERROR during the handshake.
    UnexpectedDuringHandshake,
    /// The peer sent an ERROR command, with its reason.
    PeerError(String),
    /// The session already failed; it yields nothing more.
    Failed,
}

impl fmt::Display for ZmtpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadSignature => f.write_str("not a ZMTP greeting"),
            Self::UnsupportedVersion { major } => write!(f, "ZMTP major version {major} < 3"),
            Self::Mechanism => f.write_str("security mechanism is not NULL"),
            Self::ReservedFlags(flags) => write!(f, "reserved frame flags set: {flags:#04x}"),
            Self::MisplacedCommand => f.write_str("command frame with MORE or inside a message"),
            Self::CommandTooLarge(n) => write!(f, "command of {n} bytes exceeds the bound"),
            Self::MessageTooLarge(n) => write!(f, "message of {n}+ bytes exceeds the bound"),
            Self::TooManyFrames => f.write_str("message has too many frames"),
            Self::MalformedCommand => f.write_str("malformed command"),
            Self::PeerSocketType(t) => {
                write!(
                    f,
                    "peer socket type {:?} is not PUB/XPUB",
                    String::from_utf8_lossy(t)
                )
            }
            Self::UnexpectedDuringHandshake => f.write_str("unexpected frame during handshake"),
            Self::PeerError(reason) => write!(f, "peer sent ERROR: {reason}"),
            Self::Failed => f.write_str("session already failed"),
        }
    }
}

impl std::error::Error for ZmtpError {}

/// Where the session is in the conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the peer's 64-octet greeting.
    Greeting,
    /// Greeting exchanged, READY sent, waiting for the peer's READY.
    Handshake,
    /// Subscribed; messages flow.
    Traffic,
    /// An error ended the session.
    Failed,
}

/// What [`Session::poll`] yields.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// The handshake finished and the subscriptions are queued; yielded once.
    Ready,
    /// One complete multipart message.
    Message(Message<'a>),
}

/// One multipart message, borrowing the session's input buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Message<'a> {
    buf: &'a [u8],
    frames: &'a [(usize, usize)],
}

impl<'a> Message<'a> {
    /// Number of frames.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether the message has no frames (never true for a decoded message).
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The body of frame `i`.
    pub fn frame(&self, i: usize) -> Option<&'a [u8]> {
        let &(start, end) = self.frames.get(i)?;
        self.buf.get(start..end)
    }

    /// Every frame's body, in order.
    pub fn frames(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        (0..self.frames.len()).filter_map(|i| self.frame(i))
    }
}

/// A parsed frame header: flags, header length (2 or 9), body size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameHeader {
    flags: u8,
    header_len: usize,
    size: u64,
}

/// Parses the frame header at the start of `buf`; `None` when more octets are needed.
fn frame_header(buf: &[u8]) -> Result<Option<FrameHeader>, ZmtpError> {
    let Some(&flags) = buf.first() else {
        return Ok(None);
    };
    if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0 {
        return Err(ZmtpError::ReservedFlags(flags));
    }
    if flags & FLAG_LONG == 0 {
        Ok(buf.get(1).map(|&size| FrameHeader {
            flags,
            header_len: 2,
            size: u64::from(size),
        }))
    } else {
        let Some(raw) = buf.get(1..9) else {
            return Ok(None);
        };
        let mut size = [0u8; 8];
        size.copy_from_slice(raw);
        Ok(Some(FrameHeader {
            flags,
            header_len: 9,
            size: u64::from_be_bytes(size),
        }))
    }
}

/// A command frame's body split into name and data.
fn split_command(body: &[u8]) -> Result<(&[u8], &[u8]), ZmtpError> {
    let (&name_len, rest) = body.split_first().ok_or(ZmtpError::MalformedCommand)?;
    let name_len = usize::from(name_len);
    if name_len == 0 || rest.len() < name_len {
        return Err(ZmtpError::MalformedCommand);
    }
    Ok(rest.split_at(name_len))
}

/// The value of property `wanted` (case-insensitive) in a READY command's metadata.
fn ready_property<'a>(mut props: &'a [u8], wanted: &[u8]) -> Result<Option<&'a [u8]>, ZmtpError> {
    let mut found = None;
    while let Some((&name_len, rest)) = props.split_first() {
        let name_len = usize::from(name_len);
        if name_len == 0 || rest.len() < name_len + 4 {
            return Err(ZmtpError::MalformedCommand);
        }
        let (name, rest) = rest.split_at(name_len);
        let (len, rest) = rest.split_at(4);
        let value_len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if rest.len() < value_len {
            return Err(ZmtpError::MalformedCommand);
        }
        let (value, rest) = rest.split_at(value_len);
        if found.is_none() && name.eq_ignore_ascii_case(wanted) {
            found = Some(value);
        }
        props = rest;
    }
    Ok(found)
}

/// Appends one frame (short or long as its size needs) with `flags` (MORE/COMMAND) to `out`.
pub fn encode_frame(flags: u8, body: &[u8], out: &mut Vec<u8>) {
    if let Ok(short) = u8::try_from(body.len()) {
        out.push(flags & !FLAG_LONG);
        out.push(short);
    } else {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(body);
}

/// Appends a command frame `name` + `data` to `out` (`name` at most 255 octets; longer names
/// are cut).
pub fn encode_command(name: &[u8], data: &[u8], out: &mut Vec<u8>) {
    let name = &name[..name.len().min(255)];
    let mut body = Vec::with_capacity(1 + name.len() + data.len());
    body.push(name.len() as u8);
    body.extend_from_slice(name);
    body.extend_from_slice(data);
    encode_frame(FLAG_COMMAND, &body, out);
}

/// Appends a READY command announcing `socket_type` to `out`.
pub fn encode_ready(socket_type: &[u8], out: &mut Vec<u8>) {
    let mut props = Vec::with_capacity(16 + socket_type.len());
    props.push(11);
    props.extend_from_slice(b"Socket-Type");
    props.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    props.extend_from_slice(socket_type);
    encode_command(b"READY", &props, out);
}

/// Appends a multipart message of `frames` to `out`.
pub fn encode_message(frames: &[&[u8]], out: &mut Vec<u8>) {
    let last = frames.len().saturating_sub(1);
    for (i, frame) in frames.iter().enumerate() {
        encode_frame(if i < last { FLAG_MORE } else { 0 }, frame, out);
    }
}

/// Appends a ZMTP 3.`minor` greeting with the NULL mechanism (as-server 0) to `out`.
pub fn encode_greeting(minor: u8, out: &mut Vec<u8>) {
    let mut greeting = [0u8; GREETING_LEN];
    greeting[0] = 0xFF;
    greeting[9] = 0x7F;
    greeting[10] = 3;
    greeting[11] = minor;
    greeting[12..12 + MECHANISM_NULL.len()].copy_from_slice(MECHANISM_NULL);
    out.extend_from_slice(&greeting);
}

/// A command frame's name and data.
type Command = (Vec<u8>, Vec<u8>);

/// One SUB connection's protocol state (see the module doc).
#[derive(Debug)]
pub struct Session {
    phase: Phase,
    limits: Limits,
    /// Bytes received; `input[consumed..]` is not parsed yet.
    input: Vec<u8>,
    consumed: usize,
    /// Bytes to send; `output[sent..]` is not written yet.
    output: Vec<u8>,
    sent: usize,
    subscriptions: Vec<Vec<u8>>,
    /// The peer's minor version (from its greeting).
    peer_minor: u8,
    /// Frame body ranges of the message last yielded.
    frames: Vec<(usize, usize)>,
}

impl Session {
    /// A new session that will subscribe to each prefix of `subscriptions` (an empty prefix:
    /// every message); our greeting is queued as output.
    pub fn new(subscriptions: &[&[u8]], limits: Limits) -> Self {
        let mut output = Vec::with_capacity(256);
        encode_greeting(1, &mut output);
        Self {
            phase: Phase::Greeting,
            limits,
            input: Vec::new(),
            consumed: 0,
            output,
            sent: 0,
            subscriptions: subscriptions.iter().map(|s| s.to_vec()).collect(),
            peer_minor: 0,
            frames: Vec::new(),
        }
    }

    /// Where the conversation is.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The peer's ZMTP minor version (0 until its greeting arrived).
    pub fn peer_minor(&self) -> u8 {
        self.peer_minor
    }

    /// Queues a PING (TTL 0, empty context) when the peer speaks ZMTP 3.1 or newer and the
    /// handshake is done; returns whether it did. A 3.0 peer has no heartbeat commands (the
    /// `zeromq` crate's 0.7 PUB, for one, fails a connection on an unknown command).
    pub fn ping(&mut self) -> bool {
        if self.phase != Phase::Traffic || self.peer_minor < 1 {
            return false;
        }
        encode_command(b"PING", &[0, 0], &mut self.output);
        true
    }

    /// Bytes waiting to be written to the peer.
    pub fn pending_output(&self) -> &[u8] {
        self.output.get(self.sent..).unwrap_or(&[])
    }

    /// Marks the first `n` pending output bytes as written.
    pub fn consume_output(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.output.len());
        if self.sent == self.output.len() {
            self.output.clear();
            self.sent = 0;
        }
    }

    /// Bytes received and not yet consumed by a yielded event (the connection's backlog in
    /// user space).
    pub fn buffered_input(&self) -> usize {
        self.input.len() - self.consumed
    }

    /// Drops the consumed prefix of the input buffer, and gives back the memory a large
    /// message needed once the buffer is small again.
    fn compact(&mut self) {
        if self.consumed == 0 {
            return;
        }
        if self.consumed == self.input.len() {
            self.input.clear();
        } else {
            self.input.drain(..self.consumed);
        }
        self.consumed = 0;
        if self.input.capacity() > RETAINED_INPUT && self.input.len() <= RETAINED_INPUT / 4 {
            self.input.shrink_to(RETAINED_INPUT);
        }
    }

    /// Appends bytes received from the peer.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.compact();
        self.input.extend_from_slice(bytes);
    }

    /// Reads at most `max` bytes from `reader` into the input buffer; returns what `read`
    /// returned (0 = end of stream).
    pub fn read_from<R: Read>(&mut self, reader: &mut R, max: usize) -> io::Result<usize> {
        self.compact();
        let start = self.input.len();
        self.input.resize(start + max, 0);
        let result = reader.read(&mut self.input[start..]);
        let got = *result.as_ref().unwrap_or(&0);
        self.input.truncate(start + got);
        result
    }

    /// Fails the session with `error`.
    fn fail<T>(&mut self, error: ZmtpError) -> Result<T, ZmtpError> {
        self.phase = Phase::Failed;
        Err(error)
    }

    /// The next event, `Ok(None)` when more input is needed. After an error the session is
    /// [`Phase::Failed`] and every later call returns [`ZmtpError::Failed`].
    pub fn poll(&mut self) -> Result<Option<Event<'_>>, ZmtpError> {
        loop {
            match self.phase {
                Phase::Failed => return Err(ZmtpError::Failed),
                Phase::Greeting => {
                    if !self.take_greeting()? {
                        return Ok(None);
                    }
                }
                Phase::Handshake => {
                    let Some((name, data)) = self.take_command()? else {
                        return Ok(None);
                    };
                    self.on_handshake_command(name, data)?;
                    if self.phase == Phase::Traffic {
                        return Ok(Some(Event::Ready));
                    }
                }
                Phase::Traffic => {
                    let rest = &self.input[self.consumed..];
                    let Some(header) = frame_header(rest).or_else(|e| self.fail(e))? else {
                        return Ok(None);
                    };
                    if header.flags & FLAG_COMMAND != 0 {
                        let Some((name, data)) = self.take_command()? else {
                            return Ok(None);
                        };
                        self.on_traffic_command(name, data)?;
                        continue;
                    }
                    if self.scan_message()? {
                        let message = Message {
                            buf: &self.input,
                            frames: &self.frames,
                        };
                        return Ok(Some(Event::Message(message)));
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// Consumes and checks the peer's greeting; false when it has not fully arrived.
    fn take_greeting(&mut self) -> Result<bool, ZmtpError> {
        let rest = &self.input[self.consumed..];
        // Reject a non-ZMTP peer as soon as its first octets show it.
        if rest.first().is_some_and(|&b| b != 0xFF) || rest.get(9).is_some_and(|&b| b != 0x7F) {
            return self.fail(ZmtpError::BadSignature);
        }
        if let Some(&major) = rest.get(10) {
            if major < 3 {
                return self.fail(ZmtpError::UnsupportedVersion { major });
            }
        }
        let Some(greeting) = rest.get(..GREETING_LEN) else {
            return Ok(false);
        };
        let minor = greeting[11];
        let mechanism = &greeting[12..32];
        let (name, padding) = mechanism.split_at(MECHANISM_NULL.len());
        if name != MECHANISM_NULL || padding.iter().any(|&b| b != 0) {
            return self.fail(ZmtpError::Mechanism);
        }
        // A peer with a higher major version speaks our 3.1 framing (spec: the lower side's).
        self.peer_minor = if greeting[10] > 3 { u8::MAX } else { minor };
        self.consumed += GREETING_LEN;
        encode_ready(b"SUB", &mut self.output);
        self.phase = Phase::Handshake;
        Ok(true)
    }

    /// Consumes one command frame; `None` when it has not fully arrived. Returns a copy of
    /// its name and data (commands are rare and small).
    fn take_command(&mut self) -> Result<Option<Command>, ZmtpError> {
        let header = frame_header(&self.input[self.consumed..]);
        let Some(header) = header.or_else(|e| self.fail(e))? else {
            return Ok(None);
        };
        if header.flags & FLAG_COMMAND == 0 {
            return self.fail(ZmtpError::UnexpectedDuringHandshake);
        }
        if header.flags & FLAG_MORE != 0 {
            return self.fail(ZmtpError::MisplacedCommand);
        }
        if header.size > self.limits.max_command_bytes as u64 {
            return self.fail(ZmtpError::CommandTooLarge(header.size));
        }
        let size = header.size as usize;
        let rest = &self.input[self.consumed..];
        let Some(body) = rest.get(header.header_len..header.header_len + size) else {
            return Ok(None);
        };
        let (name, data) = match split_command(body) {
            Ok((name, data)) => (name.to_vec(), data.to_vec()),
            Err(e) => return self.fail(e),
        };
        self.consumed += header.header_len + size;
        Ok(Some((name, data)))
    }

    /// READY completes the handshake (and queues the subscriptions); ERROR fails it.
    fn on_handshake_command(&mut self, name: Vec<u8>, data: Vec<u8>) -> Result<(), ZmtpError> {
        if name.eq_ignore_ascii_case(b"ERROR") {
            return self.fail(peer_error(&data));
        }
        if !name.eq_ignore_ascii_case(b"READY") {
            return self.fail(ZmtpError::UnexpectedDuringHandshake);
        }
        let socket_type = match ready_property(&data, b"Socket-Type") {
            Ok(t) => t.unwrap_or(&[]),
            Err(e) => return self.fail(e),
        };
        if socket_type != b"PUB" && socket_type != b"XPUB" {
            return self.fail(ZmtpError::PeerSocketType(socket_type.to_vec()));
        }
        for prefix in &self.subscriptions {
            if self.peer_minor >= 1 {
                encode_command(b"SUBSCRIBE", prefix, &mut self.output);
            } else {
                let mut body = Vec::with_capacity(1 + prefix.len());
                body.push(1);
                body.extend_from_slice(prefix);
                encode_frame(0, &body, &mut self.output);
            }
        }
        self.phase = Phase::Traffic;
        Ok(())
    }

    /// PING is answered with PONG; ERROR fails the session; anything else is ignored.
    fn on_traffic_command(&mut self, name: Vec<u8>, data: Vec<u8>) -> Result<(), ZmtpError> {
        if name.eq_ignore_ascii_case(b"PING") {
            let context = data.get(2..).unwrap_or(&[]);
            let context = &context[..context.len().min(MAX_PING_CONTEXT)];
            encode_command(b"PONG", context, &mut self.output);
        } else if name.eq_ignore_ascii_case(b"ERROR") {
            return self.fail(peer_error(&data));
        }
        Ok(())
    }

    /// Scans the frames of the message at the cursor; when all have arrived, records their
    /// ranges in `frames`, consumes them and returns true.
    fn scan_message(&mut self) -> Result<bool, ZmtpError> {
        self.frames.clear();
        let mut at = self.consumed;
        let mut total: u64 = 0;
        loop {
            let rest = &self.input[at..];
            let Some(header) = frame_header(rest).or_else(|e| self.fail(e))? else {
                return Ok(false);
            };
            if header.flags & FLAG_COMMAND != 0 {
                return self.fail(ZmtpError::MisplacedCommand);
            }
            total = total.saturating_add(header.size);
            if total > self.limits.max_message_bytes as u64 {
                return self.fail(ZmtpError::MessageTooLarge(total));
            }
            if self.frames.len() >= self.limits.max_frames {
                return self.fail(ZmtpError::TooManyFrames);
            }
            let start = at + header.header_len;
            let end = start + header.size as usize;
            if end > self.input.len() {
                return Ok(false);
            }
            self.frames.push((start, end));
            at = end;
            if header.flags & FLAG_MORE == 0 {
                self.consumed = at;
                return Ok(true);
            }
        }
    }
}

/// The reason an ERROR command carries (a short-size string).
fn peer_error(data: &[u8]) -> ZmtpError {
    let reason = data
        .split_first()
        .map(|(&len, rest)| &rest[..rest.len().min(usize::from(len))])
        .unwrap_or(&[]);
    ZmtpError::PeerError(String::from_utf8_lossy(reason).into_owned())
}

#[cfg(test)]
mod tests;
