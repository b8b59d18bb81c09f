#!/usr/bin/env python3
"""Hostile clients and bad files for scripts/fault-matrix.sh: the standard library and libzmq
through ctypes only (no pyzmq, no protobuf module: the few header fields a registration needs are
encoded here, after proto/flodl.proto).

  fault_tool.py garbage HOST PORT CONNS BYTES       random bytes on CONNS connections
  fault_tool.py flood HOST PORT N SRC               N idle connections from address SRC, each
                                                    opened again a second after it is closed;
                                                    a status line a second; runs until killed
  fault_tool.py httphold HOST PORT N SRC            N HTTP clients from address SRC: half idle,
                                                    half sending a byte of a request whose
                                                    headers never end every 0.5 s; each opened
                                                    again 0.1 s after it is closed; a status
                                                    line a second; runs until killed
  fault_tool.py probe HOST PORT N TIMEOUT_MS        N GETs of /healthz, 50 ms apart: each
                                                    one's latency, then "K of N answered 200
                                                    ... median M ms, max X ms"; exit 1 unless
                                                    all N did within TIMEOUT_MS
  fault_tool.py takeover ENDPOINT RANK WORLD
                                                    registers RANK from another host and pid;
                                                    exit 0 when refused, 1 when not (prints why)
  fault_tool.py takeover-server ENDPOINT SHARDS HOST PID
                                                    claims the server role for shards
                                                    0..SHARDS-1, from another host and pid, then
                                                    with the server's HOST and PID; exit 0 when
                                                    both are refused telling nothing, 1 when not
  fault_tool.py takeover-stalled ENDPOINT RANK WORLD HOST PID PERIOD_MS UNTIL_MS
                                                    stops PID (SIGSTOP), claims RANK with its
                                                    HOST and PID on a new connection every
                                                    PERIOD_MS until UNTIL_MS, then SIGCONT;
                                                    exit 0 when every claim is refused telling
                                                    nothing
  fault_tool.py bigmsg ENDPOINT FRAMES BYTES HOLD_S one message of FRAMES frames of BYTES each
                                                    (zero-copy), the socket held HOLD_S seconds
  fault_tool.py hdrflood ENDPOINT SECONDS FRAMES [KEYDIR]
                                                    heartbeat headers declaring FRAMES frames
                                                    (6 bytes each) as fast as the socket takes
                                                    them for SECONDS (with KEYDIR: under CURVE,
                                                    with the job's client key); prints what
                                                    was sent and the slowest answer to a probe
  fault_tool.py partial HOST PORT CONNS MIB HOLD_S  CONNS raw ZMTP connections (NULL mechanism)
                                                    each sending MIB MiB of a message whose last
                                                    frame never comes, held HOLD_S seconds;
                                                    prints how many took all their bytes
  fault_tool.py idx IMAGES LABELS N BAD_LABEL       IDX files of N 8x8 images; label 0 is BAD_LABEL
  fault_tool.py safetensors PATH LAYERS MODE        the MLP LAYERS (e.g. 64,256,128,10) as
                                                    --init: MODE ok, transposed or nan
"""
import ctypes
import json
import os
import re
import selectors
import signal
import socket
import struct
import sys
import time

ZMQ_DEALER = 5
ZMQ_SNDMORE = 2
ZMQ_RCVMORE = 13
ZMQ_LINGER = 17
ZMQ_RCVTIMEO = 27
ZMQ_DONTWAIT = 1
ZMQ_CURVE_PUBLICKEY = 48
ZMQ_CURVE_SECRETKEY = 49
ZMQ_CURVE_SERVERKEY = 50


def garbage(host, port, conns, nbytes):
    sent = 0
    for i in range(int(conns)):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            data = os.urandom(int(nbytes))
            if i % 2:
                # A ZMTP greeting's first bytes, then nonsense: the parser gets further.
                data = b"\xff" + b"\0" * 8 + b"\x7f\x03\x00" + data
            try:
                s.sendall(data)
                sent += len(data)
            except OSError:
                pass  # the server may close on the first bad byte
    print("sent %d bytes on %s connections" % (sent, conns))


