#!/usr/bin/python3
"""proto/flodl.proto as a contract, from another language (docs/PROTOCOL.md).

A Python client built only from the schema (protoc's flodl_pb2, generated here into the build
directory) and libzmq through ctypes (no pyzmq) talks to a real flodl-ps (coordinator only,
world size 2, --insecure): a stranger is refused (another job: an Error; a header that is not
wire text, a body that does not match the type, no body at all: an Error each, the coordinator
still serving); two ranks register, hear heartbeats while the rendezvous lasts, get the same
welcome, heartbeat past the heartbeat timeout without being declared dead, say goodbye (one
with an all-default Shutdown body), and flodl-ps exits 0 with the job done.

Exit 0: passed; 77: skipped (protoc, python3-protobuf or libzmq.so.5 missing); 1: failed.
Bounded in time (SIGALRM); only its own flodl-ps is killed, by PID.
"""
import argparse
import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
JOB = "conformance-job"
HB_TIMEOUT_MS = 2000

# libzmq's constants (zmq.h).
ZMQ_DEALER = 5
ZMQ_RCVMORE = 13
ZMQ_LINGER = 17
ZMQ_RCVTIMEO = 27
EAGAIN = 11

# fl_err_t (include/flodl/flodl.h) as they travel in Error.code.
FL_EINVAL = -1
FL_EPROTO = -6


def skip(why):
    print("SKIP: conformance: " + why)
    sys.exit(SKIP)


def fail(why):
    print("FAIL: " + why)
    sys.exit(1)


