"""Interop check: libzmq (pyzmq) subscribes to a simulated replica's KV events and msgpack
decodes them as vLLM's consumers do.

Usage: python3 kv_events_check.py HTTP_URL EVENTS_ENDPOINT
  e.g. infergate-sim --kv-events-port-offset 1000 --port 8000, then
       python3 kv_events_check.py http://127.0.0.1:8000 tcp://127.0.0.1:9000
Exits 0 after seeing a BlockStored (with token ids matching /tokenize) and an
AllBlocksCleared with consecutive sequence numbers; prints what it decoded.
"""

import json
import sys
import urllib.request

import msgpack
import zmq


def post(url, path, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(
        url + path, data=data, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def main(url, endpoint):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(endpoint)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)

    def recv(ms):
        if not poller.poll(ms):
            return None
        topic, seq, payload = sub.recv_multipart()
        ts, events, dp_rank = msgpack.unpackb(payload)
        return topic.decode(), int.from_bytes(seq, "big"), ts, events, dp_rank

    got = None
    for _ in range(100):  # until the subscription has landed
        post(url, "/reset_prefix_cache")
        got = recv(100)
        if got and ["AllBlocksCleared"] in got[3]:
            break
    assert got, "no message"
    last = got[1]
    print("subscribed:", got[0], "seq", last)
    chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hello " * 40}]}
    post(url, "/v1/chat/completions", dict(chat, max_tokens=2))
    tokens = post(url, "/tokenize", chat)["tokens"]
    stored = None
    while stored is None:
        m = recv(5000)
        assert m, "no BlockStored"
        assert m[1] == last + 1, (m[1], last)
        last = m[1]
        for ev in m[3]:
            if ev[0] == "BlockStored":
                stored = ev
    tag, hashes, parent, token_ids, block_size, lora_id, medium, lora_name = stored
    assert parent is None and block_size == 16 and len(token_ids) == 16 * len(hashes)
    assert token_ids == tokens[: len(token_ids)], "token ids are /tokenize's"
    print(f"BlockStored: {len(hashes)} blocks, first hash {hashes[0]}, block_size {block_size}")
    post(url, "/reset_prefix_cache")
    m = recv(5000)
    assert m and m[1] == last + 1 and m[3] == [["AllBlocksCleared"]], m
    print("AllBlocksCleared at seq", m[1], "ts", m[2], "dp_rank", m[4])
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