def flood(host, port, n, src):
    n = int(n)
    sel = selectors.DefaultSelector()
    socks = [None] * n
    again = [0.0] * n
    opened = established = closed = 0
    next_report = 0.0
    while True:
        now = time.monotonic()
        connecting = sum(1 for s in socks if s is not None and s[1] == "c")
        for i in range(n):
            if socks[i] is None and now >= again[i] and connecting < 64:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.bind((src, 0))
                    s.connect((host, int(port)))
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    again[i] = now + 1.0
                    continue
                socks[i] = (s, "c")
                sel.register(s, selectors.EVENT_WRITE, i)
                opened += 1
                connecting += 1
        for key, _ in sel.select(timeout=0.05):
            i = key.data
            s, state = socks[i]
            if state == "c":
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                    sel.unregister(s)
                    s.close()
                    socks[i] = None
                    again[i] = time.monotonic() + 1.0
                    continue
                socks[i] = (s, "o")
                established += 1
                sel.modify(s, selectors.EVENT_READ, i)
                continue
            try:
                data = s.recv(512)  # the server's greeting, never answered
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(s)
                s.close()
                socks[i] = None
                closed += 1
                again[i] = time.monotonic() + 1.0
        if time.monotonic() >= next_report:
            live = sum(1 for s in socks if s is not None and s[1] == "o")
            print("opened %d established %d closed-by-server %d open-now %d"
                  % (opened, established, closed, live), flush=True)
            next_report = time.monotonic() + 1.0


def httphold(host, port, n, src):
    n = int(n)
    line = b"GET /healthz HTTP/1.1\r\nX-Slow: "
    sel = selectors.DefaultSelector()
    socks = [None] * n  # (socket, state "c" connecting | "o" open, bytes sent)
    again = [0.0] * n
    opened = closed = 0
    next_byte = next_report = 0.0
    while True:
        now = time.monotonic()
        for i in range(n):
            if socks[i] is None and now >= again[i]:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.bind((src, 0))
                    s.connect((host, int(port)))
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    again[i] = now + 0.1
                    continue
                socks[i] = [s, "c", 0]
                sel.register(s, selectors.EVENT_WRITE, i)
                opened += 1
        for key, _ in sel.select(timeout=0.02):
            i = key.data
            s = socks[i][0]
            if socks[i][1] == "c" and s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                socks[i][1] = "o"
                sel.modify(s, selectors.EVENT_READ, i)
                continue
            try:
                data = s.recv(512) if socks[i][1] == "o" else b""
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(s)
                s.close()
                socks[i] = None
                closed += 1
                again[i] = time.monotonic() + 0.1
        if time.monotonic() >= next_byte:  # the slow half: one byte each
            for i in range(n // 2, n):
                if socks[i] is not None and socks[i][1] == "o":
                    b = line[socks[i][2]:socks[i][2] + 1] or b"a"
                    try:
                        socks[i][2] += socks[i][0].send(b)
                    except OSError:
                        pass
            next_byte = time.monotonic() + 0.5
        if time.monotonic() >= next_report:
            live = sum(1 for s in socks if s is not None and s[1] == "o")
            print("opened %d closed-by-server %d open-now %d" % (opened, closed, live), flush=True)
            next_report = time.monotonic() + 1.0


def probe(host, port, n, timeout_ms):
    n, limit = int(n), int(timeout_ms) / 1000.0
    lat, good = [], 0
    for _ in range(n):
        t0 = time.monotonic()
        status = None
        try:
            with socket.create_connection((host, int(port)), timeout=limit) as s:
                s.settimeout(max(0.001, limit - (time.monotonic() - t0)))
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                          % host.encode())  # as the kubelet asks
                data = b""
                while time.monotonic() - t0 < limit:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                status = data.split(b" ", 2)[1] if data.startswith(b"HTTP/1.") else None
        except OSError:
            pass
        took = (time.monotonic() - t0) * 1000.0
        ok = status == b"200" and took <= limit * 1000.0
        good += ok
        lat.append(took)
        print("%.1f ms %s" % (took, status.decode() if status else "no answer"), flush=True)
        time.sleep(0.05)
    lat.sort()
    print("%d of %d answered 200 within %s ms, median %.1f ms, max %.1f ms"
          % (good, n, timeout_ms, lat[n // 2], lat[-1]))
    sys.exit(0 if good == n else 1)


class Zmq:
    def __init__(self):
        lib = ctypes.CDLL("libzmq.so.5", use_errno=True)
        lib.zmq_ctx_new.restype = ctypes.c_void_p
        lib.zmq_socket.restype = ctypes.c_void_p
        lib.zmq_socket.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.zmq_close.argtypes = [ctypes.c_void_p]
        lib.zmq_ctx_term.argtypes = [ctypes.c_void_p]
        lib.zmq_setsockopt.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_size_t]
        lib.zmq_getsockopt.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_size_t)]
        lib.zmq_connect.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.zmq_send.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.zmq_recv.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.zmq_msg_init_data.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.c_void_p, ctypes.c_void_p]
        lib.zmq_msg_send.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        self.lib = lib
        self.ctx = lib.zmq_ctx_new()

    def opt(self, s, name, value):
        v = ctypes.c_int(value)
        self.lib.zmq_setsockopt(s, name, ctypes.byref(v), ctypes.sizeof(v))

    def dealer(self, endpoint, keydir=None):
        s = self.lib.zmq_socket(self.ctx, ZMQ_DEALER)
        self.opt(s, ZMQ_LINGER, 0)
        self.opt(s, ZMQ_RCVTIMEO, 100)
        if keydir:
            # The job's client key, as any rank holds it (flodl-keygen's files).
            key = re.compile(r'(public|secret)-key = "(.{40})"')
            mine = dict(key.findall(open(os.path.join(keydir, "client.key")).read()))
            server = dict(key.findall(open(os.path.join(keydir, "server.pub")).read()))
            for name, z85 in ((ZMQ_CURVE_SERVERKEY, server["public"]),
                              (ZMQ_CURVE_PUBLICKEY, mine["public"]),
                              (ZMQ_CURVE_SECRETKEY, mine["secret"])):
                self.lib.zmq_setsockopt(s, name, z85.encode(), 40)
        if self.lib.zmq_connect(s, endpoint.encode()) != 0:
            sys.exit("zmq_connect %s failed" % endpoint)
        return s

    def recv(self, s, deadline):
        buf = ctypes.create_string_buffer(1 << 16)
        while time.monotonic() < deadline:
            n = self.lib.zmq_recv(s, buf, len(buf), 0)
            if n >= 0:
                return buf.raw[:min(n, len(buf))]
        return None