class Zmq:
    """The few libzmq calls a DEALER needs, through ctypes."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libzmq.so.5", use_errno=True)
        except OSError as e:
            skip("libzmq.so.5 cannot be loaded (%s)" % e)
        lib = self.lib
        lib.zmq_ctx_new.restype = ctypes.c_void_p
        lib.zmq_ctx_term.argtypes = [ctypes.c_void_p]
        lib.zmq_socket.restype = ctypes.c_void_p
        lib.zmq_socket.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.zmq_close.argtypes = [ctypes.c_void_p]
        lib.zmq_setsockopt.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_size_t]
        lib.zmq_getsockopt.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_size_t)]
        lib.zmq_connect.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.zmq_send.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.zmq_recv.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.zmq_errno.restype = ctypes.c_int
        lib.zmq_strerror.restype = ctypes.c_char_p
        lib.zmq_strerror.argtypes = [ctypes.c_int]
        self.ctx = lib.zmq_ctx_new()
        self.socks = []

    def error(self):
        e = self.lib.zmq_errno()
        return e, self.lib.zmq_strerror(e).decode()

    def dealer(self, endpoint):
        s = self.lib.zmq_socket(self.ctx, ZMQ_DEALER)
        for opt, v in ((ZMQ_LINGER, 0), (ZMQ_RCVTIMEO, 100)):
            val = ctypes.c_int(v)
            self.lib.zmq_setsockopt(s, opt, ctypes.byref(val), ctypes.sizeof(val))
        if self.lib.zmq_connect(s, endpoint.encode()) != 0:
            fail("zmq_connect %s: %s" % (endpoint, self.error()[1]))
        self.socks.append(s)
        return s

    def send(self, s, data):
        # One message, one frame: the header. No empty delimiter frame: the coordinator's
        # ROUTER sees [our identity, header].
        if self.lib.zmq_send(s, data, len(data), 0) != len(data):
            fail("zmq_send: %s" % self.error()[1])

    def recv(self, s):
        """One message as a list of frames, or None when nothing came within 100 ms."""
        frames = []
        buf = ctypes.create_string_buffer(1 << 20)
        while True:
            n = self.lib.zmq_recv(s, buf, len(buf), 0)
            if n < 0:
                e, text = self.error()
                if e == EAGAIN and not frames:
                    return None
                fail("zmq_recv: %s" % text)
            frames.append(buf.raw[:min(n, len(buf))])
            more = ctypes.c_int(0)
            size = ctypes.c_size_t(ctypes.sizeof(more))
            self.lib.zmq_getsockopt(s, ZMQ_RCVMORE, ctypes.byref(more), ctypes.byref(size))
            if not more.value:
                return frames

    def close(self):
        for s in self.socks:
            self.lib.zmq_close(s)
        self.lib.zmq_ctx_term(self.ctx)


def generate_pb2(proto, out):
    protoc = shutil.which("protoc")
    if protoc is None:
        skip("protoc not found (Debian: protobuf-compiler)")
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        skip("the protobuf module is missing (Debian: python3-protobuf)")
    os.makedirs(out, exist_ok=True)
    r = subprocess.run([protoc, "-I", os.path.dirname(proto), "--python_out=" + out, proto],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail("protoc: " + r.stderr)
    sys.path.insert(0, out)
    import flodl_pb2
    return flodl_pb2


class Client:
    def __init__(self, zmq, pb, endpoint, rank):
        self.zmq = zmq
        self.pb = pb
        self.s = zmq.dealer(endpoint)
        self.rank = rank
        self.generation = 0

    def header(self, mtype, job=JOB):
        h = self.pb.Header()
        h.magic = 0x4C444C46
        h.version = 1
        h.job_id = job
        h.generation = self.generation
        h.type = mtype
        h.sender = self.rank
        return h

    def send(self, h):
        self.zmq.send(self.s, h.SerializeToString())

    def register(self, world, job=JOB, host=None):
        h = self.header(self.pb.MSG_REGISTER, job)
        h.reg.rank = self.rank
        h.reg.world_size = world
        h.reg.host = host if host is not None else "py-rank-%d" % self.rank
        h.reg.endpoints.append("tcp://127.0.0.1:%d" % (41000 + self.rank))
        h.reg.pid = os.getpid()
        h.reg.tuning = "py"
        self.send(h)

    def heartbeat(self):
        h = self.header(self.pb.MSG_HEARTBEAT)
        h.heartbeat.waiting_on = -1
        self.send(h)

    def next(self, deadline):
        """The next header from the coordinator before deadline (checked as a receiver must),
        or None."""
        while time.monotonic() < deadline:
            frames = self.zmq.recv(self.s)
            if frames is None:
                continue
            h = self.pb.Header.FromString(frames[0])
            if h.magic != 0x4C444C46 or h.version != 1:
                fail("rank %d: header with magic %#x version %d" % (self.rank, h.magic,
                                                                     h.version))
            if len(frames) - 1 != len(h.frames):
                fail("rank %d: %d payload frames, the header declares %d"
                     % (self.rank, len(frames) - 1, len(h.frames)))
            if h.sender != -1:
                fail("rank %d: the coordinator's message from sender %d" % (self.rank, h.sender))
            body = h.WhichOneof("body")
            want = {self.pb.MSG_WELCOME: "welcome", self.pb.MSG_HEARTBEAT: "heartbeat",
                    self.pb.MSG_ERROR: "error", self.pb.MSG_SHUTDOWN: "shutdown"}.get(h.type)
            if body != want:
                fail("rank %d: type %d with body %s" % (self.rank, h.type, body))
            return h
        return None

    def expect(self, mtype, within_s, skip_heartbeats=True):
        deadline = time.monotonic() + within_s
        while True:
            h = self.next(deadline)
            if h is None:
                fail("rank %d: no message of type %d within %.1f s" % (self.rank, mtype,
                                                                       within_s))
            if h.type == mtype:
                return h
            if h.type == self.pb.MSG_HEARTBEAT and skip_heartbeats:
                continue
            fail("rank %d: expected type %d, got %s" % (self.rank, mtype, h))


def start_ps(bin_dir, world, tmp):
    ps = os.path.join(bin_dir, "server", "flodl-ps")
    if not os.access(ps, os.X_OK):
        fail("no flodl-ps at " + ps)
    epfile = os.path.join(tmp, "endpoint")
    log = open(os.path.join(tmp, "ps.log"), "w+")
    p = subprocess.Popen([ps, "--bind", "tcp://127.0.0.1:0", "--world-size", str(world),
                          "--job-id", JOB, "--heartbeat-timeout", str(HB_TIMEOUT_MS),
                          "--rendezvous-timeout", "30000", "--endpoint-file", epfile,
                          "--insecure", "--log-level", "info"],
                         stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.path.exists(epfile) and os.path.getsize(epfile) > 0:
            with open(epfile) as f:
                ep = f.read().strip()
            if ep:
                return p, ep, log
        if p.poll() is not None:
            break
        time.sleep(0.05)
    fail("flodl-ps wrote no endpoint:\n" + read_log(log))


def read_log(log):
    log.flush()
    log.seek(0)
    return log.read()


def refusals(zmq, pb, ep):
    """A stranger's messages: each answered with an Error, and nobody is registered."""
    x = Client(zmq, pb, ep, 0)
    cases = []

    x.register(2, job="other-job")
    cases.append(("another job", FL_EINVAL, ["'other-job'", "'" + JOB + "'"]))

    x.register(2, host="evil\n[0.000 coordinator] error: rank 1 declared dead")
    cases.append(("a newline in the host", FL_EPROTO,
                  ["Register.host has a control character at byte 4"]))

    h = x.header(pb.MSG_REGISTER)
    h.shutdown.code = 0  # a oneof member: this sets the body, to the wrong one
    x.send(h)
    cases.append(("a register with a shutdown body", FL_EPROTO,
                  ["register message with a shutdown body"]))

    x.send(x.header(pb.MSG_REGISTER))
    cases.append(("a register without a body", FL_EPROTO, ["register message without its body"]))

    h = x.header(pb.MSG_REGISTER)
    h.version = 2
    h.reg.rank = 0
    x.send(h)
    cases.append(("protocol version 2", FL_EPROTO, ["protocol version 2", "protocol version 1"]))

    for what, code, says in cases:
        e = x.expect(pb.MSG_ERROR, 5)
        if e.error.code != code or not all(s in e.error.text for s in says):
            fail("%s: error %d '%s', expected %d saying %s" % (what, e.error.code, e.error.text,
                                                              code, says))
        print("refused as expected: %s: %s" % (what, e.error.text))


