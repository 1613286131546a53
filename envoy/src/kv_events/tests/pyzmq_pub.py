"""A libzmq publisher (through pyzmq) for the subscriber's interop test.

An XPUB socket, so the script sees the subscription our SUB sends (libzmq turns a
ZMTP 3.1 SUBSCRIBE command into a message of 0x01 + prefix). Heartbeats are on: libzmq sends
PING every 50 ms and drops a peer that stays silent for 1 s, so the connection lives only
if the subscriber answers PONG.

Prints the port, then `subscribed <hex>`; sends sequence numbers 0..499 and 501..999 (500
is skipped: a gap), waits two seconds of heartbeats, sends 1000..1099, prints `sent`, and exits
when standard input closes.
"""

import sys
import time

import zmq

ctx = zmq.Context()
pub = ctx.socket(zmq.XPUB)
pub.setsockopt(zmq.HEARTBEAT_IVL, 50)
pub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 1000)
pub.setsockopt(zmq.SNDHWM, 100000)
port = pub.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
pub.setsockopt(zmq.RCVTIMEO, 10000)
subscription = pub.recv()
print("subscribed", subscription.hex(), flush=True)
topic = b"kv@pod-a@Qwen/Qwen3-0.6B"


def send(seq):
    pub.send_multipart([topic, seq.to_bytes(8, "big"), b"\x93" + bytes(100)])


for seq in range(0, 500):
    send(seq)
for seq in range(501, 1000):
    send(seq)
time.sleep(2.0)
for seq in range(1000, 1100):
    send(seq)
print("sent", flush=True)
sys.stdin.read()
pub.close(linger=0)
ctx.term()