def varint(v):
    out = b""
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, value):
    """One protobuf field: an int (varint) or bytes/str (length-delimited)."""
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint((num << 3) | 2) + varint(len(value)) + value


def register_header(rank, world, host, pid, job="flodl"):
    reg = (field(1, rank) + field(2, world) + field(3, host) +
           field(4, "tcp://127.0.0.1:9") + field(5, pid))
    magic = varint((1 << 3) | 5) + struct.pack("<I", 0x4C444C46)  # fixed32
    return (magic + field(2, 1) + field(3, job) + field(5, 1) + field(6, rank) + field(16, reg))


def fields(data):
    """The top-level fields of a protobuf message: {number: value}, the last one of each."""
    out, i = {}, 0
    while i < len(data):
        key, i = read_varint(data, i)
        num, kind = key >> 3, key & 7
        if kind == 0:
            out[num], i = read_varint(data, i)
        elif kind == 2:
            n, i = read_varint(data, i)
            out[num], i = data[i:i + n], i + n
        elif kind == 5:
            out[num], i = data[i:i + 4], i + 4
        elif kind == 1:
            out[num], i = data[i:i + 8], i + 8
        else:
            raise ValueError("wire type %d" % kind)
    return out


def read_varint(data, i):
    v, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


MSG_WELCOME, MSG_ERROR = 2, 5


def claim(z, endpoint, header):
    """Sends one registration on a new connection: (type, generation, text, host) of the
    answer, or None without one within 5 s."""
    s = z.dealer(endpoint)
    try:
        z.lib.zmq_send(s, header, len(header), 0)
        reply = z.recv(s, time.monotonic() + 5.0)
    finally:
        z.lib.zmq_close(s)
    if reply is None:
        return None
    h = fields(reply)
    err = fields(h.get(20, b""))
    return (h.get(5, 0), h.get(4, 0), err.get(4, b"").decode("utf-8", "replace"),
            err.get(3, b"").decode("utf-8", "replace"))


def refused(answer, want, secrets):
    """None when answer is a refusal saying `want` that names none of secrets, nor the job's
    generation; else why not."""
    if answer is None:
        return "no answer within 5 s"
    kind, gen, text, _ = answer
    if kind == MSG_WELCOME:
        return "taken over: the claim got a WELCOME with the peer table"
    if kind != MSG_ERROR or want not in text:
        return "not refused as an identity already held (message type %d): %r" % (kind, text)
    if gen != 0:
        return "refused, but the reply carries the job's generation %d" % gen
    for x in secrets:
        if x in text:
            return "refused, but the reply names the holder's %r: %r" % (x, text)
    return None