def run(bin_dir, proto, out):
    pb = generate_pb2(proto, out)
    zmq = Zmq()
    tmp = tempfile.mkdtemp(prefix="flodl-conformance-")
    ps = None
    log = None
    try:
        ps, ep, log = start_ps(bin_dir, 2, tmp)
        refusals(zmq, pb, ep)

        # Rank 0 registers. No answer but heartbeats until every rank is in: registered 1,
        # missing "1".
        r0 = Client(zmq, pb, ep, 0)
        r0.register(2)
        hb = r0.expect(pb.MSG_HEARTBEAT, 5, skip_heartbeats=False)
        if hb.heartbeat.registered != 1 or hb.heartbeat.missing != "1":
            fail("rendezvous heartbeat: %s" % hb)
        if hb.job_id != JOB:
            fail("the coordinator's job id %r" % hb.job_id)

        # Rank 1 registers: both get the same welcome.
        r1 = Client(zmq, pb, ep, 1)
        r1.register(2)
        w = [c.expect(pb.MSG_WELCOME, 5) for c in (r0, r1)]
        for c, h in zip((r0, r1), w):
            peers = [(p.rank, p.host, list(p.endpoints), p.pid) for p in h.welcome.peers]
            want = [(r, "py-rank-%d" % r, ["tcp://127.0.0.1:%d" % (41000 + r)], os.getpid())
                    for r in range(2)]
            if peers != want:
                fail("rank %d's peer table %s, expected %s" % (c.rank, peers, want))
            if h.welcome.heartbeat_timeout_ms != HB_TIMEOUT_MS or \
                    not 0 < h.welcome.heartbeat_ms < HB_TIMEOUT_MS:
                fail("heartbeat %d / %d ms" % (h.welcome.heartbeat_ms,
                                               h.welcome.heartbeat_timeout_ms))
            if h.generation == 0 or h.generation != w[0].generation:
                fail("generations %d and %d" % (w[0].generation, h.generation))
            c.generation = h.generation
        hb_s = w[0].welcome.heartbeat_ms / 1000.0

        # Both heartbeat for longer than the heartbeat timeout, hearing the coordinator's.
        heard = [0, 0]
        until = time.monotonic() + 1.5 * HB_TIMEOUT_MS / 1000.0
        next_beat = 0.0
        while time.monotonic() < until:
            if time.monotonic() >= next_beat:
                for c in (r0, r1):
                    c.heartbeat()
                next_beat = time.monotonic() + hb_s
            for i, c in enumerate((r0, r1)):
                h = c.next(time.monotonic() + 0.01)
                if h is None:
                    continue
                if h.type != pb.MSG_HEARTBEAT:
                    fail("rank %d while beating: %s" % (c.rank, h))
                if h.generation != c.generation:
                    fail("heartbeat of generation %d" % h.generation)
                heard[i] += 1
        if min(heard) < 2 or ps.poll() is not None:
            fail("heartbeats heard %s; flodl-ps %s:\n%s" % (heard, ps.poll(), read_log(log)))

        # Goodbyes: rank 0 with a text, rank 1 with every field at its default (code 0, no
        # text), an empty Shutdown body that must still be set.
        h = r0.header(pb.MSG_SHUTDOWN)
        h.shutdown.code = 0
        h.shutdown.text = "conformance done"
        r0.send(h)
        h = r1.header(pb.MSG_SHUTDOWN)
        h.shutdown.SetInParent()
        if not h.SerializeToString().endswith(b"\xaa\x01\x00"):
            fail("an empty Shutdown body is not field 21 of length 0")
        r1.send(h)
        try:
            rc = ps.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fail("flodl-ps still running after both goodbyes:\n" + read_log(log))
        text = read_log(log)
        if rc != 0 or "job '%s' done" % JOB not in text:
            fail("flodl-ps exit %d:\n%s" % (rc, text))
        if "rank 0 (py-rank-0) left: conformance done" not in text:
            fail("rank 0's goodbye is not in the log:\n" + text)
        print("flodl-ps exited 0 with the job done")
    finally:
        if ps is not None and ps.poll() is None:
            ps.kill()  # our own child, by its PID
            ps.wait()
        if log is not None:
            log.close()
        zmq.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--proto", required=True)
    ap.add_argument("--out", required=True, help="where flodl_pb2 is generated")
    ap.add_argument("--timeout", type=int, default=90)
    a = ap.parse_args()

    def timed_out(signo, frame):
        raise TimeoutError("conformance: over %d s" % a.timeout)

    signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(a.timeout)
    try:
        run(a.bin_dir, a.proto, a.out)
    except TimeoutError as e:
        fail(str(e))
    print("PASS")


if __name__ == "__main__":
    main()