def takeover(endpoint, rank, world):
    z = Zmq()
    answer = claim(z, endpoint, register_header(int(rank), int(world), "intruder.example", 999999))
    why = refused(answer, "already registered", ["127.0.0.1"])
    if why:
        print(why)
        sys.exit(1)
    print("refused: %s" % answer[2][answer[2].find("rank"):].strip())


def server_header(shards, host, pid, job="flodl"):
    reg = (field(1, 0) + field(3, host) + field(5, pid) + field(8, 1) + field(10, shards) +
           field(11, shards))
    for i in range(shards):
        reg += field(12, "tcp://127.0.0.1:%d" % (9 + i))
    magic = varint((1 << 3) | 5) + struct.pack("<I", 0x4C444C46)
    return magic + field(2, 1) + field(3, job) + field(5, 1) + field(6, -2) + field(16, reg)


def takeover_server(endpoint, shards, host, pid):
    z = Zmq()
    tries = (("intruder.example", 999999), (host, int(pid)))
    for n, (h, p) in enumerate(tries):
        answer = claim(z, endpoint, server_header(int(shards), h, p))
        why = refused(answer, "another parameter server serves",
                      [host, str(pid)] if n == 0 else [])
        if why:
            print("claim %d (host %s, pid %d): %s" % (n + 1, h, p, why))
            sys.exit(1)
    print("server role claimed twice (a stranger, then the server's host and pid): both refused")


def takeover_stalled(endpoint, rank, world, host, pid, period_ms, until_ms):
    z = Zmq()
    header = register_header(int(rank), int(world), host, int(pid))
    # The stall is this tool's: SIGSTOP once it is ready, so a slow start does not lengthen it.
    os.kill(int(pid), signal.SIGSTOP)
    t0 = time.monotonic()
    at = []
    try:
        k = 0
        while k * int(period_ms) < int(until_ms):
            wait = t0 + k * int(period_ms) / 1000.0 - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            ms = int((time.monotonic() - t0) * 1000)
            why = refused(claim(z, endpoint, header), "already registered", [])
            if why:
                print("claim at %d ms of the stall: %s" % (ms, why))
                sys.exit(1)
            at.append(ms)
            k += 1
    finally:
        os.kill(int(pid), signal.SIGCONT)
    stall = int((time.monotonic() - t0) * 1000)
    print("rank %s stalled %d ms, %d claims with its host and pid refused at %s ms"
          % (rank, stall, len(at), "/".join(map(str, at))))


def bigmsg(endpoint, frames, nbytes, hold):
    z = Zmq()
    s = z.dealer(endpoint)
    frame = ctypes.create_string_buffer(int(nbytes))  # the same bytes in every frame
    z.lib.zmq_send(s, b"not a header", 12, ZMQ_SNDMORE)
    msg = (ctypes.c_uint64 * 8)()  # zmq_msg_t: 64 bytes, aligned
    for i in range(int(frames)):
        z.lib.zmq_msg_init_data(msg, frame, int(nbytes), None, None)
        if z.lib.zmq_msg_send(msg, s, ZMQ_SNDMORE if i + 1 < int(frames) else 0) < 0:
            sys.exit("zmq_msg_send failed at frame %d" % i)
    print("sent %d frames of %s bytes" % (int(frames), nbytes), flush=True)
    time.sleep(float(hold))  # the bytes leave while the socket lives


def hdrflood(endpoint, seconds, frames, keydir=None):
    """Headers the size of their frame list: each frame description costs protobuf-c an
    allocation when unpacked, and a scan of the raw bytes refuses the list at its 17th entry.
    A second connection sends a header of another protocol version every 100 ms, which the
    coordinator answers (and does not count against the sender): the answer's delay is how long
    its loop keeps a peer waiting."""
    z = Zmq()
    s = z.dealer(endpoint, keydir)
    probe = z.dealer(endpoint, keydir)
    magic = varint((1 << 3) | 5) + struct.pack("<I", 0x4C444C46)
    frame = field(9, field(1, 1) + field(4, 1))
    h = magic + field(2, 1) + field(3, "flodl") + field(5, 4) + frame * int(frames)
    ph = magic + field(2, 2) + field(3, "flodl") + field(5, 4) + field(19, b"")
    buf = ctypes.create_string_buffer(4096)
    sent, answered, worst, asked, conns, stuck = 0, 0, 0.0, None, 1, None
    start = time.monotonic()
    until = start + float(seconds)
    while time.monotonic() < until:
        now = time.monotonic()
        if asked is None and now >= start + 0.1 * (answered + 1):
            z.lib.zmq_send(probe, ph, len(ph), ZMQ_DONTWAIT)
            asked = now
        if asked is not None and z.lib.zmq_recv(probe, buf, len(buf), ZMQ_DONTWAIT) >= 0:
            worst = max(worst, time.monotonic() - asked)
            answered += 1
            asked = None
        if z.lib.zmq_send(s, h, len(h), ZMQ_DONTWAIT) >= 0:
            sent, stuck = sent + 1, None
        elif stuck is None:
            stuck = time.monotonic()
        elif time.monotonic() - stuck > 0.2:
            # Cut off (its queue no longer drains): a new connection, as an attacker would.
            z.lib.zmq_close(s)
            s, conns, stuck = z.dealer(endpoint, keydir), conns + 1, None
        else:
            time.sleep(0.0005)
    if asked is not None:
        worst = max(worst, time.monotonic() - asked)
    print("queued %d headers of %d bytes (%.0f MiB/s) on %d connections; %d probes answered, "
          "the slowest in %d ms"
          % (sent, len(h), sent * len(h) / float(seconds) / 2**20, conns, answered, worst * 1000),
          flush=True)


def partial(host, port, conns, mib, hold):
    """ZMTP 3.0 by hand (greeting, READY), so that a message can stop before its last frame,
    which libzmq's own sockets never send."""
    greet = b"\xff" + b"\0" * 7 + b"\x01\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32
    body = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    ready = bytes([0x04, len(body)]) + body
    first = b"\x01\x0cnot a header"
    frame = b"\x03" + struct.pack(">Q", 1 << 20) + b"\0" * (1 << 20)
    socks, full = [], 0
    for _ in range(int(conns)):
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            # libzmq drops a peer whose first frame comes with its READY: wait for the server's.
            s.sendall(greet + ready)
            got = b""
            while b"READY" not in got:
                more = s.recv(256)
                if not more:
                    raise OSError("closed in the handshake")
                got += more
            s.sendall(first)
            for _ in range(int(mib)):
                s.sendall(frame)
            full += 1
        except OSError:
            pass
        socks.append(s)
    print("%d of %s connections sent all %s MiB" % (full, conns, mib), flush=True)
    time.sleep(float(hold))
    for s in socks:
        s.close()


def idx(images, labels, n, bad):
    n = int(n)
    with open(images, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 8, 8))
        f.write(bytes((i * 7 + j) % 256 for i in range(n) for j in range(64)))
    with open(labels, "wb") as f:
        f.write(struct.pack(">II", 0x801, n))
        f.write(bytes([int(bad)] + [i % 10 for i in range(1, n)]))


def safetensors(path, layers, mode):
    sizes = [int(x) for x in layers.split(",")]
    header = {}
    data = b""
    for li in range(len(sizes) - 1):
        fan_in, fan_out = sizes[li], sizes[li + 1]
        shape = [fan_in, fan_out] if (mode == "transposed" and li == 0) else [fan_out, fan_in]
        for name, shp in (("layers.%d.weight" % li, shape), ("layers.%d.bias" % li, [fan_out])):
            count = 1
            for d in shp:
                count *= d
            vals = [0.01] * count
            if mode == "nan" and li == 1 and name.endswith("weight"):
                vals[5] = float("nan")
            header[name] = {"dtype": "F32", "shape": shp,
                            "data_offsets": [len(data), len(data) + 4 * count]}
            data += struct.pack("<%df" % count, *vals)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def main():
    cmds = {"garbage": garbage, "flood": flood, "httphold": httphold, "probe": probe,
            "takeover": takeover, "bigmsg": bigmsg, "hdrflood": hdrflood, "partial": partial,
            "takeover-server": takeover_server, "takeover-stalled": takeover_stalled,
            "idx": idx, "safetensors": safetensors}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    try:
        cmds[sys.argv[1]](*sys.argv[2:])
    except TypeError as e:
        sys.exit("%s: %s\n%s" % (sys.argv[1], e, __doc__))


if __name__ == "__main__":
    main()
